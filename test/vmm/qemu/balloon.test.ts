/**
 * Free page reporting under real QEMU microvm/TCG (`[qemu] free_page_reporting`, on by default):
 * a VM booted from the base template through the tools drive (envd reached over a TestNet) is
 * snapshotted; its memory image is served as the node serves it (the disk daemon's shared
 * read-only FUSE export); a VM restored from it allocates and frees 256 MiB in a guest process,
 * and the guest's reports take the freed pages out of QEMU (its private copies of the image's
 * pages) while the image itself stays as it was. The restored VM's pause snapshot (device state
 * plus the pages it holds privately, as a pause writes it) is byte-exact: the guest RAM a VM
 * restored from it sees is the RAM the paused VM saw, discarded ranges included (they read the
 * image's bytes). The driver refuses to restore such a snapshot over a plain memory file.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { closeSync, copyFileSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileMappings, ProcessMemory, readMapped } from "../../../src/ffi/procmem.ts";
import { diskConfig, DiskService, type DiskExport } from "../../../src/storage/daemon/index.ts";
import { resolveTemplate } from "../../../src/template/index.ts";
import { resolveKernelPath, type QemuVm, type VmSpec } from "../../../src/vmm/index.ts";
import { ENVD_PORT, runInGuest, waitEnvd } from "./envd-client.ts";
import { waitFor } from "../../helpers/wait.ts";
import { TEST_HOME, TestNet, testBoot, testConfig, testDriver } from "./helpers.ts";

const MiB = 1 << 20;
const MEM_MIB = 512;
const cfg = testConfig();
const drv = testDriver();
let root: string;
let disks: DiskService;
let net: TestNet;
let spec: (name: string) => VmSpec;
const cleanups: (() => Promise<unknown> | unknown)[] = [];

beforeAll(async () => {
  const kernelPath = resolveKernelPath(cfg);
  const tpl = resolveTemplate(TEST_HOME, "base");
  root = mkdtempSync(join(tmpdir(), "c1balloon-"));
  disks = await DiskService.start({ dir: join(drv.runtimeDir, "disk"), config: diskConfig(cfg) });
  net = new TestNet();
  const disk = await disks.rootDisk({ id: `c1b${process.pid}`, lowers: tpl.rootLayers, sandboxDir: join(root, "disk") });
  cleanups.push(() => disk.close());
  const boot = testBoot(disk.path, { args: tpl.bootArgs });
  spec = (name) => ({ id: `c1b${process.pid}${name}`, workDir: join(root, name), kernelPath, bootArgs: boot.bootArgs, vcpus: 1, memoryMiB: MEM_MIB, drives: boot.drives, net: net.spec });
});

afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  await disks?.close();
  net?.destroy();
  rmSync(root, { recursive: true, force: true });
  drv.dispose();
});

/** Anonymous pages (kB) of `pid`'s mapping of `path`: the guest RAM it holds as private copies. */
function privateKiB(pid: number, path: string): number {
  let inRam = false;
  let kib = 0;
  for (const line of readFileSync(`/proc/${pid}/smaps`, "utf8").split("\n")) {
    const head = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \d+\s*(.*)$/.exec(line);
    if (head) inRam = head[1] === path;
    else if (inRam) kib += Number(/^Anonymous:\s+(\d+) kB/.exec(line)?.[1] ?? 0);
  }
  return kib;
}

/** sha256 of the guest RAM `vm` sees (its mapping of `memPath`, read through /proc/<pid>/mem). */
function guestRamSha(vm: QemuVm, memPath: string): string {
  const maps = fileMappings(vm.pid, memPath);
  const mem = new ProcessMemory(vm.pid);
  const h = createHash("sha256");
  const buf = new Uint8Array(4 * MiB);
  try {
    for (let off = 0; off < MEM_MIB * MiB; off += buf.length) {
      readMapped(mem, maps, buf, off);
      h.update(buf);
    }
  } finally {
    mem.close();
  }
  return h.digest("hex");
}

const sha = (path: string) => createHash("sha256").update(readFileSync(path)).digest("hex");

async function guest(script: string): Promise<string> {
  const r = await runInGuest(net.url(ENVD_PORT), script);
  if (r.exitCode !== 0) throw new Error(`guest command failed (${r.exitCode}): ${script}\n${r.stderr}`);
  return r.stdout.trim();
}

