#!/usr/bin/env bun
/**
 * VM benchmark (QEMU microvm, TCG on this host): cold boot of a sandbox from the base template
 * (root disk served by the disk daemon: overlaybd stack + fresh upper, tap in a netns) to envd
 * answering GET /health, median of N; a CPU-bound guest command (Python, a large code footprint
 * for the TCG translation cache) run twice per VM; restore of a snapshot of a booted sandbox to
 * envd answering, median of N; and the node's memory per VM beyond guest RAM: QEMU's proportional
 * set size without guest RAM, plus what serving one more disk adds to the disk daemon (the
 * daemon's own base, shared by every sandbox of the node, is printed apart).
 * `--tb-sizes 0,32,64,256` repeats the boots and restores for each TCG translation cache size (MiB;
 * 0 = QEMU's default) and prints one line per size: that is how `[qemu] tcg_tb_size_mib`'s and
 * `tcg_tb_size_restore_mib`'s defaults are chosen (without it: the configured sizes). QEMU's memory
 * is printed by kind (translation cache, heap, its binary and libraries: pages every QEMU of the
 * host shares) for a booted and for a restored VM, at envd ready and after the command.
 * Baselines from the same run: QEMU spawn to QMP ready (no guest), and the guest RAM size.
 * Needs root, the built kernel and base template (scripts/test.sh pre-step).
 * Each boot also reports QEMU's CPU time to envd ready (user + system): the work of a boot, which a
 * loaded host stretches less than the wall time.
 * `--ab-args "<kernel args>"` boots each size twice per run, without and with those arguments
 * appended (A/B of boot options in one run, interleaved).
 *   bun bench/vm.ts [--runs 5] [--mem-mib 512] [--tb-sizes 0,32,64,256] [--no-restore] [--restores-only] [--ab-args "..."]
 */
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { diskConfig, DiskService } from "../src/storage/daemon/index.ts";
import { resolveTemplate } from "../src/template/index.ts";
import { resolveKernelPath, type VmSpec } from "../src/vmm/index.ts";
import { ENVD_PORT, waitEnvd } from "../test/vmm/qemu/envd-client.ts";
import { TEST_HOME, TestNet, testBoot, testConfig, testDriver } from "../test/vmm/qemu/helpers.ts";
import { QmpClient } from "../src/vmm/qemu/qmp.ts";
import { QemuDriver } from "../src/vmm/qemu/driver.ts";
import { runInGuest } from "../test/vmm/qemu/envd-client.ts";
import { CPU_SCRIPT } from "./guest-work.ts";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const RUNS = arg("--runs", 5);
const MEM = arg("--mem-mib", 512);
const tbArg = process.argv.indexOf("--tb-sizes");
const RESTORE = !process.argv.includes("--no-restore");
/** Only the restores: no boots per size and run (one boot makes the snapshot). */
const RESTORES_ONLY = process.argv.includes("--restores-only");
const abIdx = process.argv.indexOf("--ab-args");
/** Kernel arguments to boot each size also with, interleaved (an A/B of boot options in one run). */
const AB_ARGS = abIdx > 0 ? process.argv[abIdx + 1]! : null;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const fmt = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

/** kB fields of /proc/<pid>/smaps_rollup. */
function rollup(pid: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of readFileSync(`/proc/${pid}/smaps_rollup`, "utf8").matchAll(/^(\w+):\s+(\d+) kB$/gm)) out[m[1]!] = Number(m[2]);
  return out;
}

/** One class of a process's mappings: kB summed over its mappings. */
interface MemClass {
  rss: number;
  pss: number;
  /** Private_Clean + Private_Dirty: what this process alone holds. */
  priv: number;
}

/**
 * A QEMU process's memory by what it is, from /proc/<pid>/smaps (kB): `guestRam` (the mapping of
 * the guest RAM file `memPath`), `tcg` (TCG's translation cache: the one anonymous mapping with
 * execute permission), `heap` ([heap] and every other anonymous mapping: malloc arenas and large
 * allocations such as the softmmu TLBs, thread stacks), `qemuBinary` (the executable's pages),
 * `libs` (shared libraries) and `other` (other files, vdso).
 */
