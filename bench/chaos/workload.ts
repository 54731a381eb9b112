#!/usr/bin/env bun
/**
 * The chaos bench's workload (bench/chaos.ts starts it inside the node's network namespace): the
 * unmodified e2b SDK driving the node at a given concurrency with creates, commands, writes of
 * random bytes (their sha256 kept in a FileLedger), pauses, snapshots, creates from a snapshot,
 * forks and kills, and the checks after each kill. It keeps its own account of what the node
 * acknowledged: the sandboxes it believes alive and the files each holds.
 *
 * Commands come as JSON lines on stdin, answers go as JSON lines on stdout (`ev` names them):
 *  - {cmd:"populate", n}        -> {ev:"populated", ids}: n sandboxes, one file each
 *  - {cmd:"verify"}             -> {ev:"verified", check}: quiesced check of everything
 *  - {cmd:"drain"}              -> {ev:"drained", killed}: kill every sandbox it made (not counted as workload kills)
 *  - {cmd:"run"}                -> {ev:"running"}: start the workers
 *  - {cmd:"killed", kind, at, sandboxId} -> {ev:"available", healthMs, sandboxMs} once GET /health
 *      and a call of a sandbox answer again (ms after `at`, epoch ms), then {ev:"checked", check}
 *      after a quiesced check; the workers go on after it
 *  - {cmd:"finish"}             -> {ev:"finished", check, ops, killedAtEnd}: stop, check, kill all,
 *      delete the snapshots it made; then it exits
 * Environment: E2B_API_URL, E2B_API_KEY (as for any SDK client), CHAOS_CONCURRENCY, CHAOS_SEED,
 * CHAOS_MAX_SANDBOXES, CHAOS_MAX_WRITE_KIB.
 */
import { createHash } from "node:crypto";
import { FileNotFoundError, Sandbox } from "e2b";
import { FileLedger, type FileVersion } from "./plan.ts";
import { rng } from "../../test/helpers/fuzz.ts";

const API = process.env.E2B_API_URL!;
const KEY = process.env.E2B_API_KEY!;
const CONCURRENCY = Number(process.env.CHAOS_CONCURRENCY ?? 4);
const MAX_SANDBOXES = Number(process.env.CHAOS_MAX_SANDBOXES ?? 8);
const MAX_WRITE = Number(process.env.CHAOS_MAX_WRITE_KIB ?? 256) * 1024;
const MAX_SNAPSHOTS = 3;
/** A sandbox's life (the workload kills them; they must not expire during a run). */
const LIFE_MS = 6 * 3600_000;
/** Bound of one SDK request; one of a dead node fails at once (connection refused or reset). */
const REQ = { requestTimeoutMs: 120_000 };
/** Bound of the wait for the API and a sandbox after a kill, and of one sandbox's check. */
const PROBE_BOUND_MS = 300_000;
const ANSWER_BOUND_MS = 180_000;
const rnd = rng(Number(process.env.CHAOS_SEED ?? 1) ^ 0x5eed);

