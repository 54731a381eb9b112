#!/usr/bin/env bun
/**
 * Chaos bench (issue 27 item 7): sandboxes outlive the node. One node (agentenv server in a
 * private namespace, real QEMU VMs, disk daemon, network slots, SQLite; test/e2e/world.ts) and a
 * workload of the unmodified e2b SDK (bench/chaos/workload.ts: creates, commands, writes with
 * sha256s, pauses, snapshots, creates from snapshots, forks, kills) at `--concurrency`, while the
 * bench SIGKILLs, at moments drawn from `--seed`, the node process (then starts it again on the
 * same runtime and data paths: it adopts what runs), the disk daemon (the node starts it again)
 * or one VMM (the node keeps its files as a paused sandbox). After each kill the workload measures
 * how long the API (GET /health) and a sandbox (connect + a command) were unavailable, then
 * checks every sandbox it believes alive (it answers under the same id) and every file it wrote
 * (sha256 equal to the last acknowledged write, or to a write whose answer the kill cut).
 *
 * First, in the same run (`--adopt N`, 0 skips it): the node's start-up (spawn to its banner, when
 * the API serves) after kill -9 with no sandbox, against kill -9 with N running sandboxes to
 * adopt, `--startup-runs` times each: the delta and ratio, and the time from the node's spawn to
 * each sandbox's "sandbox adopted" log line (p50/p95).
 *
 * At the end the workload kills its sandboxes and deletes its snapshots, the node stops
 * (SIGTERM), and the bench lists what is left: processes, namespaces, mounts, devices, work dirs,
 * layers, staging, VMM records. Figures: kills by kind, sandboxes lost that the workload did not
 * kill, bytes lost of acknowledged writes, leaks, adoption times, unavailability per restart.
 *
 * Needs root, QEMU and the kernel and base template (with its snapshot) in AENV_TEST_HOME_PATH,
 * built by this checkout (`AENV_HOME_PATH=$AENV_TEST_HOME_PATH bun src/cli/main.ts template
 * build-base`): the guests run the envd of its tools drive and of the template's memory snapshot.
 *   bun bench/chaos.ts [--kills 50] [--seed N] [--concurrency 4] [--duration 3600 (s)]
 *     [--min-gap 2] [--max-gap 15 (s)] [--weights node=2,daemon=1,vmm=2] [--max-sandboxes 8]
 *     [--max-write-kib 256] [--adopt 50] [--startup-runs 3] [--out DIR] [--log PATH] [--json]
 * `--out` (default a new /tmp/aenv-chaos-XXXX) receives the node's full log of every start
 * (`node.log`, or `--log PATH`; pino JSON lines, level info) and the figures (`figures.json`):
 * a sandbox the check finds lost is diagnosed from its lines there (grep its id).
 */
import { join } from "node:path";
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { diskDaemonsUnder, NodeWorld, qemuPidsUnder, TEST_HOME } from "../test/e2e/world.ts";
import { killSchedule, KILL_KINDS, leakCounts, percentile, type KillKind } from "./chaos/plan.ts";
import { leftovers, ublkDevices } from "./chaos/leaks.ts";
import { loadConfig } from "../src/config/index.ts";

const argv = process.argv.slice(2);
const flag = (n: string) => argv.includes(n);
const arg = (n: string, d: number) => {
  const i = argv.indexOf(n);
  return i >= 0 ? Number(argv[i + 1]) : d;
};
const str = (n: string, d: string) => {
  const i = argv.indexOf(n);
  return i >= 0 ? argv[i + 1]! : d;
};
const KILLS = arg("--kills", 50);
const SEED = arg("--seed", Math.floor(Math.random() * 2 ** 31));
const CONCURRENCY = arg("--concurrency", 4);
const DURATION_MS = arg("--duration", 3600) * 1000;
const ADOPT = arg("--adopt", 50);
const STARTUP_RUNS = arg("--startup-runs", 3);
/** The node's environment at every start: its limit of live sandboxes leaves room for the --adopt set and the workload's. */
const NODE_ENV = { AENV_LOG_LEVEL: "info", AENV__orchestrator__max_sandboxes: String(ADOPT + arg("--max-sandboxes", 8) + 16) };
const JSON_OUT = flag("--json");
const OUT_DIR = argv.includes("--out") ? str("--out", "") : mkdtempSync("/tmp/aenv-chaos-");
mkdirSync(OUT_DIR, { recursive: true });
const NODE_LOG = str("--log", join(OUT_DIR, "node.log"));
const weights = Object.fromEntries(KILL_KINDS.map((k) => [k, k === "daemon" ? 1 : 2])) as Record<KillKind, number>;
for (const kv of str("--weights", "").split(",").filter(Boolean)) {
  const [k, v] = kv.split("=");
  if (!KILL_KINDS.includes(k as KillKind) || !(Number(v) >= 0)) throw new Error(`--weights: bad entry ${kv} (kinds: ${KILL_KINDS.join(", ")})`);
  weights[k as KillKind] = Number(v);
}
const schedule = killSchedule({ seed: SEED, kills: KILLS, minGapMs: arg("--min-gap", 2) * 1000, maxGapMs: arg("--max-gap", 15) * 1000, weights, daemonKillsPerNode: 4 });
const say = (s: string) => (JSON_OUT ? process.stderr : process.stdout).write(`${s}\n`);
const ms = (x: number | null) => (x === null ? "-" : `${Math.round(x)} ms`);

