/**
 * SchedulerStore in Redis (Bun's built-in RedisClient), for several scheduler replicas sharing
 * bindings. Layout under the configured prefix P:
 *   P b:<sandboxId>   string, JSON {n: nodeId, e: endpoint, t: updatedAt ms, h: held (absent: true)}
 *   P n:<nodeId>      set of the sandbox ids bound to that node
 *   P nodes           set of node ids that have a P n:<nodeId> set
 *   P reports         hash nodeId -> JSON {node: ObservedNode JSON, p2p: P2pEndpoint JSON | null,
 *                     left: unix ms of its UnregisterNode | null}
 * Every change touching more than one key runs as one Lua script (atomic on the server).
 * Keys are built inside the scripts, so the store needs a single Redis, not Redis Cluster.
 */
import { Type as T } from "@sinclair/typebox";
import { RedisClient } from "bun";
import { ObservedNode, P2pEndpoint } from "../../../src/cluster/index.ts";
import { describeProblem, jsonSchema } from "../../../src/util/json-check.ts";
import { redactUrl } from "../../../src/util/proxy.ts";
import { SchedulerError } from "../errors.ts";
import type { Binding, NodeReport } from "../types.ts";
import type { RosterChange, SchedulerStore } from "./types.ts";
import { errorMessage } from "../../../src/util/error.ts";

// ARGV[1] = prefix, then per script
// ARGV: prefix, sandboxId, nodeId, endpoint, updatedAt, held ('1' | '0'), mode ('put' | 'claim'
// | 'move'), fromNodeId (move). A binding staying on its node keeps held; claim leaves a binding
// another node holds; move replaces only a binding naming fromNodeId. Answer: 1 when written.
const WRITE = `
local p, mode = ARGV[1], ARGV[7]
local key = p .. 'b:' .. ARGV[2]
local held = ARGV[6] == '1'
local old = redis.call('GET', key)
if old then
  local o = cjson.decode(old)
  local oheld = o.h ~= false
  if mode == 'claim' and o.n ~= ARGV[3] and oheld then return 0 end
  if mode == 'move' and o.n ~= ARGV[8] then return 0 end
  if o.n ~= ARGV[3] then redis.call('SREM', p .. 'n:' .. o.n, ARGV[2]) elseif oheld then held = true end
elseif mode == 'move' then
  return 0
end
redis.call('SET', key, cjson.encode({n = ARGV[3], e = ARGV[4], t = tonumber(ARGV[5]), h = held}))
redis.call('SADD', p .. 'n:' .. ARGV[3], ARGV[2])
redis.call('SADD', p .. 'nodes', ARGV[3])
return 1`;

const DEL = `
local p = ARGV[1]
local key = p .. 'b:' .. ARGV[2]
local old = redis.call('GET', key)
if not old then return 0 end
local o = cjson.decode(old)
if ARGV[3] ~= '' and o.n ~= ARGV[3] then return 0 end
redis.call('DEL', key)
redis.call('SREM', p .. 'n:' .. o.n, ARGV[2])
return 1`;

// ARGV: prefix, nodeId, endpoint, now, staleBefore, ids...
const ROSTER = `
local p = ARGV[1]
local node, ep, now, stale = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local nset = p .. 'n:' .. node
local listed = {}
local added = 0
local foreign = {}
for i = 6, #ARGV do
  local id = ARGV[i]
  listed[id] = true
  local key = p .. 'b:' .. id
  local old = redis.call('GET', key)
  local mine = true
  if old then
    local o = cjson.decode(old)
    if o.n ~= node then
      -- moved to another node while this one was away: that node's, once it holds it
      mine = false
      if o.h ~= false then foreign[#foreign + 1] = id end
    end
  else
    added = added + 1
  end
  if mine then
    redis.call('SET', key, cjson.encode({n = node, e = ep, t = now, h = true}))
    redis.call('SADD', nset, id)
  end
end
redis.call('SADD', p .. 'nodes', node)
local removed = 0
for _, id in ipairs(redis.call('SMEMBERS', nset)) do
  if not listed[id] then
    local key = p .. 'b:' .. id
    local old = redis.call('GET', key)
    if not old then
      redis.call('SREM', nset, id)
    else
      local o = cjson.decode(old)
      if o.n ~= node then
        redis.call('SREM', nset, id)
      elseif o.t < stale then
        redis.call('DEL', key)
        redis.call('SREM', nset, id)
        removed = removed + 1
      end
    end
  end
end
return {added, removed, foreign}`;

