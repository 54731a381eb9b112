#!/usr/bin/env bun
/**
 * Pause-diff benchmark (issue 9 item 5, "measure the options, and document the choice"): how a
 * QEMU 7.2 VM restored copy-on-write from a memory image (`memory-backend-file,share=off`) can be
 * captured so that what is written follows what the guest changed, not its RAM. One original VM
 * (base template rootfs, read-only, no envd) boots, holds IMAGE MiB of random bytes in a process
 * (its own state, as a template's RAM holds envd and caches), and is captured as the memory
 * image at its waiting point; for each amount D of 0, 8 and 64 MiB a clone is restored from it, its guest
 * process writes D MiB of fresh random bytes (D read from a control drive with O_DIRECT), the
 * clone is paused and captured by each option in turn (the same VM; QEMU refuses a second
 * migration of a VM a migration paused, so it is continued for a moment between options):
 *  A. current: device-state migration stream with the RAM block's page records filtered out
 *     (src/vmm/qemu/migration.ts) + the private (changed) pages from /proc/<pid>/pagemap read
 *     through /proc/<pid>/mem, written as a memory layer over the image;
 *  B. full private copy: QEMU's plain migration stream with RAM (what a pause wrote before: the
 *     state file holds every non-zero guest page);
 *  C. whole-RAM compare: the state as in A, then all of guest RAM read from /proc/<pid>/mem and
 *     compared with the image block by block (no pagemap), the differing blocks as the layer.
 * Printed per option and D: bytes written, capture time with the VM paused (ms), and for A the
 * split (migration stream incl. the RAM QEMU streams and the filter drops / memory layer).
 * Needs root, the built kernel and base template (scripts/test.sh pre-step). Heavy: run under
 * `flock /tmp/aenv-heavy.lock`.
 *   bun bench/pause-diff.ts [--mem-mib 512] [--image-mib 64] [--dirty 0,8,64]
 */
import { closeSync, copyFileSync, mkdtempSync, openSync, rmSync, statSync, writeFileSync, writeSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileMappings, ProcessMemory, readMapped } from "../src/ffi/procmem.ts";
import { writeMemoryLayer } from "../src/snapshot/index.ts";
import { importSparse, openStack } from "../src/storage/overlaybd/index.ts";
import { resolveTemplate } from "../src/template/index.ts";
import { resolveKernelPath, type VmSpec } from "../src/vmm/index.ts";
import type { QemuVm } from "../src/vmm/qemu/driver.ts";
import { TEST_HOME, testBoot, testConfig, testDriver, waitConsole } from "../test/vmm/qemu/helpers.ts";

const argOf = (n: string, d: string) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? process.argv[i + 1]! : d;
};
const MEM_MIB = Number(argOf("--mem-mib", "512"));
const DIRTY = argOf("--dirty", "0,8,64").split(",").map(Number);
const IMAGE_MIB = Number(argOf("--image-mib", "64"));
const MiB = 1 << 20;
const load0 = loadavg();

// waits for a non-zero first sector on the control drive (O_DIRECT: never the guest's cache),
// then holds that many MiB of fresh random bytes
const SCRIPT = [
  // the original's own state, in the image every clone starts from (a template's RAM holds
  // envd, caches, a started program): a full copy writes it again at every pause
  `python3 -c "import os,time; b=os.urandom(${IMAGE_MIB}<<20); open('/run/pd-img','w').close(); time.sleep(86400)" &`,
  "while [ ! -e /run/pd-img ]; do sleep 0.1; done",
  "echo PD-READY",
  'while :; do n=$(dd if=/dev/vdc bs=512 count=1 iflag=direct 2>/dev/null | tr -d "\\000"); [ -n "$n" ] && break; sleep 0.1; done',
  'python3 -c "import os,sys,time; n=int(sys.argv[1]); b=os.urandom(n<<20) if n else b\'\'; print(\'PD-HELD\', n, flush=True); time.sleep(86400)" "$n"',
].join("\n");

// restores map a plain copy of the RAM file: no free page reporting balloon (QemuDriver refuses it there)
const drv = testDriver({ AENV__qemu__free_page_reporting: "false" });
const dir = mkdtempSync(join(tmpdir(), "pausediff-"));
const cfg = testConfig();
const tpl = resolveTemplate(TEST_HOME, "base");
const boot = testBoot(tpl.rootfsPath, { readOnly: true, args: `aenv.envd=0 aenv.run=${btoa(SCRIPT)}` });

/** A 4 KiB control drive whose first sector holds `text` (empty: zeros). */
function controlDrive(name: string, text: string): string {
  const p = join(dir, name);
  const b = new Uint8Array(4096);
  b.set(new TextEncoder().encode(text));
  writeFileSync(p, b);
  return p;
}

function spec(id: string, ctl: string): VmSpec {
  return {
    id: `pd${process.pid}${id}`,
    workDir: join(dir, id),
    kernelPath: resolveKernelPath(cfg),
    bootArgs: boot.bootArgs,
    vcpus: 1,
    memoryMiB: MEM_MIB,
    drives: [...boot.drives, { id: "ctl", path: ctl, readOnly: true, isRoot: false }],
  };
}

