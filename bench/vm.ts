#!/usr/bin/env bun
/**
 * VM benchmark (QEMU microvm, TCG on this host): cold boot of a sandbox from the base template
 * (FUSE-served overlaybd root disk + fresh upper, tap in a netns) to envd answering GET /health,
 * median of N; restore of a snapshot of a booted sandbox to envd answering, median of N; and the
 * node's memory per VM beyond guest RAM (QEMU's proportional set size without guest RAM, plus the
 * disk daemon's). Baselines from the same run: QEMU spawn to QMP ready (no guest), and the
 * guest RAM size. Needs root, the built kernel and base template (scripts/test.sh pre-step).
 *   bun bench/vm.ts [--runs 5] [--mem-mib 512]
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { diskConfig, DiskService } from "../src/storage/daemon/index.ts";
import { resolveTemplate } from "../src/template/index.ts";
import { resolveKernelPath, type VmSpec } from "../src/vmm/index.ts";
import { ENVD_PORT, waitEnvd } from "../test/vmm/qemu/envd-client.ts";
import { TEST_HOME, TestNet, testBoot, testConfig, testDriver } from "../test/vmm/qemu/helpers.ts";
import { QmpClient } from "../src/vmm/qemu/qmp.ts";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const RUNS = arg("--runs", 5);
const MEM = arg("--mem-mib", 512);

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const fmt = (ms: number) => `${(ms / 1000).toFixed(2)} s`;

/** kB fields of /proc/<pid>/smaps_rollup. */
function rollup(pid: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const m of readFileSync(`/proc/${pid}/smaps_rollup`, "utf8").matchAll(/^(\w+):\s+(\d+) kB$/gm)) out[m[1]!] = Number(m[2]);
  return out;
}

const loadAtStart = loadavg()[0]!;
const cfg = testConfig();
const kernelPath = resolveKernelPath(cfg);
const tpl = resolveTemplate(TEST_HOME, "base");
const drv = testDriver();
const root = mkdtempSync(join(tmpdir(), "c1bench-"));
const net = new TestNet();
const disks = await DiskService.start({ dir: join(drv.runtimeDir, "disk"), config: diskConfig(cfg) });

/** Host ms (since the boot started) at which each boot phase's console marker appeared. */
interface Phases {
  /** The guest init's first line (kernel booted, tools drive and root mounted, pivoted). */
  init?: number;
  /** The init started envd. */
  envdStarted?: number;
  /** envd's readiness line (listening). */
  listening?: number;
}

function spec(id: string, diskPath: string, phases?: Phases, t0 = 0): VmSpec {
  const boot = testBoot(diskPath, { args: tpl.bootArgs });
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

  const bootMs: number[] = [];
  const phases: Phases[] = [];
  const overhead: { qemuKiB: number; diskKiB: number; guestTouchedKiB: number }[] = [];
  for (let i = 0; i < RUNS; i++) {
    const id = `boot${i}`;
    const disk = await disks.rootDisk({ id: `b${process.pid}${id}`, lowers: tpl.rootLayers, sandboxDir: join(root, id) });
    try {
      const t0 = performance.now();
      const ph: Phases = {};
      const vm = await drv.driver.boot(spec(id, disk.path, ph, t0));
      try {
        await waitEnvd(net.url(ENVD_PORT), 120_000);
        bootMs.push(performance.now() - t0);
        phases.push(ph);
        await Bun.sleep(1000); // let envd settle before measuring memory
        const q = rollup(vm.pid);
        const d = rollup(disks.pid);
        overhead.push({ qemuKiB: q.Pss! - (q.Pss_Shmem ?? 0), diskKiB: d.Pss!, guestTouchedKiB: q.Pss_Shmem ?? 0 });
      } finally {
        await vm.stop();
      }
    } finally {
      await disk.close();
    }
  }

  // restore: snapshot one booted sandbox, then restore it RUNS times (same disk, served again)
  const restoreMs: number[] = [];
  const sid = "snap";
  const disk = await disks.rootDisk({ id: `b${process.pid}${sid}`, lowers: tpl.rootLayers, sandboxDir: join(root, sid) });
  try {
    const files = { statePath: join(root, "snap.state"), memPath: join(root, "snap.mem"), kind: "full" as const };
    const vm = await drv.driver.boot(spec(sid, disk.path));
    await waitEnvd(net.url(ENVD_PORT), 120_000);
    await vm.pause();
    await vm.snapshot(files);
    await vm.stop();
    for (let i = 0; i < RUNS; i++) {
      const t0 = performance.now();
      const r = await drv.driver.restore({ ...spec(sid, disk.path), id: `b${process.pid}r${i}`, workDir: join(root, `r${i}`) }, files, { resume: true });
      try {
        await waitEnvd(net.url(ENVD_PORT), 30_000);
        restoreMs.push(performance.now() - t0);
      } finally {
        await r.stop();
      }
    }
  } finally {
    await disk.close();
  }

  const q = median(qmpMs);
  const b = median(bootMs);
  const r = median(restoreMs);
  const oq = median(overhead.map((o) => o.qemuKiB));
  const od = median(overhead.map((o) => o.diskKiB));
  const og = median(overhead.map((o) => o.guestTouchedKiB));
  console.log(`accel ${drv.driver.accel}${drv.driver.opts.tcgTbSizeMiB ? `, tb-size ${drv.driver.opts.tcgTbSizeMiB} MiB` : ""}, guest RAM ${MEM} MiB, 1 vCPU, ${RUNS} runs each (medians); host load average ${loadAtStart.toFixed(1)} at start`);
  console.log(`baseline  QEMU spawn -> QMP ready (no guest):  ${fmt(q)}`);
  console.log(`cold boot -> envd /health ready:                ${fmt(b)}   (${(b / q).toFixed(1)}x baseline)   runs: ${bootMs.map(fmt).join(" ")}`);
  console.log(`restore   -> envd /health ready:                ${fmt(r)}   (${(r / q).toFixed(1)}x baseline, ${(b / r).toFixed(1)}x faster than cold boot)   runs: ${restoreMs.map(fmt).join(" ")}`);
  const med = (f: (p: Phases) => number | undefined) => median(phases.map((p) => f(p) ?? NaN));
  const init = med((p) => p.init);
  const started = med((p) => p.envdStarted);
  const listening = med((p) => p.listening);
  console.log(
    `cold boot phases (medians): QEMU start + kernel + tools init (mount, pivot_root, API fs, clock, net) ${fmt(init)}, ` +
      `-> envd exec ${fmt(started - init)}, envd exec -> listening ${fmt(listening - started)}, listening -> /health answered ${fmt(b - listening)}`,
  );
  console.log(`memory per VM beyond guest RAM: QEMU ${(oq / 1024).toFixed(1)} MiB + disk server ${(od / 1024).toFixed(1)} MiB = ${((oq + od) / 1024).toFixed(1)} MiB` +
    ` (${(((oq + od) / 1024 / MEM) * 100).toFixed(1)}% of guest RAM; guest RAM touched at envd ready: ${(og / 1024).toFixed(1)} MiB)`);
} finally {
  await disks.close();
  net.destroy();
  rmSync(root, { recursive: true, force: true });
  drv.dispose();
}