const DROP = `
local p = ARGV[1]
local nset = p .. 'n:' .. ARGV[2]
local n = 0
for _, id in ipairs(redis.call('SMEMBERS', nset)) do
  local key = p .. 'b:' .. id
  local old = redis.call('GET', key)
  if old and cjson.decode(old).n == ARGV[2] then redis.call('DEL', key); n = n + 1 end
end
redis.call('DEL', nset)
redis.call('SREM', p .. 'nodes', ARGV[2])
return n`;

const COUNT = `
local p = ARGV[1]
local n = 0
for _, node in ipairs(redis.call('SMEMBERS', p .. 'nodes')) do n = n + redis.call('SCARD', p .. 'n:' .. node) end
return n`;

/** SchedulerStore over one Redis server (layout above); safe to share between scheduler replicas. */
export class RedisStore implements SchedulerStore {
  readonly kind = "redis" as const;
  private readonly client: RedisClient;

  /**
   * @param url redis://[user:password@]host:port[/db]
   * @param prefix prefix of every key (e.g. `agentenv:scheduler:`)
   * @param connectTimeoutMs bound on connecting, ms (`[scheduler] redis_connect_timeout_ms`)
   * Connects lazily (and again after a lost connection, at the next command); a command fails
   * with `scheduler.store_failed` while the server is unreachable.
   */
  constructor(private readonly url: string, private readonly prefix: string, connectTimeoutMs: number) {
    this.client = new RedisClient(url, { autoReconnect: false, enableOfflineQueue: false, connectionTimeout: connectTimeoutMs });
  }

  /** Check the server answers. @throws SchedulerError store_failed */
  async ping(): Promise<void> {
    await this.run("ping", () => this.client.send("PING", []));
  }

  private async run<T>(what: string, fn: () => Promise<T>): Promise<T> {
    try {
      // commands are not queued while disconnected (a scheduler RPC fails fast instead)
      if (!this.client.connected) await this.client.connect();
      return await fn();
    } catch (e) {
      throw new SchedulerError("scheduler.store_failed", `scheduler Redis store ${redactUrl(this.url)}: ${what} failed: ${errorMessage(e)}`, { url: redactUrl(this.url) }, { cause: e });
    }
  }

  private eval(script: string, args: (string | number)[]): Promise<unknown> {
    return this.client.send("EVAL", [script, "0", this.prefix, ...args.map(String)]);
  }

  async getBinding(sandboxId: string): Promise<Binding | null> {
    return this.run("lookup", async () => {
      const raw = await this.client.get(this.prefix + "b:" + sandboxId);
      if (raw === null) return null;
      const r = STORED.binding.parse(raw);
      if (!r.ok) throw new Error(`corrupt binding of ${sandboxId} (${describeProblem(r.problem)}): ${raw.slice(0, 200)}`);
      return { sandboxId, nodeId: r.value.n, endpoint: r.value.e, updatedAt: r.value.t, held: r.value.h !== false };
    });
  }

  private write(mode: "put" | "claim" | "move", b: Binding, from = ""): Promise<unknown> {
    return this.eval(WRITE, [b.sandboxId, b.nodeId, b.endpoint, b.updatedAt, b.held ? "1" : "0", mode, from]);
  }

  async putBinding(b: Binding): Promise<void> {
    await this.run("record", () => this.write("put", b));
  }

  async claimBinding(b: Binding): Promise<boolean> {
    return (await this.run("claim", () => this.write("claim", b))) === 1;
  }

  async moveBinding(fromNodeId: string, to: Binding): Promise<Binding | null> {
    await this.run("move", () => this.write("move", to, fromNodeId));
    return this.getBinding(to.sandboxId);
  }

