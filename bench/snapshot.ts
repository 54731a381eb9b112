#!/usr/bin/env bun
/**
 * Snapshot benchmark (issue 9, "How it is shown"): one node (agentenv server in a private
 * namespace, QEMU TCG), the unmodified SDK (test/e2e/fixtures/snapshot-bench.ts), and in one run:
 *  1. Sandbox.create('base') -> first commands.run, p50/p95 of N (a restore of the template's
 *     snapshot), against the node's own restore of the same files (the VM runtime's start, from
 *     its "sandbox restored" log line: layers, disk, slot, memory image, VMM state load, envd /init);
 *  2. cold boot (a create asking for another memory size: no memory snapshot of that shape): the
 *     first makes the shape's boot snapshot, the next restore it and mount the disk; the same
 *     creates on a second node with `[vm] boot_snapshots` off boot the kernel and envd each time;
 *  3. pause time and bytes written for a guest process holding 0, 8 and 64 MiB of fresh bytes
 *     (the node's "sandbox paused" line: changed guest RAM, bytes written to the repository);
 *  4. fork of 4 (one snapshot, four children) and their first commands;
 *  5. host memory per restored sandbox: Pss of each of 4 running QEMU processes, the part
 *     beyond what the guest dirtied (Private_Dirty of the memory image mapping), and the part
 *     beyond guest RAM (Pss less the whole image mapping's), after a first command and again after
 *     a CPU-bound python3 command in each (a long-lived sandbox: TCG cache filled).
 * Then a second node with the restore pool on (`[pool.restore]`, its defaults: VMs of the snapshot
 * last created from restored ahead, warmed and paused):
 *  6. Sandbox.create('base') -> first commands.run, p50/p95 of N, each create made when the pool
 *     has a VM ready (it waits for the refill between creates: the latency of a node with a VM
 *     prepared; back to back creates beyond the pool's size are restores on request, as in 1),
 *     against the bare restores of the same files in the same run (the pool's own restores, each
 *     to envd answering and initialised), with the adoption's steps.
 * Needs root, the kernel and base template with its snapshot in AENV_TEST_HOME_PATH.
 *   bun bench/snapshot.ts [--runs 10] [--cold 3]
 */
import { loadavg } from "node:os";
import { logLines, NodeWorld } from "../test/e2e/world.ts";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const RUNS = arg("--runs", 10);
const COLD = arg("--cold", 3);
const pct = (xs: number[], p: number) => [...xs].sort((x, y) => x - y)[Math.min(xs.length - 1, Math.ceil((p / 100) * xs.length) - 1)]!;
const ms = (x: number) => `${Math.round(x)} ms`;
const MiB = 1048576;
const load0 = loadavg();

/**
 * The split of creates -> first commands.run (ms, one per create): Sandbox.create's part, the
 * first command's (the rest), and a second command on the same sandbox, each as a p50.
 */
function splitLine(firsts: number[], creates: number[], seconds: number[]): string {
  return `  of which Sandbox.create p50 ${ms(pct(creates, 50))}, the first commands.run p50 ${ms(pct(firsts.map((f, i) => f - creates[i]!), 50))}, a second one p50 ${ms(pct(seconds, 50))}`;
}


/** The last node log line with message `msg`. */
function lastLine(world: NodeWorld, msg: string): Record<string, number> {
  const lines = logLines(world, msg);
  if (lines.length === 0) throw new Error(`no "${msg}" line in the node log`);
  return lines.at(-1)!;
}

/**
 * COLD creates of `base` with another memory size (384 MiB) on `w`, one after another: each one's
 * create -> first commands.run (ms, client side) and the node's start (totalMs of its last `msg` line).
 */
async function coldCreates(w: NodeWorld, msg: string): Promise<{ firsts: number[]; starts: number[] }> {
  const firsts: number[] = [];
  const starts: number[] = [];
  for (let i = 0; i < COLD; i++) {
    const o = await w.client("snapshot-bench.ts", ["create", "base", "384"]);
    starts.push(lastLine(w, msg).totalMs!);
    firsts.push(o.firstRunMs);
  }
  return { firsts, starts };
}

/** VMs the restore pool holds ready now (made - adopted - discarded, from the node's log). */
function poolReady(world: NodeWorld): number {
  return logLines(world, "restore pool VM ready").length - logLines(world, "sandbox started from the restore pool").length - logLines(world, "restore pool VM discarded").length;
}