function qemuMemory(pid: number, memPath: string): Record<"guestRam" | "tcg" | "heap" | "qemuBinary" | "libs" | "other", MemClass> & { anonMappings: number } {
  const out = { guestRam: { rss: 0, pss: 0, priv: 0 }, tcg: { rss: 0, pss: 0, priv: 0 }, heap: { rss: 0, pss: 0, priv: 0 }, qemuBinary: { rss: 0, pss: 0, priv: 0 }, libs: { rss: 0, pss: 0, priv: 0 }, other: { rss: 0, pss: 0, priv: 0 }, anonMappings: 0 };
  let cls: MemClass = out.other;
  for (const line of readFileSync(`/proc/${pid}/smaps`, "utf8").split("\n")) {
    const head = /^[0-9a-f]+-[0-9a-f]+ (\S{4}) \S+ \S+ \d+\s*(.*)$/.exec(line);
    if (head) {
      const [, perms, path] = head as unknown as [string, string, string];
      if (path === memPath) cls = out.guestRam;
      else if (path === "" && perms.includes("x")) cls = out.tcg;
      else if (path === "" || path === "[heap]" || path.startsWith("[stack")) cls = out.heap, out.anonMappings += path === "" ? 1 : 0;
      else if (path.endsWith("/qemu-system-x86_64")) cls = out.qemuBinary;
      else if (/\.so(\.|$)/.test(path)) cls = out.libs;
      else cls = out.other;
      continue;
    }
    const f = /^(Rss|Pss|Private_Clean|Private_Dirty):\s+(\d+) kB$/.exec(line);
    if (!f) continue;
    const v = Number(f[2]);
    if (f[1] === "Rss") cls.rss += v;
    else if (f[1] === "Pss") cls.pss += v;
    else cls.priv += v;
  }
  return out;
}

/** One line of `qemuMemory`: each class's Rss/Pss/private in MiB. */
function memLine(m: ReturnType<typeof qemuMemory>): string {
  const mib = (k: number) => (k / 1024).toFixed(1);
  const c = (n: string, x: MemClass) => `${n} ${mib(x.rss)}/${mib(x.pss)}/${mib(x.priv)}`;
  const beyond = (k: keyof MemClass) => m.tcg[k] + m.heap[k] + m.qemuBinary[k] + m.libs[k] + m.other[k];
  return `[Rss/Pss/private MiB] ${c("TCG cache", m.tcg)}, ${c("heap+anon", m.heap)} (${m.anonMappings} anonymous mappings), ${c("qemu binary", m.qemuBinary)}, ${c("libraries", m.libs)}, ${c("other files", m.other)}` +
    `; beyond guest RAM: Pss ${mib(beyond("pss"))}, private ${mib(beyond("priv"))}; guest RAM mapping ${c("", m.guestRam)}`;
}

const loadAtStart = loadavg()[0]!;
const cfg = testConfig();
const kernelPath = resolveKernelPath(cfg);
const tpl = resolveTemplate(TEST_HOME, "base");
const drv = testDriver();
const TB_SIZES = tbArg > 0 ? process.argv[tbArg + 1]!.split(",").map(Number) : [drv.driver.opts.tcgTbSizeMiB];
if (TB_SIZES.some((n) => !Number.isSafeInteger(n) || n < 0)) throw new Error("--tb-sizes takes MiB values >= 0, comma-separated");
const root = mkdtempSync(join(tmpdir(), "c1bench-"));
const net = new TestNet();
const disks = await DiskService.start({ dir: join(drv.runtimeDir, "disk"), config: diskConfig(cfg) });
await Bun.sleep(500);
/** The disk daemon with no sandbox disk (its warm pool filled): the node's fixed cost. */
const daemonBaseKiB = rollup(disks.pid).Pss!;

