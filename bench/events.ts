/**
 * Lifecycle events and webhooks benchmark (issue 29): does a dead webhook receiver slow the API
 * or grow the node's memory? Real parts: a node in this process (API, orchestrator, SQLite WAL,
 * event recorder, delivery lanes) whose sandboxes are loopback guests (no VMs), and receivers
 * that are dead in the two ways a receiver dies: a closed port (every delivery refused at once,
 * retried with backoff) and a black hole (a listener that accepts and never answers: every
 * delivery holds a connection until [events] webhook_timeout_ms).
 *
 * Workload: `POST /sandboxes/{id}/timeout` over 10 sandboxes, each call one `updated` event (the
 * event is recorded, and queued for the webhook, before the API answers). Three variants in the
 * same run, interleaved in batches of 50 calls (rotating) so the load of a shared machine hits all
 * alike: no webhook (baseline), a webhook to a refused port, a webhook to a black hole (registered
 * before its batch, deleted after); each variant records EVENTS events. Prints the API
 * latency of each variant (median, p95) as ratios to the baseline, and the node's memory (RSS
 * and JS heap after a full GC) before and after each variant, with the webhooks' queue depths.
 * Usage: bun bench/events.ts [--events N] [--rounds R]   (default R: batches of 50)
 */
import "./quiet-logs.ts";
import type { Socket } from "bun";

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const EVENTS = arg("events", 1000);
const ROUNDS = arg("rounds", Math.ceil(arg("events", 1000) / 50));
const SANDBOXES = 10;

const { startNodeNoVm, api } = await import("../test/api/helpers.ts");

const node = await startNodeNoVm({}, undefined, { templates: ["base"] });
const ids: string[] = [];
for (let i = 0; i < SANDBOXES; i++) {
  const r = await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", timeout: 3600 }) });
  ids.push(((await r.json()) as { sandboxID: string }).sandboxID);
}

// a black hole: accepts, reads, never answers
const held = new Set<Socket<undefined>>();
const hole = Bun.listen<undefined>({ hostname: "127.0.0.1", port: 0, socket: { open: (s) => void held.add(s), data() {}, close: (s) => void held.delete(s) } });
// a closed port: bound once, released
const probe = Bun.listen<undefined>({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
const refusedPort = probe.port;
probe.stop(true);

const MiB = 1024 * 1024;
function memory(): { rssMiB: number; heapMiB: number } {
  Bun.gc(true);
  return { rssMiB: process.memoryUsage().rss / MiB, heapMiB: process.memoryUsage().heapUsed / MiB };
}

async function register(url: string): Promise<string> {
  const r = await api(node, "/events/webhooks", { method: "POST", body: JSON.stringify({ name: "bench", url, events: ["sandbox.lifecycle.updated"], signatureSecret: "bench" }) });
  if (r.status !== 201) throw new Error(`webhook registration: ${r.status} ${await r.text()}`);
  return ((await r.json()) as { id: string }).id;
}

type Variant = "none" | "refused" | "blackhole";
const samples: Record<Variant, number[]> = { none: [], refused: [], blackhole: [] };
const mem: Record<Variant, { before: ReturnType<typeof memory>; after: ReturnType<typeof memory> } | undefined> = { none: undefined, refused: undefined, blackhole: undefined };
const hooks: Partial<Record<Variant, string>> = {};

async function round(v: Variant, n: number): Promise<void> {
  if (v !== "none") hooks[v] = await register(v === "refused" ? `http://127.0.0.1:${refusedPort}/hook` : `http://127.0.0.1:${hole.port}/hook`);
  for (let i = 0; i < n; i++) {
    const id = ids[i % ids.length]!;
    const t0 = performance.now();
    const r = await api(node, `/sandboxes/${id}/timeout`, { method: "POST", body: JSON.stringify({ timeout: 3600 + (i % 7) }) });
    samples[v].push(performance.now() - t0);
    if (r.status !== 204) throw new Error(`timeout: ${r.status} ${await r.text()}`);
  }
  // each variant runs alone: its webhook goes before the next variant's round
  if (v !== "none") {
    const r = await api(node, `/events/webhooks/${hooks[v]}`, { method: "DELETE" });
    if (r.status !== 200) throw new Error(`delete: ${r.status}`);
  }
}

// warm-up (JIT, SQLite caches), not counted
for (let i = 0; i < 200; i++) await api(node, `/sandboxes/${ids[i % ids.length]}/timeout`, { method: "POST", body: JSON.stringify({ timeout: 3600 }) });

const per = Math.ceil(EVENTS / ROUNDS);
for (let r = 0; r < ROUNDS; r++) {
  // each round's variants in a rotated order, so no variant always follows the same one
  const order: Variant[] = ["none", "refused", "blackhole"];
  for (const v of [...order.slice(r % 3), ...order.slice(0, r % 3)]) {
    const before = r === 0 ? memory() : mem[v]!.before;
    await round(v, per);
    mem[v] = { before, after: r === ROUNDS - 1 ? memory() : before };
  }
}

// a dead receiver kept for the whole run: the queue and memory after EVENTS events
const kept = await register(`http://127.0.0.1:${hole.port}/hook`);
const m0 = memory();
for (let i = 0; i < EVENTS; i++) await api(node, `/sandboxes/${ids[i % ids.length]}/timeout`, { method: "POST", body: JSON.stringify({ timeout: 3600 }) });
const m1 = memory();
const queued = node.events.dispatcher.depth(kept);
const attempts = node.db.sqlite.query<{ n: number }, [string]>("SELECT count(*) AS n FROM webhook_attempts WHERE webhook_id = ?").get(kept)!.n;

const q = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
};
const fmt = (x: number) => x.toFixed(3);
console.log(`events bench: ${ROUNDS} interleaved rounds, ${per * ROUNDS} API calls (= events) per variant, ${SANDBOXES} sandboxes`);
for (const v of ["none", "refused", "blackhole"] as Variant[]) {
  const med = q(samples[v], 0.5);
  const p95 = q(samples[v], 0.95);
  const base = { med: q(samples.none, 0.5), p95: q(samples.none, 0.95) };
  console.log(
    `  ${v.padEnd(9)} median ${fmt(med)} ms (x${(med / base.med).toFixed(3)})  p95 ${fmt(p95)} ms (x${(p95 / base.p95).toFixed(3)})  ` +
      `rss ${mem[v]!.before.rssMiB.toFixed(1)} -> ${mem[v]!.after.rssMiB.toFixed(1)} MiB, heap ${mem[v]!.before.heapMiB.toFixed(1)} -> ${mem[v]!.after.heapMiB.toFixed(1)} MiB`,
  );
}
console.log(`  a black-hole webhook kept through ${EVENTS} more events: ${queued} queued on disk, ${attempts} delivery attempts logged, ` + `rss ${m0.rssMiB.toFixed(1)} -> ${m1.rssMiB.toFixed(1)} MiB, heap ${m0.heapMiB.toFixed(1)} -> ${m1.heapMiB.toFixed(1)} MiB`);

for (const s of held) s.end();
hole.stop(true);
for (const id of ids) await api(node, `/sandboxes/${id}`, { method: "DELETE" });
await node.dispose();
process.exit(0);
