#!/usr/bin/env bun
/**
 * Density benchmark (issue 32): one node (agentenv server in a private namespace, QEMU TCG) and
 * the unmodified SDK (test/e2e/fixtures/density-client.ts) create sandboxes of one template, one
 * after another, until a bound: `--max` sandboxes, the host's MemAvailable below `--min-free-mib`,
 * or (with `--max-p95-ratio`) a step's p95 create latency above that multiple of the first 10's.
 * At each checkpoint count (`--checkpoints`, and where a bound stopped it) the sandboxes are left
 * alone for `--settle-secs` (60: a restored sandbox's first minute has one-off work, envd's first
 * heap check at 30 s among it), then measured idle over `--idle-secs` (30), and the bench reports:
 *  - create and first-command latency (Sandbox.create; create -> first commands.run returned) of
 *    the creates since the previous checkpoint, p50/p95, and their ratio to the first 10's;
 *  - idle CPU per sandbox: each QEMU's utime + stime (/proc/<pid>/stat) over the window, as % of
 *    one core (mean and max over the QEMUs), and the node's and the disk daemon's CPU over it;
 *  - host memory per sandbox beyond what its guest dirtied, two ways:
 *    process accounting = QEMU Pss - the guest RAM mapping's Anonymous pages (the pages the guest
 *    wrote since its restore: copy-on-write copies of the shared memory image) + QEMU's page
 *    tables (VmPTE) + the disk daemon's and the node's Pss growth since before the first sandbox,
 *    divided among the sandboxes (/proc/<pid>/smaps; Pss divides pages shared by several
 *    processes among them: the memory image's page cache, QEMU's binary and libraries);
 *    system = the drop of MemAvailable since before the first sandbox / count, minus the mean
 *    dirtied (this also holds kernel memory no process accounts for: network namespaces, taps,
 *    FUSE connections, slab; and whatever else changed on the host meanwhile);
 *  - the guest RAM dirtied per sandbox (mean) and the load average;
 *  - after the last checkpoint, memory given back (`--memory-return-mib`, 256; 0: skip): the newest
 *    sandbox's guest allocates and frees that much (python3), and the bench polls its QEMU's
 *    private guest RAM (the mapping's Anonymous pages) every 250 ms for up to 60 s: the rise, how
 *    much went back and when it first reached 200/256 of the amount (goal: >= 200 MiB of 256
 *    within 30 s, free page reporting);
 *  - then `echo ok` in every sandbox (all must answer).
 * `--ksm off|guest|all` sets the node's `[vm] ksm` (kernel samepage merging, docs/density.md),
 * `--ksm-scan-secs N` its `ksm_scan_secs` and `--ksm-pages N` its `ksm_pages_to_scan`; each checkpoint then also gives ksmd's CPU over the
 * idle window (/proc/<ksmd>/stat) and the pages it merged (/sys/kernel/mm/ksm). The host's KSM
 * knobs are put back as they were at the end.
 * Needs root, the kernel and base template with its snapshot in AENV_TEST_HOME_PATH.
 *   bun bench/density.ts [--max 400] [--step 10] [--settle-secs 60] [--idle-secs 30] [--checkpoints 10,20,40,...]
 *     [--min-free-mib 1024] [--max-p95-ratio 0] [--metrics-asked 0] [--memory-return-mib 256]
 *     [--ksm off|guest|all] [--ksm-scan-secs N] [--ksm-pages N] [--env KEY=VALUE]...
 * `--env` sets the node's environment (config overrides such as AENV__metrics__sample_interval_ms=5000);
 * `--metrics-asked N` asks GET /sandboxes/{id}/metrics of N sandboxes before each idle window
 * (someone looking at them).
 */
import { readdirSync, readFileSync } from "node:fs";
import { loadavg } from "node:os";
import { join } from "node:path";
import { diskDaemonsUnder, NodeWorld, qemuPidsUnder } from "../test/e2e/world.ts";
import { ksmSettingsOf, readKsmHost, writeKsmHost } from "../src/ffi/ksm.ts";