async function serve(key: string, rawPath: string): Promise<DiskExport> {
  const d = await disks.acquireShared({ key, rawPath, fileName: "memory.img", acceptWritableOpen: true });
  cleanups.push(() => d.close());
  return d;
}

test("a restored VM hands back what its guest freed, its pause snapshot is byte-exact, the shared image is untouched", async () => {
  // the original: booted, envd up, snapshotted (a booted VM's RAM is its shared file: copied)
  const orig = await drv.driver.boot(spec("orig"));
  cleanups.push(() => orig.stop());
  await waitEnvd(net.url(ENVD_PORT), 120_000);
  expect(await guest("cat /sys/module/page_reporting/parameters/page_reporting_order")).toBe("9");
  await orig.pause();
  const statePath = join(root, "orig.state");
  (await orig.captureSnapshot(statePath)).release();
  const imagePath = join(root, "orig.mem");
  copyFileSync(orig.memPath, imagePath);
  await orig.stop();
  const imageSha = sha(imagePath);

  // its state has the balloon: a plain memory file would be punched by the guest's reports
  await expect(drv.driver.restore(spec("plain"), { statePath, memPath: imagePath, kind: "full" }, { resume: true })).rejects.toMatchObject({ code: "vmm.bad_spec" });

  const image = await serve("img1", imagePath);
  const a = await drv.driver.restore(spec("a"), { statePath, memPath: image.path, kind: "full" }, { resume: true });
  cleanups.push(() => a.stop());
  await waitEnvd(net.url(ENVD_PORT), 60_000);
  // data the guest keeps in RAM (tmpfs), to find again after the pause
  const keep = await guest("head -c 16M /dev/urandom > /dev/shm/keep && sha256sum /dev/shm/keep | cut -d' ' -f1");
  const before = privateKiB(a.pid, image.path);
  await guest(`python3 -c "b = b'x' * (256 << 20); print(len(b))"`);
  const peak = privateKiB(a.pid, image.path);
  expect(peak - before).toBeGreaterThan(250 * 1024); // the process's 256 MiB became private copies
  // the guest reports the freed blocks (2 s after they gather): QEMU drops the copies
  const low = await waitFor("the freed memory to leave QEMU", () => {
    const now = privateKiB(a.pid, image.path);
    return peak - now >= 200 * 1024 ? now : null;
  }, { timeoutMs: 60_000, maxIntervalMs: 250 });
  expect(peak - low).toBeGreaterThanOrEqual(200 * 1024);
  expect((await image.stats()).discards).toBeGreaterThan(0); // QEMU's punches reached the export as hints
  expect(sha(imagePath)).toBe(imageSha); // ... and changed nothing

  // pause: the device state plus the pages A holds privately, over the image (as a pause layer)
  await a.pause();
  const seen = guestRamSha(a, image.path);
  const state2 = join(root, "a.state");
  const cap = await a.captureSnapshot(state2);
  if (cap.kind !== "changed") throw new Error(`expected a changed-pages capture, got ${cap.kind}`);
  const image2Path = join(root, "a.mem");
  copyFileSync(imagePath, image2Path);
  const fd = openSync(image2Path, "r+");
  try {
    for (const [x, y] of cap.ranges) {
      const buf = new Uint8Array(y - x);
      cap.read(buf, x);
      writeSync(fd, buf, 0, buf.length, x);
    }
  } finally {
    closeSync(fd);
    cap.release();
  }
  await a.stop();

  // restored paused, its guest RAM is what A saw at the pause, byte for byte
  const image2 = await serve("img2", image2Path);
  const b = await drv.driver.restore(spec("b"), { statePath: state2, memPath: image2.path, kind: "full" }, { resume: false });
  cleanups.push(() => b.stop());
  expect(guestRamSha(b, image2.path)).toBe(seen);
  await b.resume();
  await waitEnvd(net.url(ENVD_PORT), 60_000);
  expect(await guest("sha256sum /dev/shm/keep | cut -d' ' -f1")).toBe(keep);
  // the guest allocates over the ranges it gave back: it gets zeroed pages and keeps what it writes
  expect(await guest(`python3 -c "b = bytearray(range(256)) * (1 << 20); print(len(b), b.count(7), b[300])"`)).toBe(`${256 * MiB} ${MiB} 44`);
  expect(sha(imagePath)).toBe(imageSha);
}, 400_000);