/** The workload process: JSON lines in, JSON lines out (bench/chaos/workload.ts). */
class Workload {
  private readonly proc;
  private readonly lines: AsyncIterator<string>;
  constructor(w: NodeWorld) {
    this.proc = Bun.spawn(["nsenter", `--net=/run/netns/${w.ns}`, "--", process.execPath, join(import.meta.dir, "chaos", "workload.ts")], {
      stdin: "pipe",
      stdout: "pipe",
      stderr: "inherit",
      env: {
        ...(process.env as Record<string, string>),
        E2B_API_URL: w.url,
        E2B_SANDBOX_URL: w.url,
        E2B_API_KEY: w.apiKey,
        CHAOS_CONCURRENCY: String(CONCURRENCY),
        CHAOS_SEED: String(SEED),
        CHAOS_MAX_SANDBOXES: String(arg("--max-sandboxes", 8)),
        CHAOS_MAX_WRITE_KIB: String(arg("--max-write-kib", 256)),
      },
    });
    const out = this.proc.stdout;
    this.lines = (async function* () {
      let buf = "";
      for await (const c of out) {
        buf += new TextDecoder().decode(c);
        for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
          yield buf.slice(0, i);
          buf = buf.slice(i + 1);
        }
      }
    })();
  }

  send(m: Record<string, unknown>): void {
    this.proc.stdin.write(`${JSON.stringify(m)}\n`);
    this.proc.stdin.flush();
  }

  /** The next message of the workload, which must be `ev`. */
  async next(ev: string): Promise<Record<string, any>> {
    const r = await this.lines.next();
    if (r.done) throw new Error(`the workload ended before "${ev}"`);
    const m = JSON.parse(r.value) as Record<string, any>;
    if (m.ev !== ev) throw new Error(`the workload answered ${r.value.slice(0, 2000)}, expected "${ev}"`);
    return m;
  }

  kill(): void {
    this.proc.kill("SIGKILL");
  }
}

/** Log lines (pino JSON) of the node written since `from` (an offset in `w.fullLog`) whose message is `msg`. */
function linesSince(w: NodeWorld, from: number, msg: string): Record<string, any>[] {
  return w.fullLog
    .slice(from)
    .split("\n")
    .filter((l) => l.includes(`"msg":"${msg}"`))
    .map((l) => JSON.parse(l));
}

/** One start of the node after a kill -9 of it: spawn to banner, its reconciliation line, and ms from spawn to each adoption. */
interface Restart {
  startMs: number;
  reconcileMs: number | null;
  adopted: number;
  adoptMs: number[];
}

/** SIGKILL the node, note the moment (epoch ms); `then` runs while it is down. */
async function killNode(w: NodeWorld): Promise<number> {
  const at = Date.now();
  await w.crash();
  return at;
}

/** Start the node again and read what its start-up did. */
async function restart(w: NodeWorld): Promise<Restart> {
  const from = w.fullLog.length;
  const spawnAt = Date.now();
  await w.start(NODE_ENV);
  const startMs = Date.now() - spawnAt;
  // the reconciliation line comes before the banner; stderr may lag stdout a little
  for (let i = 0; i < 100 && linesSince(w, from, "start-up reconciliation done").length === 0; i++) await Bun.sleep(20);
  const done = linesSince(w, from, "start-up reconciliation done")[0];
  return {
    startMs,
    reconcileMs: done?.ms ?? null,
    adopted: done?.adopted ?? 0,
    adoptMs: linesSince(w, from, "sandbox adopted").map((l) => (l.time as number) - spawnAt),
  };
}