const argv = process.argv.slice(2);
const arg = (n: string, d: number) => {
  const i = argv.indexOf(n);
  return i >= 0 ? Number(argv[i + 1]) : d;
};
const MAX = arg("--max", 400);
const STEP = arg("--step", 10);
const IDLE_SECS = arg("--idle-secs", 30);
const SETTLE_SECS = arg("--settle-secs", 60);
const MIN_FREE_MIB = arg("--min-free-mib", 1024);
const MAX_P95_RATIO = arg("--max-p95-ratio", 0);
const METRICS_ASKED = arg("--metrics-asked", 0);
const MEMORY_RETURN_MIB = arg("--memory-return-mib", 256);
const KSM = argv.includes("--ksm") ? argv[argv.indexOf("--ksm") + 1]! : "";
if (KSM && !["off", "guest", "all"].includes(KSM)) throw new Error(`--ksm ${KSM}: off, guest or all`);
const KSM_PAGES = arg("--ksm-pages", -1);
const KSM_SCAN_SECS = arg("--ksm-scan-secs", -1);
const cpIdx = argv.indexOf("--checkpoints");
const CHECKPOINTS = (cpIdx >= 0 ? argv[cpIdx + 1]!.split(",").map(Number) : [10, 20, 40, 80, 120, 160, 200, 240, 280, 320, 360, 400]).filter((c) => c <= MAX);
if (!CHECKPOINTS.includes(MAX)) CHECKPOINTS.push(MAX);
const nodeEnv: Record<string, string> = {};
argv.forEach((a, i) => {
  if (a !== "--env") return;
  const [k, ...v] = argv[i + 1]!.split("=");
  nodeEnv[k!] = v.join("=");
});

if (KSM) nodeEnv.AENV__vm__ksm = KSM;
if (KSM_PAGES >= 0) nodeEnv.AENV__vm__ksm_pages_to_scan = String(KSM_PAGES);
if (KSM_SCAN_SECS >= 0) nodeEnv.AENV__vm__ksm_scan_secs = String(KSM_SCAN_SECS);

const USER_HZ = 100;
const pct = (xs: number[], p: number) => (xs.length === 0 ? NaN : [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.ceil((p / 100) * xs.length) - 1)]!);
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
const ms = (x: number) => `${Math.round(x)} ms`;
const mib = (kib: number) => `${(kib / 1024).toFixed(1)} MiB`;

/** utime + stime of a process, clock ticks (proc(5) fields 14 and 15); NaN when it is gone. */
function cpuTicks(pid: number): number {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    return Number(f[11]) + Number(f[12]);
  } catch {
    return NaN;
  }
}

/** Pages merged away on the host now: pages_sharing + ksm_zero_pages (NaN without KSM). */
function ksmMergedAway(): number {
  const h = readKsmHost();
  return h ? h.pagesSharing + (Number.isNaN(h.zeroPages) ? 0 : h.zeroPages) : NaN;
}

/** pid of the kernel's ksmd thread, or null. */
function ksmdPid(): number | null {
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      if (readFileSync(`/proc/${d}/comm`, "utf8").trim() === "ksmd") return Number(d);
    } catch {
      // gone
    }
  }
  return null;
}

/** Open descriptors of a process (0 when it is gone). */
function fdCount(pid: number): number {
  try {
    return readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    return 0;
  }
}

/** kB field of /proc/meminfo. */
function meminfo(key: string): number {
  return Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(readFileSync("/proc/meminfo", "utf8"))?.[1] ?? NaN);
}

/** Pss of a process, kB (smaps_rollup). */
function pssOf(pid: number): number {
  try {
    return Number(/^Pss:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, "utf8"))?.[1] ?? NaN);
  } catch {
    return NaN;
  }
}

/** A QEMU process's memory, kB: whole Pss, page tables, and its guest RAM mapping's Pss and Anonymous pages. */
interface QemuMem {
  pss: number;
  pte: number;
  ramPss: number;
  /** Pages of the guest RAM mapping the guest wrote (private copies of the memory image). */
  dirtied: number;
}