const world = new NodeWorld();
const worlds = [world];
try {
  await world.start({ AENV_LOG_LEVEL: "info" });
  // one create first: the shared memory image is served and its pages cached from then on
  await world.client("snapshot-bench.ts", ["create", "base"]);
  const first: number[] = [];
  /** Sandbox.create's own part of each (the rest is the first commands.run). */
  const creates: number[] = [];
  /** A second commands.run on the same sandbox. */
  const seconds: number[] = [];
  const runtime: number[] = [];
  const steps: Record<string, number>[] = [];
  for (let i = 0; i < RUNS; i++) {
    const o = await world.client("snapshot-bench.ts", ["create", "base"]);
    if (o.exit !== 0) throw new Error(`commands.run exited ${o.exit}`);
    const l = lastLine(world, "sandbox restored");
    first.push(o.firstRunMs);
    creates.push(o.createMs);
    seconds.push(o.secondRunMs);
    runtime.push(l.totalMs!);
    steps.push(l);
  }
  // cold boots: the first of the shape makes its boot snapshot, the next ones restore it
  const coldFirst = await world.client("snapshot-bench.ts", ["create", "base", "384"]);
  const made = lastLine(world, "boot snapshot committed");
  const { firsts: cold, starts: coldStarts } = await coldCreates(world, "sandbox booted from a boot snapshot");
  const coldSteps = logLines(world, "sandbox booted from a boot snapshot").slice(1);
  const pauses: { mib: number; pauseMs: number; changed: number; written: number; vmPausedMs: number }[] = [];
  for (const mib of [0, 8, 64]) {
    const o = await world.client("snapshot-bench.ts", ["pause", String(mib)]);
    const l = lastLine(world, "sandbox paused");
    pauses.push({ mib, pauseMs: o.pauseMs, changed: l.changedMemoryBytes!, written: l.bytesWritten!, vmPausedMs: l.pauseMs! });
  }
  const fork = await world.client("snapshot-bench.ts", ["fork", "4"]);
  const mem = await world.client("snapshot-bench.ts", ["memory", "4"]);
  await world.dispose();

  // the same cold boots with [vm] boot_snapshots off: the kernel and envd boot every time
  const bw = new NodeWorld();
  worlds.push(bw);
  await bw.start({ AENV_LOG_LEVEL: "info", AENV__vm__boot_snapshots: "false" });
  const { firsts: booted, starts: bootedStarts } = await coldCreates(bw, "sandbox booted");
  await bw.dispose();

  // 6. the restore pool: a node of its own with [pool.restore] on (defaults)
  const pw = new NodeWorld();
  worlds.push(pw);
  await pw.start({ AENV_LOG_LEVEL: "info", AENV__pool__restore__low_watermark: "1", AENV__pool__restore__high_watermark: "2" });
  await pw.client("snapshot-bench.ts", ["create", "base"]); // restored on request; makes base the pooled snapshot
  const pooledFirst: number[] = [];
  const pooledCreates: number[] = [];
  const pooledSeconds: number[] = [];
  const adoption: Record<string, number>[] = [];
  let onRequest = 0;
  for (let i = 0; i < RUNS; i++) {
    for (let j = 0; j < 1200 && poolReady(pw) < 1; j++) await Bun.sleep(100);
    const before = logLines(pw, "sandbox started from the restore pool").length;
    const o = await pw.client("snapshot-bench.ts", ["create", "base"]);
    if (o.exit !== 0) throw new Error(`commands.run exited ${o.exit}`);
    const adopted = logLines(pw, "sandbox started from the restore pool");
    if (adopted.length > before) adoption.push(adopted.at(-1)!);
    else onRequest++;
    pooledFirst.push(o.firstRunMs);
    pooledCreates.push(o.createMs);
    pooledSeconds.push(o.secondRunMs);
  }
  const fills = logLines(pw, "restore pool VM restored");

  const p50 = pct(first, 50);
  const r50 = pct(runtime, 50);
  const step = (k: string) => Math.round(pct(steps.map((s) => s[k]!), 50));
  console.log(`load before: ${load0.map((x) => x.toFixed(2)).join(" ")}; after: ${loadavg().map((x) => x.toFixed(2)).join(" ")} (2 cores, QEMU TCG)`);
  console.log(`create from the base snapshot -> first commands.run, N=${RUNS}: p50 ${ms(p50)}, p95 ${ms(pct(first, 95))}`);
  console.log(splitLine(first, creates, seconds));
  console.log(`  the node's restore of the same files (runtime start), same run: p50 ${ms(r50)}, p95 ${ms(pct(runtime, 95))}; SDK/restore ratio ${(p50 / r50).toFixed(2)}x (goal <= 1.5x and < 600 ms)`);
  console.log(`  restore steps p50: verify ${step("verifyMs")}, disk ${step("diskMs")}, slot ${step("slotMs")}, memory image ${step("memoryMs")}, VMM state load ${step("vmmMs")} (spawn to QMP ${step("vmmSpawnMs")}), envd ${step("envdMs")} ms (health ${step("healthMs")}, /init ${step("initMs")})`);
  const cstep = (k: string) => Math.round(pct(coldSteps.map((l) => l[k]), 50));
  console.log(`cold boot (create with another memory size), the node's start to envd initialised, N=${COLD}: from the boot snapshot p50 ${ms(pct(coldStarts, 50))}, booting the kernel (boot_snapshots off, second node) p50 ${ms(pct(bootedStarts, 50))}: ${(pct(coldStarts, 50) / pct(bootedStarts, 50)).toFixed(2)}x (goal: halve it)`);
  console.log(`  create -> first commands.run: from the boot snapshot p50 ${ms(pct(cold, 50))}, booting p50 ${ms(pct(booted, 50))} (${(pct(cold, 50) / pct(booted, 50)).toFixed(2)}x); restore of the template's memory snapshot ${ms(p50)}`);
  console.log(`  steps from the boot snapshot p50: disk ${cstep("diskMs")}, slot ${cstep("slotMs")}, memory image ${cstep("memoryMs")}, restore + root mount ${cstep("vmmMs")}, envd ${cstep("envdMs")} ms (health ${cstep("healthMs")}, /init ${cstep("initMs")})`);
  console.log(`  the shape's first cold boot made the boot snapshot: create -> first commands.run ${ms(coldFirst.firstRunMs)}; boot to envd ${ms(made.readyMs!)}, committed after ${ms(made.totalMs!)} (memory layer ${(made.memoryBytes! / MiB).toFixed(1)} MiB)`);
  for (const p of pauses) {
    console.log(`pause, guest holding ${p.mib} MiB of fresh bytes: SDK ${ms(p.pauseMs)} (VM paused ${ms(p.vmPausedMs)}); guest RAM changed ${(p.changed / MiB).toFixed(1)} MiB, written ${(p.written / MiB).toFixed(1)} MiB (guest RAM 512 MiB)`);
  }
  console.log(`fork of 4 (one snapshot, 4 children): ${ms(fork.forkMs)}, ${fork.ok} children, their first commands.run ${ms(fork.firstRunsMs)}`);
  const vms = mem.vms as { image: Record<string, number>; all: Record<string, number> }[];
  const kb = (x: number) => `${(x / 1024).toFixed(1)} MiB`;
  const avgOf = (list: typeof vms, f: (v: (typeof vms)[number]) => number) => list.reduce((s, v) => s + f(v), 0) / list.length;
  const avg = (f: (v: (typeof vms)[number]) => number) => avgOf(vms, f);
  console.log(`host memory per restored sandbox (4 running, mean): Pss ${kb(avg((v) => v.all.Pss!))}, Rss ${kb(avg((v) => v.all.Rss!))}; memory image mapping: Rss ${kb(avg((v) => v.image.Rss!))}, Pss ${kb(avg((v) => v.image.Pss!))}, dirtied (Private_Dirty) ${kb(avg((v) => v.image.Private_Dirty!))}`);
  console.log(`  beyond what the guest dirtied: Pss - image Private_Dirty = ${kb(avg((v) => v.all.Pss! - v.image.Private_Dirty!))} per sandbox`);
  // guest RAM is the whole memory image mapping (pages shared with the other sandboxes restored
  // from it, and the ones this guest dirtied); the rest is QEMU's own: TCG cache, heap, and its
  // binary's and libraries' pages, which PSS divides among the QEMUs of the host
  const beyondRam = (v: (typeof vms)[number]) => v.all.Pss! - v.image.Pss!;
  console.log(`  beyond guest RAM (Pss - the memory image mapping's Pss): ${kb(avg(beyondRam))} per sandbox after a first command`);
  const after = mem.vmsAfter as typeof vms;
  const avgAfter = (f: (v: (typeof vms)[number]) => number) => avgOf(after, f);
  console.log(`  after a CPU-bound python3 command in each (TCG cache filled): beyond guest RAM ${kb(avgAfter(beyondRam))} per sandbox (goal < 64 MiB), Pss ${kb(avgAfter((v) => v.all.Pss!))}, image mapping Pss ${kb(avgAfter((v) => v.image.Pss!))}`);
  const q50 = pct(pooledFirst, 50);
  const f50 = pct(fills.map((f) => f.totalMs), 50);
  const fstep = (k: string) => Math.round(pct(fills.map((f) => f[k]), 50));
  const astep = (k: string) => (adoption.length ? Math.round(pct(adoption.map((a) => a[k]), 50)) : NaN);
  console.log(`with the restore pool ([pool.restore] defaults; each create made once a VM was ready): create -> first commands.run, N=${RUNS}: p50 ${ms(q50)}, p95 ${ms(pct(pooledFirst, 95))} (${adoption.length} adopted a pooled VM, ${onRequest} restored on request)`);
  console.log(splitLine(pooledFirst, pooledCreates, pooledSeconds));
  console.log(`  bare restores of the same files in the same run (the pool's, to envd initialised), N=${fills.length}: p50 ${ms(f50)}, p95 ${ms(pct(fills.map((f) => f.totalMs), 95))}; SDK/restore ratio ${(q50 / f50).toFixed(2)}x (goal <= 1.5x and < 600 ms)`);
  console.log(`  those restores' steps p50: disk ${fstep("diskMs")}, slot ${fstep("slotMs")}, memory image ${fstep("memoryMs")}, VMM ${fstep("vmmMs")} (spawn ${fstep("vmmSpawnMs")}), envd ${fstep("envdMs")} ms (health ${fstep("healthMs")}, /init ${fstep("initMs")})`);
  console.log(`  the adoption's steps p50: policy ${astep("slotMs")}, continue ${astep("vmmMs")}, envd ${astep("envdMs")} ms (health ${astep("healthMs")}, /init ${astep("initMs")}), total ${astep("totalMs")} ms`);
  console.log(`load at the end: ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
} finally {
  for (const w of worlds) await w.dispose();
}