/** Host ms (since the boot started) at which each boot phase's console marker appeared. */
interface Phases {
  /** The guest init's first line (kernel booted, tools drive and root mounted, pivoted). */
  init?: number;
  /** The init started envd. */
  envdStarted?: number;
  /** envd's readiness line (listening). */
  listening?: number;
}

function spec(id: string, diskPath: string, phases?: Phases, t0 = 0, extraArgs = ""): VmSpec {
  const boot = testBoot(diskPath, { args: `${tpl.bootArgs} ${extraArgs}`.trim() });
  const at = () => performance.now() - t0;
  return {
    id: `b${process.pid}${id}`,
    workDir: join(root, id, "vm"),
    kernelPath,
    bootArgs: boot.bootArgs,
    vcpus: 1,
    memoryMiB: MEM,
    drives: boot.drives,
    onConsoleLine: phases
      ? (l) => {
          if (phases.init === undefined && l.includes("@@AENV-INIT@@")) phases.init = at();
          if (phases.envdStarted === undefined && l.includes("@@AENV-ENVD-STARTED@@")) phases.envdStarted = at();
          if (phases.listening === undefined && l.includes("envd listening on")) phases.listening = at();
        }
      : undefined,
    net: net.spec,
  };
}

try {
  // baseline: QEMU process start to QMP answering (no guest kernel)
  const qmpMs: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    const sock = join(root, `q${i}.sock`);
    const t0 = performance.now();
    const p = Bun.spawn(["qemu-system-x86_64", "-M", "none", "-nodefaults", "-display", "none", "-qmp", `unix:${sock},server=on,wait=off`]);
    const c = await QmpClient.connect(sock, 10_000);
    qmpMs.push(performance.now() - t0);
    await c.execute("quit").catch(() => {});
    await p.exited;
  }

  /** Figures of the boots with one TCG translation cache size. */
  interface Sweep {
    tbMiB: number;
    /** The cache size of this sweep's restores: as `tbMiB` with --tb-sizes, else `[qemu] tcg_tb_size_restore_mib`. */
    restoreTbMiB: number;
    /** Kernel arguments appended for this sweep (`--ab-args`), "" for none. */
    extraArgs: string;
    /** QEMU CPU time (user + system) from spawn to envd ready, ms. */
    cpuToReadyMs: number[];
    bootMs: number[];
    phases: Phases[];
    /**
     * QEMU PSS without guest RAM at envd ready and after the CPU-bound command, QEMU's anonymous
     * memory after it (heap + translation cache: what each more VM adds; shared library pages are
     * divided among all QEMUs in PSS), the disk daemon's PSS growth, guest RAM touched; KiB.
     */
    overhead: { qemuKiB: number; qemuAfterKiB: number; qemuAnonAfterKiB: number; diskKiB: number; guestTouchedKiB: number }[];
    /** The CPU-bound command's first and second run, ms. */
    cpuMs: [number, number][];
    /** Translation cache flushes from boot to the end of the command (QEMU `info jit`). */
    flushes: number[];
    /** QEMU's memory by class at envd ready and after the command (the last run's). */
    mem?: [ReturnType<typeof qemuMemory>, ReturnType<typeof qemuMemory>];
    /** The same for restores of one snapshot with this cache size. */
    restoreMs: number[];
    restoreCpuMs: [number, number][];
    /** QEMU's own CPU time (user + system) for the command pair after a restore, ms: the work, which load stretches less than the wall time. */
    restoreQemuCpuMs: number[];
    restoreFlushes: number[];
    /** Translated code in the cache after the command (MiB): booted, restored. */
    codeMiB: number[];
    restoreCodeMiB: number[];
    restoreMem?: [ReturnType<typeof qemuMemory>, ReturnType<typeof qemuMemory>];
  }
  const sweeps: Sweep[] = TB_SIZES.flatMap((tbMiB) => (AB_ARGS ? ["", AB_ARGS] : [""]).map((extraArgs) => ({ tbMiB, restoreTbMiB: tbArg > 0 ? tbMiB : drv.driver.opts.tcgTbSizeRestoreMiB, extraArgs, cpuToReadyMs: [], bootMs: [], phases: [], overhead: [], cpuMs: [], flushes: [], restoreMs: [], restoreCpuMs: [], restoreQemuCpuMs: [], restoreFlushes: [], codeMiB: [], restoreCodeMiB: [] })));
  /** A process's CPU time (utime + stime), ms. */
  const cpuMsOf = (pid: number): number => {
    const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    return ((Number(f[11]) + Number(f[12])) * 1000) / 100; // USER_HZ 100
  };
  /** Run the CPU-bound command twice: the two durations, ms. */
  const cpuTwice = async (): Promise<[number, number]> => {
    const cpu: number[] = [];
    for (let k = 0; k < 2; k++) {
      const c0 = performance.now();
      const r = await runInGuest(net.url(ENVD_PORT), CPU_SCRIPT);
      if (r.exitCode !== 0) throw new Error(`CPU-bound command failed (${r.exitCode}): ${r.stderr}`);
      cpu.push(performance.now() - c0);
    }
    return cpu as [number, number];
  };
  /**
   * QEMU's own count of whole-cache flushes (a full translation cache is flushed and refilled)
   * and the bytes of translated code in the cache now (`info jit`: "gen code size used/total").
   */
  const jitInfo = async (vm: unknown): Promise<{ flushes: number; codeBytes: number }> => {
    const jit = await (vm as { qmp: QmpClient }).qmp.execute<string>("human-monitor-command", { "command-line": "info jit" });
    return { flushes: Number(/TB flush count\s+(\d+)/.exec(jit)?.[1] ?? NaN), codeBytes: Number(/gen code size\s+(\d+)/.exec(jit)?.[1] ?? NaN) };
  };
  const flushCount = async (vm: unknown): Promise<number> => {
    const j = await jitInfo(vm);
    codeMiB.push(j.codeBytes / 1048576);
    return j.flushes;
  };
  /** Translated code in the cache at the end of each command pair (MiB), in run order, for the log. */
  const codeMiB: number[] = [];
  // sizes interleaved run by run, so a change of host load does not favour one of them
  for (let i = 0; i < (RESTORES_ONLY ? 0 : RUNS); i++) {
    for (const sw of sweeps) {
      const tbMiB = sw.tbMiB;
      const driver = new QemuDriver({ ...drv.driver.opts, tcgTbSizeMiB: tbMiB });
      const id = `boot${tbMiB}${sw.extraArgs ? "b" : ""}x${i}`;
      const disk = await disks.rootDisk({ id: `b${process.pid}${id}`, lowers: tpl.rootLayers, sandboxDir: join(root, id) });
      try {
        const t0 = performance.now();
        const ph: Phases = {};
        const vm = await driver.boot(spec(id, disk.path, ph, t0, sw.extraArgs));
        try {
          await waitEnvd(net.url(ENVD_PORT), 120_000);
          sw.bootMs.push(performance.now() - t0);
          sw.cpuToReadyMs.push(cpuMsOf(vm.pid));
          sw.phases.push(ph);
          await Bun.sleep(1000); // let envd settle before measuring memory
          const q = rollup(vm.pid);
          const d = rollup(disks.pid);
          const m0 = qemuMemory(vm.pid, vm.memPath);
          sw.cpuMs.push(await cpuTwice());
          const qa = rollup(vm.pid);
          sw.mem = [m0, qemuMemory(vm.pid, vm.memPath)];
          sw.flushes.push(await flushCount(vm));
          sw.codeMiB.push(codeMiB.at(-1)!);
          sw.overhead.push({
            qemuKiB: q.Pss! - (q.Pss_Shmem ?? 0), qemuAfterKiB: qa.Pss! - (qa.Pss_Shmem ?? 0), qemuAnonAfterKiB: qa.Anonymous!,
            diskKiB: Math.max(0, d.Pss! - daemonBaseKiB), guestTouchedKiB: q.Pss_Shmem ?? 0,
          });
        } finally {
          await vm.stop();
        }
      } finally {
        await disk.close();
      }
    }
  }

  // restore: snapshot one booted sandbox, then restore it RUNS times (same disk, served again)
  const restoreMs: number[] = [];
  const sid = "snap";
  if (RESTORE) {
    const disk = await disks.rootDisk({ id: `b${process.pid}${sid}`, lowers: tpl.rootLayers, sandboxDir: join(root, sid) });
    try {
      const imagePath = join(root, "snap.mem");
      const vm = await drv.driver.boot(spec(sid, disk.path));
      await waitEnvd(net.url(ENVD_PORT), 120_000);
      await vm.pause();
      const statePath = join(root, "snap.state");
      const cap = await vm.captureSnapshot(statePath);
      copyFileSync(vm.memPath, imagePath); // a booted VM's RAM is its shared file
      cap.release();
      await vm.stop();
      // restores map the image through the disk daemon's shared read-only export, as a node's do
      const image = await disks.acquireShared({ key: `bench${process.pid}`, rawPath: imagePath, fileName: "memory.img", acceptWritableOpen: true });
      const files = { statePath, memPath: image.path, kind: "full" as const };
      // restores interleaved by cache size as the boots are; the CPU-bound command and memory
      // after each (a restored guest starts with an empty translation cache)
      for (let i = 0; i < RUNS; i++) {
        for (const sw of sweeps) {
          // kernel arguments do not apply to a restore (the snapshot's kernel booted without them)
          if (sw.extraArgs) continue;
          const driver = new QemuDriver({ ...drv.driver.opts, tcgTbSizeRestoreMiB: sw.restoreTbMiB });
          const t0 = performance.now();
          const rid = `${sw.tbMiB}x${i}`;
          const r = await driver.restore({ ...spec(sid, disk.path), id: `b${process.pid}r${rid}`, workDir: join(root, `r${rid}`) }, files, { resume: true });
          try {
            await waitEnvd(net.url(ENVD_PORT), 30_000);
            const ms = performance.now() - t0;
            sw.restoreMs.push(ms);
            if (sw === sweeps[0]) restoreMs.push(ms);
            await Bun.sleep(1000);
            const m0 = qemuMemory(r.pid, files.memPath);
            const c0 = cpuMsOf(r.pid);
            sw.restoreCpuMs.push(await cpuTwice());
            sw.restoreQemuCpuMs.push(cpuMsOf(r.pid) - c0);
            sw.restoreMem = [m0, qemuMemory(r.pid, files.memPath)];
            sw.restoreFlushes.push(await flushCount(r));
            sw.restoreCodeMiB.push(codeMiB.at(-1)!);
          } finally {
            await r.stop();
          }
        }
      }
      await image.close();
    } finally {
      await disk.close();
    }
  }

  const q = median(qmpMs);
  const first = sweeps[0]!;
  const b = median(first.bootMs);
  console.log(`accel ${drv.driver.accel}, guest RAM ${MEM} MiB, 1 vCPU, ${RUNS} runs each (medians); host load average ${loadAtStart.toFixed(1)} at start, ${loadavg()[0]!.toFixed(1)} at end`);
  console.log(`baseline  QEMU spawn -> QMP ready (no guest):  ${fmt(q)}`);
  if (RESTORE) {
    const r = median(restoreMs);
    console.log(`restore   -> envd /health ready:                ${fmt(r)}   (${(r / q).toFixed(1)}x baseline, ${(b / r).toFixed(1)}x faster than cold boot; tb-size ${sweeps[0]!.restoreTbMiB || "QEMU default"})   runs: ${restoreMs.map(fmt).join(" ")}`);
  }
  console.log(`disk daemon base (once per node, warm pool filled): ${(daemonBaseKiB / 1024).toFixed(1)} MiB`);
  for (const sw of sweeps) {
    const bm = median(sw.bootMs);
    const med = (f: (p: Phases) => number | undefined) => median(sw.phases.map((p) => f(p) ?? NaN));
    const init = med((p) => p.init);
    const started = med((p) => p.envdStarted);
    const listening = med((p) => p.listening);
    const oq = median(sw.overhead.map((o) => o.qemuKiB));
    const oqa = median(sw.overhead.map((o) => o.qemuAfterKiB));
    const oan = median(sw.overhead.map((o) => o.qemuAnonAfterKiB));
    const od = median(sw.overhead.map((o) => o.diskKiB));
    const og = median(sw.overhead.map((o) => o.guestTouchedKiB));
    const c1 = median(sw.cpuMs.map((c) => c[0]));
    const c2 = median(sw.cpuMs.map((c) => c[1]));
    const mib = (k: number) => (k / 1024).toFixed(1);
    console.log(`-- tb-size ${sw.tbMiB === 0 ? "QEMU default" : `${sw.tbMiB} MiB`}${AB_ARGS ? (sw.extraArgs ? `, kernel args + "${sw.extraArgs}"` : ", kernel args as configured") : ""}`);
    if (!RESTORES_ONLY) {
      console.log(`cold boot -> envd /health ready:                ${fmt(bm)}   (${(bm / q).toFixed(1)}x baseline)   runs: ${sw.bootMs.map(fmt).join(" ")}; QEMU CPU to ready ${fmt(median(sw.cpuToReadyMs))} (runs ${sw.cpuToReadyMs.map(fmt).join(" ")})`);
      console.log(
        `cold boot phases (medians): QEMU start + kernel + tools init ${fmt(init)}, -> envd exec ${fmt(started - init)}, ` +
          `envd exec -> listening ${fmt(listening - started)}, listening -> /health answered ${fmt(bm - listening)}`,
      );
      console.log(`CPU-bound guest command (python3): first ${fmt(c1)}, second ${fmt(c2)}   runs: ${sw.cpuMs.map((c) => `${fmt(c[0])}/${fmt(c[1])}`).join(" ")}; translation cache flushes by its end: ${sw.flushes.join(" ")}, translated code in the cache then: ${sw.codeMiB.map((m) => m.toFixed(1)).join(" ")} MiB`);
      if (sw.mem) console.log(`QEMU memory at envd ready ${memLine(sw.mem[0])}\n  after the command ${memLine(sw.mem[1])}`);
    }
    if (sw.restoreMs.length > 0) {
      console.log(`restore (tb-size ${sw.restoreTbMiB || "QEMU default"}) -> envd /health ready: ${fmt(median(sw.restoreMs))}; CPU-bound command after restore: first ${fmt(median(sw.restoreCpuMs.map((c) => c[0])))}, second ${fmt(median(sw.restoreCpuMs.map((c) => c[1])))}   runs: ${sw.restoreCpuMs.map((c) => `${fmt(c[0])}/${fmt(c[1])}`).join(" ")}; QEMU CPU for both ${fmt(median(sw.restoreQemuCpuMs))} (runs ${sw.restoreQemuCpuMs.map(fmt).join(" ")}); flushes: ${sw.restoreFlushes.join(" ")}, translated code in the cache: ${sw.restoreCodeMiB.map((m) => m.toFixed(1)).join(" ")} MiB`);
      if (sw.restoreMem) console.log(`restored QEMU memory at envd ready ${memLine(sw.restoreMem[0])}\n  after the command ${memLine(sw.restoreMem[1])}`);
    }
    if (!RESTORES_ONLY) {
      console.log(`memory per VM beyond guest RAM: QEMU ${mib(oq)} MiB at envd ready, ${mib(oqa)} MiB after the command + disk daemon +${mib(od)} MiB for its disk` +
        ` = ${mib(oqa + od)} MiB (${(((oqa + od) / 1024 / MEM) * 100).toFixed(1)}% of guest RAM; guest RAM touched at envd ready: ${mib(og)} MiB);` +
        ` QEMU anonymous (heap + translation cache) after the command ${mib(oan)} MiB`);
    }
  }
} finally {
  await disks.close();
  net.destroy();
  rmSync(root, { recursive: true, force: true });
  drv.dispose();
}