/** `QemuMem` of `pid`; the guest RAM mapping is the one of `ramKiB` kB backed by a file. */
function qemuMem(pid: number, ramKiB: number): QemuMem | null {
  let text: string;
  let status: string;
  try {
    text = readFileSync(`/proc/${pid}/smaps`, "utf8");
    status = readFileSync(`/proc/${pid}/status`, "utf8");
  } catch {
    return null;
  }
  const out: QemuMem = { pss: 0, pte: Number(/^VmPTE:\s+(\d+) kB/m.exec(status)?.[1] ?? 0), ramPss: 0, dirtied: 0 };
  let inRam = false;
  for (const line of text.split("\n")) {
    const head = /^([0-9a-f]+)-([0-9a-f]+) \S{4} \S+ \S+ \d+\s*(.*)$/.exec(line);
    if (head) {
      const kib = (parseInt(head[2]!, 16) - parseInt(head[1]!, 16)) / 1024;
      inRam = kib === ramKiB && head[3]!.startsWith("/");
      continue;
    }
    const f = /^(Pss|Anonymous):\s+(\d+) kB$/.exec(line);
    if (!f) continue;
    const v = Number(f[2]);
    if (f[1] === "Pss") {
      out.pss += v;
      if (inRam) out.ramPss += v;
    } else if (inRam) out.dirtied += v;
  }
  return out;
}

/** pid of sandbox `id`'s QEMU among `pids` (its command line carries the id). */
function qemuPidOf(pids: number[], id: string): number | undefined {
  return pids.find((p) => {
    try {
      return readFileSync(`/proc/${p}/cmdline`, "utf8").includes(id);
    } catch {
      return false;
    }
  });
}

/** What one sandbox's QEMU gave back after its guest allocated and freed `mib` MiB. */
interface MemoryReturn {
  mib: number;
  /** Rise of the guest RAM's private pages over the allocation, kB. */
  roseKiB: number;
  /** Fall from the peak at the last reading, kB. */
  returnedKiB: number;
  /** ms from the command's return until the fall first reached `mib` * 200/256 MiB; NaN if it never did. */
  reachedMs: number;
}

/**
 * Have sandbox `c` allocate and free `mib` MiB and watch its QEMU's private guest RAM for up to
 * `boundMs`; null when its QEMU is not found or the command failed.
 */
async function memoryReturn(client: Client, c: Created, pids: number[], mib: number, boundMs = 60_000): Promise<MemoryReturn | null> {
  const pid = qemuPidOf(pids, c.id);
  if (pid === undefined) return null;
  const dirtied = () => qemuMem(pid, MEM_MIB * 1024)?.dirtied ?? NaN;
  const before = dirtied();
  const [r] = await client.op({ op: "run", i: c.i, cmd: `python3 -c "b = b'x' * (${mib} << 20); print(len(b))"` });
  if (r?.ev !== "ran" || r.exitCode !== 0) return null;
  const peak = dirtied();
  const goal = ((mib * 200) / 256) * 1024;
  const t0 = performance.now();
  let now = peak;
  let reachedMs = NaN;
  while (performance.now() - t0 < boundMs) {
    await Bun.sleep(250);
    now = dirtied();
    if (peak - now >= goal) {
      reachedMs = performance.now() - t0;
      break;
    }
  }
  return { mib, roseKiB: peak - before, returnedKiB: peak - now, reachedMs };
}

/** One created sandbox as the client reported it. */
interface Created {
  i: number;
  id: string;
  createMs: number;
  firstRunMs: number;
}

/** The client fixture inside the node's namespace, one op at a time. */
class Client {
  private readonly proc: Bun.Subprocess<"pipe", "pipe", "inherit">;
  private readonly reader: { read(): Promise<{ done: boolean; value?: Uint8Array }> };
  private buf = "";

  constructor(world: NodeWorld) {
    this.proc = Bun.spawn(["nsenter", `--net=/run/netns/${world.ns}`, "--", process.execPath, join(import.meta.dir, "../test/e2e/fixtures/density-client.ts"), "base"], {
      stdin: "pipe",
      stdout: "pipe",
      stderr: "inherit",
      env: { ...(process.env as Record<string, string>), E2B_API_URL: world.url, E2B_SANDBOX_URL: world.url, E2B_API_KEY: world.apiKey },
    });
    this.reader = this.proc.stdout.getReader();
  }