  async deleteBinding(sandboxId: string, nodeId?: string): Promise<boolean> {
    return (await this.run("delete", () => this.eval(DEL, [sandboxId, nodeId ?? ""]))) === 1;
  }

  async reconcileRoster(nodeId: string, endpoint: string, roster: string[], now: number, staleBefore: number): Promise<RosterChange> {
    return this.run("roster reconcile", async () => rosterAnswer(await this.eval(ROSTER, [nodeId, endpoint, now, staleBefore, ...roster])));
  }

  async dropNodeBindings(nodeId: string): Promise<number> {
    return this.run("node drop", async () => counts(await this.eval(DROP, [nodeId]), 1)[0]!);
  }

  async nodeBindings(nodeId: string): Promise<string[]> {
    return (await this.run("node bindings", () => this.client.smembers(this.prefix + "n:" + nodeId))).sort();
  }

  async countBindings(): Promise<number> {
    return this.run("count", async () => counts(await this.eval(COUNT, []), 1)[0]!);
  }

  async putReport(r: NodeReport): Promise<void> {
    const value = JSON.stringify({ node: ObservedNode.toJSON(r.node), p2p: r.p2p ? P2pEndpoint.toJSON(r.p2p) : null, left: r.leftAtUnixMs });
    await this.run("report write", () => this.client.hset(this.prefix + "reports", { [r.node.nodeId]: value }));
  }

  async getReport(nodeId: string): Promise<NodeReport | null> {
    return this.run("report read", async () => {
      const raw = await this.client.hget(this.prefix + "reports", nodeId);
      return raw === null ? null : parseReport(raw);
    });
  }

  async listReports(): Promise<NodeReport[]> {
    return this.run("report list", async () => {
      const all = await this.client.hgetall(this.prefix + "reports");
      return Object.keys(all)
        .sort()
        .map((k) => parseReport(all[k]!));
    });
  }

  async deleteReport(nodeId: string): Promise<void> {
    await this.run("report delete", () => this.client.hdel(this.prefix + "reports", nodeId));
  }

  async close(): Promise<void> {
    this.client.close();
  }
}

/** What the store keeps as JSON (written by any replica: read back checked). */
const STORED = {
  binding: jsonSchema(T.Object({ n: T.String(), e: T.String(), t: T.Number(), h: T.Optional(T.Boolean()) })),
  report: jsonSchema(T.Object({ node: T.Record(T.String(), T.Unknown()), p2p: T.Union([T.Null(), T.Record(T.String(), T.Unknown())]), left: T.Optional(T.Union([T.Null(), T.Number()])) })),
};

/** A node report as stored. @throws Error naming what is wrong (run() makes it store_failed). */
function parseReport(raw: string): NodeReport {
  const r = STORED.report.parse(raw);
  if (!r.ok) throw new Error(`corrupt node report (${describeProblem(r.problem)}): ${raw.slice(0, 200)}`);
  const o = r.value;
  return { node: ObservedNode.fromJSON(o.node), p2p: o.p2p ? P2pEndpoint.fromJSON(o.p2p) : null, leftAtUnixMs: o.left ?? null };
}

/** The ROSTER script's answer: {added, removed, {foreign ids}} (an empty Lua table may come back as an empty list or nothing). @throws Error for anything else. */
function rosterAnswer(v: unknown): RosterChange {
  const list = Array.isArray(v) ? v : [];
  const [added, removed, foreign = []] = list as [unknown, unknown, unknown];
  if (!Number.isInteger(added) || !Number.isInteger(removed) || !Array.isArray(foreign) || !foreign.every((x) => typeof x === "string")) throw new Error(`unexpected roster script answer ${JSON.stringify(v)?.slice(0, 200)}`);
  return { added: added as number, removed: removed as number, foreign: foreign as string[] };
}

/** A script's answer: `n` integers (one alone may come as a plain integer). @throws Error for anything else. */
function counts(v: unknown, n: number): number[] {
  const list = Array.isArray(v) ? v : [v];
  if (list.length !== n || !list.every((x) => Number.isInteger(x))) throw new Error(`unexpected script answer ${JSON.stringify(v)?.slice(0, 200)}`);
  return list as number[];
}