/** The sandbox id a QEMU process runs (its `-name aenv-<id>`), or null. */
function sandboxOfVmm(pid: number): string | null {
  try {
    const args = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    const name = args[args.indexOf("-name") + 1] ?? "";
    return name.startsWith("aenv-") ? name.slice(5).split(",")[0]! : null;
  } catch {
    return null;
  }
}

const stats = (xs: number[]) => ({ n: xs.length, p50: percentile(xs, 50), p95: percentile(xs, 95), max: xs.length ? Math.max(...xs) : null });
const sum = (xs: number[]) => xs.reduce((s, x) => s + x, 0);

/** What the guests run: the tools drive (envd) and the base template's snapshot of the test home. */
function guestProvenance(): { tools: string | null; baseSnapshot: string | null } {
  const read = (p: string) => {
    try {
      return readFileSync(p, "utf8");
    } catch {
      return null;
    }
  };
  return { tools: read(join(TEST_HOME, "tools", "current"))?.trim() ?? null, baseSnapshot: JSON.parse(read(join(TEST_HOME, "templates", "base", "manifest.json")) ?? "{}").snapshot ?? null };
}

const world = new NodeWorld();
world.logFile = NODE_LOG;
writeFileSync(NODE_LOG, "");
say(`node log: ${NODE_LOG}`);
let workload: Workload | undefined;
const ublkBefore = ublkDevices();
let exitCode = 0;
try {
  const t0 = Date.now();
  await world.start(NODE_ENV);
  workload = new Workload(world);
  const checks: Record<string, any>[] = [];

  // ---- start-up with N sandboxes to adopt against none ----
  const empty: Restart[] = [];
  const withN: Restart[] = [];
  if (ADOPT > 0) {
    for (let i = 0; i < STARTUP_RUNS; i++) {
      await killNode(world);
      empty.push(await restart(world));
    }
    say(`start-up with no sandbox: ${empty.map((r) => ms(r.startMs)).join(", ")}`);
    const tp = Date.now();
    workload.send({ cmd: "populate", n: ADOPT });
    await workload.next("populated");
    say(`${ADOPT} sandboxes made in ${ms(Date.now() - tp)}`);
    for (let i = 0; i < STARTUP_RUNS; i++) {
      await killNode(world);
      withN.push(await restart(world));
    }
    say(`start-up with ${ADOPT} to adopt: ${withN.map((r) => `${ms(r.startMs)} (adopted ${r.adopted})`).join(", ")}`);
    workload.send({ cmd: "verify" });
    checks.push({ after: "startup", ...(await workload.next("verified")).check });
    workload.send({ cmd: "drain" });
    await workload.next("drained");
  }

  // ---- chaos ----
  workload.send({ cmd: "run" });
  await workload.next("running");
  const tc = Date.now();
  const kills: { kind: KillKind; planned: KillKind; healthMs: number | null; sandboxMs: number | null; restart?: Restart; sandboxId?: string | null; alive: number }[] = [];
  const nodeDiedAlone: number[] = [];
  for (const k of schedule) {
    if (Date.now() - tc + k.gapMs > DURATION_MS) break;
    await Bun.sleep(k.gapMs);
    let kind = k.kind;
    let sandboxId: string | null = null;
    let pid: number | undefined;
    if (kind === "vmm") {
      const vmms = qemuPidsUnder(world.home, world.memDir).sort((a, b) => a - b);
      pid = vmms[Math.floor(k.pick * vmms.length)];
      if (pid === undefined) kind = "node";
      else sandboxId = sandboxOfVmm(pid);
    } else if (kind === "daemon") {
      pid = diskDaemonsUnder(world.home)[0];
      if (pid === undefined) kind = "node";
    }
    let at: number;
    let r: Restart | undefined;
    if (kind === "node") {
      at = await killNode(world);
      workload.send({ cmd: "killed", kind, at });
      r = await restart(world);
    } else {
      at = Date.now();
      process.kill(pid!, "SIGKILL");
      workload.send({ cmd: "killed", kind, at, sandboxId });
    }
    const a = await workload.next("available");
    const c = await workload.next("checked");
    // how long before the kill each lost version was acknowledged (negative: after it)
    for (const f of c.check.wrong) f.ackedMsBeforeKill = f.ackedAt ? at - f.ackedAt : null;
    checks.push({ after: `${kind} kill ${kills.length + 1}`, ...c.check });
    kills.push({ kind, planned: k.kind, healthMs: a.healthMs, sandboxMs: a.sandboxMs, restart: r, sandboxId, alive: c.alive });
    const lost = c.check.lost.length + c.check.bytesLost + c.check.wrong.length;
    say(
      `kill ${kills.length}/${schedule.length} ${kind}${sandboxId ? ` (${sandboxId})` : ""}: API back ${ms(a.healthMs)}, sandbox ${ms(a.sandboxMs)}` +
        `${r ? `, node start ${ms(r.startMs)} adopted ${r.adopted}` : ""}; checked ${c.check.sandboxes} sandboxes, ${c.check.files} files` +
        `${lost ? ` LOST ${JSON.stringify({ lost: c.check.lost, bytes: c.check.bytesLost, wrong: c.check.wrong })}` : ""}`,
    );
    // a node that died by itself (not one of the kills) is a finding: note it, start it again
    if (world.node && world.node.exitCode !== null) {
      nodeDiedAlone.push(world.node.exitCode);
      world.node = undefined;
      await restart(world);
    }
  }
  const chaosMs = Date.now() - tc;
  workload.send({ cmd: "finish" });
  const fin = await workload.next("finished");
  checks.push({ after: "finish", ...fin.check });
  const stopCode = await world.stop();
  const graceMs = loadConfig({ env: world.env() }).snapshot.gc_grace_secs * 1000;
  const { left, layersAwaitingGc } = leftovers(world, ublkBefore, graceMs);

  // ---- figures ----
  const restarts = kills.filter((k) => k.restart).map((k) => k.restart!);
  const byKind = Object.fromEntries(KILL_KINDS.map((kind) => [kind, kills.filter((k) => k.kind === kind).length]));
  const unavailable = Object.fromEntries(
    KILL_KINDS.map((kind) => {
      const ks = kills.filter((k) => k.kind === kind);
      return [kind, { health: stats(ks.flatMap((k) => (k.healthMs === null ? [] : [k.healthMs]))), sandbox: stats(ks.flatMap((k) => (k.sandboxMs === null ? [] : [k.sandboxMs]))), neverBack: ks.filter((k) => k.healthMs === null || k.sandboxMs === null).length }];
    }),
  );
  const emptyP50 = percentile(empty.map((r) => r.startMs), 50);
  const withNP50 = percentile(withN.map((r) => r.startMs), 50);
  const leaks = leakCounts(left);
  const figures = {
    seed: SEED,
    nodeLog: NODE_LOG,
    guest: guestProvenance(),
    concurrency: CONCURRENCY,
    chaosMs,
    totalMs: Date.now() - t0,
    kills: { total: kills.length, ...byKind, planned: schedule.length },
    sandboxesLost: sum(checks.map((c) => c.lost.length)),
    lost: checks.flatMap((c) => c.lost.map((l: object) => ({ after: c.after, ...l }))),
    bytesLost: sum(checks.map((c) => c.bytesLost)),
    filesLost: checks.flatMap((c) => c.wrong.map((t: object) => ({ after: c.after, ...t }))),
    unverifiedFiles: checks.flatMap((c) => c.unverified.map((t: object) => ({ after: c.after, ...t }))),
    snapshotsLost: checks.flatMap((c) => c.snapshotsLost),
    strays: sum(checks.map((c) => c.strays)),
    sandboxesChecked: sum(checks.map((c) => c.sandboxes)),
    filesChecked: sum(checks.map((c) => c.files)),
    leaks,
    leftovers: left,
    layersAwaitingGc,
    nodeStopExit: stopCode,
    nodeDiedAlone,
    adoption: { restarts: restarts.length, adoptedPerRestart: restarts.map((r) => r.adopted), msFromNodeStart: stats(restarts.flatMap((r) => r.adoptMs)), nodeStartMs: stats(restarts.map((r) => r.startMs)) },
    startup: ADOPT > 0 ? {
      sandboxes: ADOPT,
      emptyMs: empty.map((r) => r.startMs),
      withSandboxesMs: withN.map((r) => r.startMs),
      adopted: withN.map((r) => r.adopted),
      deltaMs: withNP50! - emptyP50!,
      ratio: withNP50! / emptyP50!,
      reconcileMs: { empty: empty.map((r) => r.reconcileMs), withSandboxes: withN.map((r) => r.reconcileMs) },
      adoptMsFromNodeStart: stats(withN.flatMap((r) => r.adoptMs)),
    } : null,
    unavailable,
    perKill: kills.map((k) => ({ kind: k.kind, healthMs: k.healthMs, sandboxMs: k.sandboxMs, startMs: k.restart?.startMs ?? null, adopted: k.restart?.adopted ?? null, alive: k.alive })),
    ops: fin.ops,
    workloadKills: fin.workloadKills,
  };

  say("");
  say(`chaos: ${kills.length} kills (${KILL_KINDS.map((k) => `${k} ${byKind[k]}`).join(", ")}) over ${ms(chaosMs)}, seed ${SEED}, concurrency ${CONCURRENCY}`);
  say(`  node log (every start, pino JSON): ${NODE_LOG}; figures: ${join(OUT_DIR, "figures.json")}`);
  say(`  guests: tools drive ${figures.guest.tools}, base template snapshot ${figures.guest.baseSnapshot} (of ${TEST_HOME})`);
  say(`  ops: ${Object.entries(fin.ops as Record<string, { ok: number; failed: number }>).map(([k, v]) => `${k} ${v.ok}/${v.ok + v.failed}`).join(", ")} (ok/all; errors in --json); workload kills ${fin.workloadKills}`);
  say(`  checked ${figures.sandboxesChecked} sandboxes and ${figures.filesChecked} files over ${checks.length} checks`);
  say(`  sandboxes lost (not killed by the workload): ${figures.sandboxesLost}${figures.lost.length ? ` ${JSON.stringify(figures.lost)}` : ""}`);
  say(`  bytes lost of acknowledged writes: ${figures.bytesLost}; files that lost an acknowledged version ${figures.filesLost.length}${figures.filesLost.length ? ` ${JSON.stringify(figures.filesLost)}` : ""}; files not readable ${figures.unverifiedFiles.length}; snapshots lost ${figures.snapshotsLost.length}; strays killed ${figures.strays}`);
  say(`  leaks after the final stop: ${leaks.total} ${leaks.total ? JSON.stringify(left) : ""} (node exit ${stopCode}); layers of deleted snapshots inside gc_grace_secs ${layersAwaitingGc}`);
  if (nodeDiedAlone.length) say(`  the node died by itself ${nodeDiedAlone.length} times (exit codes ${nodeDiedAlone.join(", ")})`);
  for (const kind of KILL_KINDS) {
    const u = unavailable[kind]!;
    if (!u.health.n && !u.neverBack) continue;
    say(`  unavailable after a ${kind} kill: /health p50 ${ms(u.health.p50)} p95 ${ms(u.health.p95)} max ${ms(u.health.max)}; a sandbox p50 ${ms(u.sandbox.p50)} p95 ${ms(u.sandbox.p95)} max ${ms(u.sandbox.max)}; never back ${u.neverBack}`);
  }
  const ad = figures.adoption.msFromNodeStart;
  say(`  node restarts ${restarts.length}: start p50 ${ms(figures.adoption.nodeStartMs.p50)}; adoption done per sandbox (from node spawn) p50 ${ms(ad.p50)} p95 ${ms(ad.p95)} over ${ad.n}`);
  if (figures.startup) {
    const s = figures.startup;
    say(`  start-up after kill -9: with ${ADOPT} sandboxes to adopt p50 ${ms(withNP50)} vs none p50 ${ms(emptyP50)}: +${ms(s.deltaMs)} (x${s.ratio.toFixed(2)}); adoption per sandbox p50 ${ms(s.adoptMsFromNodeStart.p50)} p95 ${ms(s.adoptMsFromNodeStart.p95)}; adopted ${s.adopted.join(", ")}`);
  }
  const pass = figures.sandboxesLost === 0 && figures.bytesLost === 0 && figures.filesLost.length === 0 && leaks.total === 0 && (!figures.startup || figures.startup.deltaMs < 2000);
  say(`  done-when (0 lost, 0 bytes lost, 0 leaks${figures.startup ? ", start-up delta < 2 s" : ""}): ${pass ? "met" : "NOT met"}${kills.length < 50 ? ` (only ${kills.length} kills; it asks for >= 50)` : ""}`);
  writeFileSync(join(OUT_DIR, "figures.json"), `${JSON.stringify(figures, null, 2)}\n`);
  if (JSON_OUT) process.stdout.write(`${JSON.stringify(figures)}\n`);
  if (!pass) exitCode = 1;
} catch (e) {
  console.error(e);
  console.error(`node log tail:\n${world.log.slice(-4000)}\n(whole log: ${NODE_LOG})`);
  exitCode = 2;
} finally {
  workload?.kill();
  await world.dispose();
}
process.exit(exitCode);