  private async line(): Promise<string | null> {
    for (;;) {
      const nl = this.buf.indexOf("\n");
      if (nl >= 0) {
        const l = this.buf.slice(0, nl);
        this.buf = this.buf.slice(nl + 1);
        return l;
      }
      const r = await this.reader.read();
      if (r.done) return null;
      this.buf += new TextDecoder().decode(r.value);
    }
  }

  /** Send one op; returns every event line until its `done`, calling `onEvent` for each. */
  async op(cmd: Record<string, unknown>, onEvent: (e: Record<string, any>) => void = () => {}): Promise<Record<string, any>[]> {
    this.proc.stdin.write(`${JSON.stringify(cmd)}\n`);
    this.proc.stdin.flush();
    const evs: Record<string, any>[] = [];
    for (;;) {
      const l = await this.line();
      if (l === null) throw new Error(`client ended during ${JSON.stringify(cmd)}`);
      if (!l.startsWith("{")) continue;
      const e = JSON.parse(l) as Record<string, any>;
      if (e.ev === "done") return evs;
      evs.push(e);
      onEvent(e);
    }
  }

  async close(): Promise<void> {
    await this.op({ op: "exit" }).catch(() => {});
    this.proc.kill();
    await this.proc.exited;
  }
}

/** Figures of one checkpoint. */
interface Point {
  count: number;
  createP50: number;
  createP95: number;
  firstP50: number;
  firstP95: number;
  cpuMeanPct: number;
  cpuMaxPct: number;
  nodePct: number;
  daemonPct: number;
  perSandboxKiB: number;
  /** Of it: the disk daemon's and the node's growth, per sandbox. */
  sharedKiB: number;
  systemKiB: number;
  dirtiedKiB: number;
  load: number[];
  availMiB: number;
  /** ksmd's CPU over the idle window, % of one core (NaN without ksmd). */
  ksmdPct: number;
  /** Pages merged away on the host at the window's end: pages_sharing + ksm_zero_pages (/sys/kernel/mm/ksm). */
  ksmSharing: number;
}