const emit = (o: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(o)}\n`);
const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
const errName = (e: unknown) => (e instanceof Error ? `${e.name}: ${e.message}`.slice(0, 300) : String(e));

/** One sandbox the workload believes alive. */
interface Tracked {
  id: string;
  paused: boolean;
  files: FileLedger;
  /** An operation holds it (one at a time per sandbox). */
  busy: boolean;
  /** The API probe after a kill uses it: never killed meanwhile. */
  probing: boolean;
}

const alive = new Map<string, Tracked>();
/** Sandboxes whose kill got no answer: alive or not; the next check kills them again. */
const doubtful = new Set<string>();
/** Snapshots the node acknowledged, with the files their sandbox held. */
const snapshots = new Map<string, FileLedger>();
let baselineSnapshots = new Set<string>();
/** Per operation: how many succeeded and failed, and the first few distinct errors (for a reader of the figures). */
const ops: Record<string, { ok: number; failed: number; errors: string[] }> = {};
let workloadKills = 0;

function track(id: string, files = new FileLedger()): Tracked {
  const t: Tracked = { id, paused: false, files, busy: false, probing: false };
  alive.set(id, t);
  return t;
}

/** All pages of a paginator. */
async function all<T>(p: { hasNext: boolean; nextItems(): Promise<T[]> }): Promise<T[]> {
  const out: T[] = [];
  while (p.hasNext) out.push(...(await p.nextItems()));
  return out;
}

/** Random bytes of a random size (1 KiB .. MAX_WRITE). */
function randomBytes(): Uint8Array {
  const n = 1024 + Math.floor(rnd() * Math.max(1, MAX_WRITE - 1024));
  const b = new Uint8Array(n);
  crypto.getRandomValues(b.subarray(0, Math.min(n, 65536)));
  for (let o = 65536; o < n; o += 65536) b.set(b.subarray(0, Math.min(65536, n - o)), o);
  // the first 64 KiB repeat; make every run's bytes distinct anyway
  new DataView(b.buffer).setFloat64(0, rnd());
  return b;
}

async function connect(id: string): Promise<Sandbox> {
  return Sandbox.connect(id, { timeoutMs: LIFE_MS, ...REQ });
}

/** Write random bytes to one of a few paths of `t`; the ledger learns the outcome. */
async function writeFile(t: Tracked, s?: Sandbox): Promise<void> {
  const path = `/home/user/chaos-${Math.floor(rnd() * 4)}.bin`;
  const bytes = randomBytes();
  const v: FileVersion = { sha256: sha256(bytes), size: bytes.length };
  try {
    const sbx = s ?? (await connect(t.id));
    t.paused = false;
    await sbx.files.write(path, bytes.buffer as ArrayBuffer, REQ);
    t.files.acked(path, v, Date.now());
  } catch (e) {
    t.files.cut(path, v);
    throw e;
  }
}

/** Create a sandbox (of `template`, a template or a snapshot id) with `files` as its ledger. */
async function create(template = "base", files?: FileLedger): Promise<Tracked> {
  const s = await Sandbox.create(template, { timeoutMs: LIFE_MS, metadata: { chaos: "1" }, ...REQ });
  return track(s.sandboxId, files);
}

type Op = "create" | "command" | "write" | "pause" | "snapshot" | "fromSnapshot" | "fork" | "kill";

/** Pick an operation by weight among those the current state allows. */
function pickOp(free: Tracked[]): Op {
  const room = MAX_SANDBOXES - alive.size;
  const w: [Op, number][] = [
    ["create", room > 0 ? (alive.size < 2 ? 10 : 2) : 0],
    ["command", free.length ? 4 : 0],
    ["write", free.length ? 6 : 0],
    ["pause", free.some((t) => !t.paused) ? 1 : 0],
    ["snapshot", free.some((t) => !t.paused) ? 1 : 0],
    ["fromSnapshot", room > 0 && snapshots.size ? 0.7 : 0],
    ["fork", room > 1 && free.some((t) => !t.paused) ? 0.7 : 0],
    ["kill", alive.size > 2 && free.some((t) => !t.probing) ? 1 : 0],
  ];
  const total = w.reduce((s, [, x]) => s + x, 0);
  if (total === 0) return "command";
  let x = rnd() * total;
  return w.find(([, v]) => (x -= v) < 0)?.[0] ?? "command";
}

/** Run one operation; throws what the SDK threw. Returns false when there was nothing to do. */
async function runOp(op: Op, free: Tracked[]): Promise<boolean> {
  const pick = (f: (t: Tracked) => boolean) => {
    const c = free.filter(f);
    return c.length ? c[Math.floor(rnd() * c.length)]! : undefined;
  };
  if (op === "create") {
    await create();
    return true;
  }
  if (op === "fromSnapshot") {
    const ids = [...snapshots.keys()];
    const id = ids[Math.floor(rnd() * ids.length)]!;
    await create(id, snapshots.get(id)!.copy());
    return true;
  }
  const t = op === "kill" ? pick((t) => !t.probing) : op === "pause" || op === "snapshot" || op === "fork" ? pick((t) => !t.paused) : pick(() => true);
  if (!t) return false;
  t.busy = true;
  try {
    if (op === "command") {
      const s = await connect(t.id);
      t.paused = false;
      const [a, b] = [Math.floor(rnd() * 1000), Math.floor(rnd() * 1000)];
      const r = await s.commands.run(`echo $((${a}*${b}))`, { timeoutMs: 60_000, ...REQ });
      if (r.stdout.trim() !== String(a * b)) throw new Error(`command answered ${JSON.stringify(r.stdout)}, not ${a * b}`);
    } else if (op === "write") {
      await writeFile(t);
    } else if (op === "pause") {
      await Sandbox.pause(t.id, REQ);
      t.paused = true;
    } else if (op === "snapshot") {
      if (snapshots.size >= MAX_SNAPSHOTS) {
        const oldest = snapshots.keys().next().value!;
        // no longer expected from here: a delete cut by a kill may or may not have happened
        // (the final clean-up deletes it if it is still there)
        snapshots.delete(oldest);
        await Sandbox.deleteSnapshot(oldest, REQ);
      }
      const files = t.files.copy();
      const snap = await Sandbox.createSnapshot(t.id, REQ);
      snapshots.set(snap.snapshotId, files);
    } else if (op === "fork") {
      const files = t.files.copy();
      const r = await fetch(`${API}/sandboxes/${t.id}/fork`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-api-key": KEY },
        body: JSON.stringify({ count: 2, timeout: LIFE_MS / 1000 }),
        signal: AbortSignal.timeout(REQ.requestTimeoutMs),
      });
      if (r.status !== 201) throw new Error(`fork answered ${r.status}: ${(await r.text()).slice(0, 200)}`);
      const children = (await r.json()) as { sandbox?: { sandboxID: string }; error?: unknown }[];
      for (const c of children) if (c.sandbox) track(c.sandbox.sandboxID, files.copy());
      if (children.some((c) => !c.sandbox)) throw new Error(`a fork child failed: ${JSON.stringify(children.find((c) => !c.sandbox)?.error)}`);
    } else if (op === "kill") {
      alive.delete(t.id);
      doubtful.add(t.id);
      await Sandbox.kill(t.id, REQ);
      doubtful.delete(t.id);
      workloadKills++;
    }
  } finally {
    t.busy = false;
  }
  return true;
}

// ---- workers, quiescing ----

let running = false;
let quiesced = false;
let stopping = false;
let gate: { promise: Promise<void>; open: () => void } | undefined;
let parked = 0;
const workers: Promise<void>[] = [];

async function worker(): Promise<void> {
  while (!stopping) {
    if (quiesced) {
      parked++;
      await gate!.promise;
      parked--;
      continue;
    }
    const free = [...alive.values()].filter((t) => !t.busy);
    const op = pickOp(free);
    const tally = (ops[op] ??= { ok: 0, failed: 0, errors: [] });
    try {
      if (await runOp(op, free)) tally.ok++;
      else await Bun.sleep(100);
    } catch (e) {
      tally.failed++;
      const why = errName(e);
      if (tally.errors.length < 5 && !tally.errors.includes(why)) tally.errors.push(why);
      // a dead node refuses at once: do not spin
      await Bun.sleep(250 + rnd() * 500);
    }
  }
}

/** Stop the workers taking new operations and wait until each has ended its current one. */
async function quiesce(): Promise<void> {
  if (!running || quiesced) return;
  let open!: () => void;
  gate = { promise: new Promise<void>((r) => (open = r)), open: () => open() };
  quiesced = true;
  const deadline = Date.now() + 10 * REQ.requestTimeoutMs;
  while (parked < workers.length && Date.now() < deadline) await Bun.sleep(50);
  if (parked < workers.length) throw new Error(`workers still busy after ${10 * REQ.requestTimeoutMs} ms`);
}

function unquiesce(): void {
  if (!quiesced) return;
  quiesced = false;
  gate!.open();
}

// ---- checks ----

/** What a quiesced check found. */
interface CheckResult {
  sandboxes: number;
  files: number;
  lost: { id: string; why: string }[];
  bytesLost: number;
  /** Files that lost an acknowledged version: gone, or holding an older version or foreign content; when that version was acknowledged (epoch ms). */
  wrong: { id: string; path: string; found: string; bytes: number; ackedAt: number }[];
  unverified: { id: string; path: string; why: string }[];
  snapshotsLost: string[];
  /** Listed sandboxes the workload did not know (a create or fork whose answer the kill cut): killed. */
  strays: number;
  /** Sandboxes whose kill was cut, found still listed: killed again. */
  doubtfulKilled: number;
  ms: number;
}

/** Whether sandbox `id` answers: connected under the same id and a command runs. Null when it does, else why not. */
async function answers(id: string): Promise<{ sbx: Sandbox } | { why: string }> {
  const deadline = Date.now() + ANSWER_BOUND_MS;
  let why = "";
  while (Date.now() < deadline) {
    try {
      const s = await connect(id);
      if (s.sandboxId !== id) return { why: `connect answered as ${s.sandboxId}` };
      const r = await s.commands.run("echo alive", { timeoutMs: 30_000, ...REQ });
      if (r.stdout.trim() === "alive") return { sbx: s };
      why = `a command answered ${JSON.stringify(r.stdout)}`;
    } catch (e) {
      why = errName(e);
    }
    await Bun.sleep(2000);
  }
  return { why };
}

/** Run `f` over `xs` with at most CONCURRENCY at a time. */
async function pool<T>(xs: T[], f: (x: T) => Promise<void>): Promise<void> {
  const q = [...xs];
  await Promise.all(Array.from({ length: Math.min(CONCURRENCY, q.length) }, async () => {
    for (let x = q.shift(); x !== undefined; x = q.shift()) await f(x);
  }));
}

/** Check every sandbox believed alive (it answers, same id) and every file written to it (sha256). */
async function check(): Promise<CheckResult> {
  const t0 = Date.now();
  const r: CheckResult = { sandboxes: 0, files: 0, lost: [], bytesLost: 0, wrong: [], unverified: [], snapshotsLost: [], strays: 0, doubtfulKilled: 0, ms: 0 };
  await pool([...alive.values()], async (t) => {
    const a = await answers(t.id);
    if ("why" in a) {
      r.lost.push({ id: t.id, why: a.why });
      alive.delete(t.id);
      return;
    }
    r.sandboxes++;
    t.paused = false;
    for (const path of t.files.paths()) {
      let seen: FileVersion | null;
      try {
        const b = await a.sbx.files.read(path, { format: "bytes", ...REQ });
        seen = { sha256: sha256(b), size: b.length };
      } catch (e) {
        if (!(e instanceof FileNotFoundError)) {
          r.unverified.push({ id: t.id, path, why: errName(e) });
          continue;
        }
        seen = null;
      }
      r.files++;
      const v = t.files.observe(path, seen);
      r.bytesLost += v.bytesLost;
      if (!v.ok) r.wrong.push({ id: t.id, path, found: v.found!, bytes: v.bytesLost, ackedAt: v.ackedAt! });
    }
  });
  const listed = await all(Sandbox.list({ query: { state: ["running", "paused"] }, limit: 100, ...REQ }));
  for (const s of listed) {
    if (alive.has(s.sandboxId)) continue;
    const was = doubtful.has(s.sandboxId);
    try {
      await Sandbox.kill(s.sandboxId, REQ);
      if (was) r.doubtfulKilled++;
      else r.strays++;
    } catch {
      // counted at the next check
    }
  }
  doubtful.clear();
  const snaps = new Set((await all(Sandbox.listSnapshots({ limit: 100, ...REQ }))).map((s) => s.snapshotId));
  for (const id of snapshots.keys()) {
    if (!snaps.has(id)) {
      r.snapshotsLost.push(id);
      snapshots.delete(id);
    }
  }
  r.ms = Date.now() - t0;
  return r;
}

/** Poll until `ok` resolves true; ms from `at` (epoch ms) to that moment, null when the bound passed. */
async function until(at: number, ok: () => Promise<boolean>, everyMs: number): Promise<number | null> {
  while (Date.now() - at < PROBE_BOUND_MS) {
    if (await ok().catch(() => false)) return Date.now() - at;
    await Bun.sleep(everyMs);
  }
  return null;
}

/** After a kill: when the API and a sandbox answer again, then a quiesced check. */
async function afterKill(m: { kind: string; at: number; sandboxId?: string }): Promise<void> {
  const target = (m.sandboxId && alive.get(m.sandboxId)) || [...alive.values()][Math.floor(rnd() * alive.size)];
  if (target) target.probing = true;
  const [healthMs, sandboxMs] = await Promise.all([
    until(m.at, async () => (await fetch(`${API}/health`, { signal: AbortSignal.timeout(5000) })).status === 200, 50),
    target
      ? until(
          m.at,
          async () => {
            const s = await Sandbox.connect(target.id, { timeoutMs: LIFE_MS, requestTimeoutMs: 10_000 });
            return (await s.commands.run("true", { timeoutMs: 20_000, requestTimeoutMs: 20_000 })).exitCode === 0;
          },
          200,
        )
      : null,
  ]);
  if (target) target.probing = false;
  emit({ ev: "available", kind: m.kind, healthMs, sandboxMs, probed: target?.id ?? null });
  await quiesce();
  const c = await check();
  emit({ ev: "checked", check: c, alive: alive.size });
  unquiesce();
}

// ---- commands ----

async function handle(m: Record<string, any>): Promise<void> {
  if (m.cmd === "populate") {
    const ids: string[] = [];
    await pool(Array.from({ length: m.n as number }, (_, i) => i), async () => {
      const t = await create();
      await writeFile(t);
      ids.push(t.id);
    });
    emit({ ev: "populated", ids });
  } else if (m.cmd === "verify") {
    emit({ ev: "verified", check: await check() });
  } else if (m.cmd === "drain") {
    const ids = [...alive.keys()];
    await pool(ids, async (id) => {
      await Sandbox.kill(id, REQ);
      alive.delete(id);
    });
    emit({ ev: "drained", killed: ids.length });
  } else if (m.cmd === "run") {
    baselineSnapshots = new Set((await all(Sandbox.listSnapshots({ limit: 100, ...REQ }))).map((s) => s.snapshotId));
    running = true;
    for (let i = 0; i < CONCURRENCY; i++) workers.push(worker());
    emit({ ev: "running" });
  } else if (m.cmd === "killed") {
    await afterKill(m as { kind: string; at: number; sandboxId?: string });
  } else if (m.cmd === "finish") {
    await quiesce();
    const c = await check();
    stopping = true;
    unquiesce();
    await Promise.all(workers);
    const ids = [...alive.keys()];
    await pool(ids, async (id) => {
      await Sandbox.kill(id, REQ);
    });
    // what the check's kills missed, and every snapshot made during the run
    for (const s of await all(Sandbox.list({ query: { state: ["running", "paused"] }, limit: 100, ...REQ }))) await Sandbox.kill(s.sandboxId, REQ);
    for (const s of await all(Sandbox.listSnapshots({ limit: 100, ...REQ }))) if (!baselineSnapshots.has(s.snapshotId)) await Sandbox.deleteSnapshot(s.snapshotId, REQ);
    emit({ ev: "finished", check: c, ops, workloadKills, killedAtEnd: ids.length });
    process.exit(0);
  } else throw new Error(`unknown command ${JSON.stringify(m)}`);
}

let buf = "";
for await (const chunk of Bun.stdin.stream()) {
  buf += new TextDecoder().decode(chunk);
  for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    if (!line.trim()) continue;
    try {
      await handle(JSON.parse(line));
    } catch (e) {
      emit({ ev: "error", error: errName(e), stack: e instanceof Error ? e.stack : undefined });
    }
  }
}