const size = (p: string) => statSync(p).size;

interface Row {
  option: string;
  dirtyMiB: number;
  bytes: number;
  pausedMs: number;
  detail: string;
}
const rows: Row[] = [];

try {
  // the original: booted, captured at its waiting point; its shared RAM file is the image
  const orig = await drv.driver.boot(spec("orig", controlDrive("ctl-orig", "")));
  const image = join(dir, "image.mem");
  const imageLayer = join(dir, "image.layer");
  try {
    await waitConsole(orig.consolePath, /PD-READY/, 180_000);
    await Bun.sleep(500); // into its polling loop
    await orig.pause();
    const cap = await orig.captureSnapshot(join(dir, "orig.state"));
    copyFileSync(orig.memPath, image);
    cap.release();
  } finally {
    await orig.stop();
  }
  await importSparse(image, imageLayer, { meta: { virtualSize: MEM_MIB * MiB } });
  const files = { statePath: join(dir, "orig.state"), memPath: image, kind: "full" as const };

  for (const d of DIRTY) {
    const clone = (await drv.driver.restore(spec(`c${d}`, controlDrive(`ctl-${d}`, String(d))), files, { resume: true })) as QemuVm;
    try {
      await waitConsole(clone.consolePath, new RegExp(`PD-HELD ${d}\\b`), 180_000);
      await Bun.sleep(300);
      await clone.pause();

      // A: filtered stream + pagemap pages -> layer over the image
      {
        const t0 = performance.now();
        const state = join(dir, `a${d}.state`);
        const cap = await clone.captureSnapshot(state);
        const t1 = performance.now();
        const layer = join(dir, `a${d}.layer`);
        const w = await writeMemoryLayer(cap, layer, { size: MEM_MIB * MiB, parentLayers: [imageLayer] });
        cap.release();
        const t2 = performance.now();
        rows.push({ option: "A filtered stream + pagemap", dirtyMiB: d, bytes: size(state) + size(layer), pausedMs: t2 - t0, detail: `stream ${Math.round(t1 - t0)} ms (state ${(size(state) / MiB).toFixed(1)} MiB), memory layer ${Math.round(t2 - t1)} ms (changed ${(w.changedBytes / MiB).toFixed(1)} MiB, layer ${(size(layer) / MiB).toFixed(1)} MiB)` });
      }
      // QEMU refuses a second migration of a VM paused by one: continue it for a moment (its
      // guest process sleeps holding its bytes) and pause it again
      await clone.resume();
      await clone.pause();
      // B: QEMU's own stream with RAM, into a file
      {
        const out = join(dir, `b${d}.state`);
        const t0 = performance.now();
        await clone.migrate("snapshot", "migrate", `exec:cat > ${out}`);
        const t1 = performance.now();
        rows.push({ option: "B full private copy (stream with RAM)", dirtyMiB: d, bytes: size(out), pausedMs: t1 - t0, detail: `one file of ${(size(out) / MiB).toFixed(1)} MiB` });
      }
      await clone.resume();
      await clone.pause();
      // C: filtered stream + every RAM page read and compared with the image
      {
        const t0 = performance.now();
        const state = join(dir, `c${d}.state`);
        const cap = await clone.captureSnapshot(state);
        cap.release(); // its page list is not used
        const t1 = performance.now();
        const maps = fileMappings(clone.pid, clone.memPath);
        const mem = new ProcessMemory(clone.pid);
        const ram = join(dir, `c${d}.ram`);
        const fd = openSync(ram, "w");
        const chunk = new Uint8Array(4 * MiB);
        try {
          for (let off = 0; off < MEM_MIB * MiB; off += chunk.length) {
            readMapped(mem, maps, chunk, off);
            writeSync(fd, chunk, 0, chunk.length, off);
          }
        } finally {
          closeSync(fd);
          mem.close();
        }
        const layer = join(dir, `c${d}.layer`);
        await using parent = await openStack({ lowers: [imageLayer] });
        await importSparse(ram, layer, { parent, meta: { virtualSize: MEM_MIB * MiB } });
        const t2 = performance.now();
        rmSync(ram);
        rows.push({ option: "C whole-RAM compare", dirtyMiB: d, bytes: size(state) + size(layer), pausedMs: t2 - t0, detail: `stream ${Math.round(t1 - t0)} ms, read+compare ${Math.round(t2 - t1)} ms (layer ${(size(layer) / MiB).toFixed(1)} MiB)` });
      }
    } finally {
      await clone.stop();
    }
  }

  console.log(`load before: ${load0.map((x) => x.toFixed(2)).join(" ")}; after: ${loadavg().map((x) => x.toFixed(2)).join(" ")} (QEMU ${drv.driver.accel}, guest RAM ${MEM_MIB} MiB, the image's own data ${IMAGE_MIB} MiB + what the guest booted)`);
  for (const r of rows) {
    console.log(`${r.option.padEnd(40)} dirtied ${String(r.dirtyMiB).padStart(3)} MiB: written ${(r.bytes / MiB).toFixed(1).padStart(6)} MiB, VM paused ${String(Math.round(r.pausedMs)).padStart(5)} ms  [${r.detail}]`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
  drv.dispose();
}