const world = new NodeWorld();
const load0 = loadavg();
const MEM_MIB = 512;
const points: Point[] = [];
const ksmBefore = readKsmHost();
const ksmd = ksmdPid();
let stopReason = `reached --max ${MAX}`;
try {
  await world.start({
    AENV_LOG_LEVEL: "warn",
    AENV__orchestrator__max_sandboxes: String(MAX + 8),
    // slots come from the warm pool; keep it small so it is not what the memory figures measure
    AENV__pool__low_watermark: "2",
    AENV__pool__high_watermark: "8",
    ...nodeEnv,
  });
  const nodePid = world.node!.pid;
  const client = new Client(world);
  await Bun.sleep(3000); // the disk daemon's and the slot pool's first fill
  const daemonPid = diskDaemonsUnder(world.home)[0]!;
  const base = { avail: meminfo("MemAvailable"), daemon: pssOf(daemonPid), node: pssOf(nodePid), nodeFds: fdCount(nodePid), daemonFds: fdCount(daemonPid) };
  console.log(`node up; load ${load0.map((x) => x.toFixed(2)).join(" ")}; MemAvailable ${mib(base.avail)}; env ${JSON.stringify(nodeEnv)}`);
  const created: Created[] = [];
  let segStart = 0;
  for (const cp of CHECKPOINTS) {
    let failed = false;
    while (created.length < cp && !failed) {
      await client.op({ op: "create", count: Math.min(STEP, cp - created.length) }, (e) => {
        if (e.ev === "created") created.push(e as unknown as Created);
        else if (e.ev === "create_failed") {
          failed = true;
          stopReason = `create ${e.i} failed: ${e.error}`;
        }
      });
      const availMiB = meminfo("MemAvailable") / 1024;
      if (availMiB < MIN_FREE_MIB) {
        failed = true;
        stopReason = `MemAvailable ${availMiB.toFixed(0)} MiB < --min-free-mib ${MIN_FREE_MIB}`;
      }
    }
    const seg = created.slice(segStart);
    segStart = created.length;
    if (METRICS_ASKED > 0) await client.op({ op: "metrics", ids: METRICS_ASKED });
    // idle window: every sandbox made and settled (a restored guest's first seconds are busy:
    // envd's first requests, page reporting), nobody asks anything (but --metrics-asked)
    await Bun.sleep(SETTLE_SECS * 1000);
    const pids = qemuPidsUnder(world.home, world.memDir);
    const t0 = new Map(pids.map((p) => [p, cpuTicks(p)]));
    const n0 = cpuTicks(nodePid);
    const d0 = cpuTicks(daemonPid);
    const k0 = ksmd === null ? NaN : cpuTicks(ksmd);
    const w0 = performance.now();
    await Bun.sleep(IDLE_SECS * 1000);
    const secs = (performance.now() - w0) / 1000;
    const perQemu = pids.map((p) => ((cpuTicks(p) - t0.get(p)!) / USER_HZ / secs) * 100).filter((x) => Number.isFinite(x));
    const mems = pids.map((p) => qemuMem(p, MEM_MIB * 1024)).filter((m): m is QemuMem => m !== null);
    const n = created.length;
    const shared = (Math.max(0, pssOf(daemonPid) - base.daemon) + Math.max(0, pssOf(nodePid) - base.node)) / Math.max(1, n);
    const dirtied = mean(mems.map((m) => m.dirtied));
    const availNow = meminfo("MemAvailable");
    const p: Point = {
      count: n,
      createP50: pct(seg.map((c) => c.createMs), 50),
      createP95: pct(seg.map((c) => c.createMs), 95),
      firstP50: pct(seg.map((c) => c.firstRunMs), 50),
      firstP95: pct(seg.map((c) => c.firstRunMs), 95),
      cpuMeanPct: mean(perQemu),
      cpuMaxPct: Math.max(...perQemu),
      nodePct: ((cpuTicks(nodePid) - n0) / USER_HZ / secs) * 100,
      daemonPct: ((cpuTicks(daemonPid) - d0) / USER_HZ / secs) * 100,
      perSandboxKiB: mean(mems.map((m) => m.pss - m.dirtied + m.pte)) + shared,
      sharedKiB: shared,
      systemKiB: (base.avail - availNow) / Math.max(1, n) - dirtied,
      dirtiedKiB: dirtied,
      load: loadavg(),
      availMiB: availNow / 1024,
      ksmdPct: ksmd === null ? NaN : ((cpuTicks(ksmd) - k0) / USER_HZ / secs) * 100,
      ksmSharing: ksmMergedAway(),
    };
    points.push(p);
    const b = points[0]!;
    console.log(
      `${n} live (${pids.length} QEMU): create p50 ${ms(p.createP50)} p95 ${ms(p.createP95)} (${(p.createP95 / b.createP95).toFixed(2)}x the first 10's p95), ` +
        `first command p50 ${ms(p.firstP50)} p95 ${ms(p.firstP95)} (${(p.firstP95 / b.firstP95).toFixed(2)}x); ` +
        `idle CPU per QEMU ${p.cpuMeanPct.toFixed(2)}% (max ${p.cpuMaxPct.toFixed(2)}%) of a core over ${secs.toFixed(0)} s, node ${p.nodePct.toFixed(2)}%, disk daemon ${p.daemonPct.toFixed(2)}%; ` +
        `memory per sandbox beyond what its guest dirtied ${mib(p.perSandboxKiB)} (processes: QEMU ${mib(p.perSandboxKiB - p.sharedKiB)}, disk daemon and node ${mib(p.sharedKiB)}) / ${mib(p.systemKiB)} (MemAvailable), dirtied ${mib(p.dirtiedKiB)}; ` +
        `host memory per sandbox in all ${mib(p.perSandboxKiB + p.dirtiedKiB)} / ${mib(p.systemKiB + p.dirtiedKiB)}; ` +
        `ksmd ${p.ksmdPct.toFixed(2)}% of a core, ${mib((p.ksmSharing * 4) / n)} per sandbox merged away (pages_sharing + ksm_zero_pages ${p.ksmSharing}); ` +
        `load ${p.load.map((x) => x.toFixed(2)).join(" ")}; MemAvailable ${p.availMiB.toFixed(0)} MiB; ` +
        `descriptors per sandbox: node ${((fdCount(nodePid) - base.nodeFds) / n).toFixed(1)}, disk daemon ${((fdCount(daemonPid) - base.daemonFds) / n).toFixed(1)} (limit ${Number(/^Max open files\s+(\d+)/m.exec(readFileSync(`/proc/${nodePid}/limits`, "utf8"))?.[1])})`,
    );
    if (failed) break;
    if (MAX_P95_RATIO > 0 && points.length > 1 && p.createP95 > MAX_P95_RATIO * b.createP95) {
      stopReason = `create p95 ${ms(p.createP95)} > ${MAX_P95_RATIO}x the first 10's`;
      break;
    }
  }
  let ret: MemoryReturn | null = null;
  if (MEMORY_RETURN_MIB > 0 && created.length > 0) {
    ret = await memoryReturn(client, created.at(-1)!, qemuPidsUnder(world.home, world.memDir), MEMORY_RETURN_MIB);
    console.log(
      ret
        ? `memory given back: a guest allocated and freed ${ret.mib} MiB (its QEMU's private guest RAM rose ${mib(ret.roseKiB)}); ${mib(ret.returnedKiB)} back, ` +
            `${Number.isFinite(ret.reachedMs) ? `${((ret.mib * 200) / 256).toFixed(0)} MiB of it after ${(ret.reachedMs / 1000).toFixed(1)} s` : "never reaching 200/256 of it in 60 s"} (goal >= 200 MiB of 256 within 30 s)`
        : "memory given back: not measured (the sandbox's QEMU was not found or the command failed)",
    );
  }
  const [chk] = await client.op({ op: "check" });
  console.log(`stopped: ${stopReason}`);
  console.log(`every sandbox asked to run \`echo ok\`: ${chk!.answered} of ${created.length} answered (p50 ${ms(chk!.p50Ms)}, p95 ${ms(chk!.p95Ms)})${chk!.failed.length ? `; no answer from ${chk!.failed.join(" ")}` : ""}`);
  const last = points.at(-1)!;
  const first = points[0]!;
  console.log(
    `summary at ${last.count} live vs the first ${first.count}: create p95 ${(last.createP95 / first.createP95).toFixed(2)}x (goal <= 3x), idle CPU per QEMU ${last.cpuMeanPct.toFixed(2)}% (goal <= 0.3%), ` +
      `memory per sandbox beyond dirtied ${mib(last.perSandboxKiB)} / ${mib(last.systemKiB)} (goal <= 45 MiB; in all ${mib(last.perSandboxKiB + last.dirtiedKiB)} / ${mib(last.systemKiB + last.dirtiedKiB)}), ksmd ${last.ksmdPct.toFixed(2)}% of a core, load ${last.load[0]!.toFixed(2)} (goal < 8; ${load0[0]!.toFixed(2)} before the node started), ` +
      `answering ${chk!.answered} of ${created.length}` +
      (ret ? `, memory back ${mib(ret.returnedKiB)} of ${ret.mib} MiB${Number.isFinite(ret.reachedMs) ? ` (${((ret.mib * 200) / 256).toFixed(0)} MiB after ${(ret.reachedMs / 1000).toFixed(1)} s)` : ""} (goal >= 200 MiB within 30 s)` : ""),
  );
  await client.op({ op: "kill" });
  await client.close();
} finally {
  await world.dispose();
  // the node started ksmd at its rate: put the host's knobs back (a failure here must not hide the bench's own)
  try {
    if (ksmBefore) writeKsmHost(ksmSettingsOf(ksmBefore));
  } catch (e) {
    console.error(`the host's KSM knobs could not be put back: ${e instanceof Error ? e.message : String(e)}`);
  }
}
