/**
 * Every node holds every webhook registered through the gateway (issue 29: one registration
 * reaches every node), also a node that joins after the registration or comes back after being
 * away. A round every `intervalMs` takes the scheduler's list of live nodes and brings each one
 * up to the registry (webhook-registry.ts):
 * - a node the gateway has not seen live in the previous round (new, back from UNHEALTHY, or any
 *   node after a gateway restart), and every node once per `fullCheckMs`, is checked in full: its
 *   `GET /events/webhooks`, then every registration is PUT to it (same id, same body) unless it
 *   holds it as the gateway last gave it, and every tombstoned webhook it holds is deleted;
 * - otherwise only what changed since the gateway last reached it: a registration whose version
 *   it has not had is PUT, a delete it missed is sent (404 counts as done).
 * What a node did not take (unreachable, an error answer) is tried again the next round. The
 * client's own writes (`POST/PUT/PATCH/DELETE /events/webhooks...`, events.ts) run through
 * `exclusive` with the rounds, one at a time, so a round never sends an older body after a
 * newer one reached a node; they record what each node took, so a round does not send it again.
 */
import type { Logger } from "pino";
import { Type as T } from "@sinclair/typebox";
import { errorMessage } from "../../src/util/error.ts";
import { jsonSchema } from "../../src/util/json-check.ts";
import type { NodeRef } from "../../src/cluster/index.ts";
import type { FanOut } from "./aggregate.ts";
import { callJson, checkAnswer } from "./forward.ts";
import type { WebhookRegistry } from "./webhook-registry.ts";

/** The ids of a node's webhooks (`GET /events/webhooks`; other fields pass unread). */
const HELD = jsonSchema(T.Array(T.Object({ id: T.String() })));

/** Timing of the rounds (`[gateway] webhook_sync_interval_ms`, `webhook_full_check_ms`). */
export interface WebhookSyncOptions {
  /** Pause between rounds, ms. */
  intervalMs: number;
  /** Longest time between two full checks of a node, ms. */
  fullCheckMs: number;
}

/** The sync loop of one gateway; `start()` it, `stop()` it on shutdown. */
export class WebhookSync {
  /** Per live node: webhook id -> the registry version (registration or tombstone) it has taken. */
  private readonly taken = new Map<string, Map<string, number>>();
  /** Per live node: when it was last checked in full (performance.now() ms). */
  private readonly checkedAt = new Map<string, number>();
  /** Failures already logged (node, webhook, version): each is logged once. */
  private readonly warned = new Set<string>();
  private tail: Promise<unknown> = Promise.resolve();
  private timer: ReturnType<typeof setTimeout> | null = null;
  private stopped = false;

  constructor(
    private readonly registry: WebhookRegistry,
    private readonly fan: () => Promise<FanOut>,
    private readonly o: WebhookSyncOptions,
    private readonly log: Logger,
  ) {}

  /** Start the rounds (the first at once). */
  start(): void {
    if (this.stopped || this.timer) return;
    const next = () => {
      if (this.stopped) return;
      this.timer = setTimeout(() => void this.exclusive(() => this.round()).finally(next), this.o.intervalMs);
      this.timer.unref?.();
    };
    void this.exclusive(() => this.round()).finally(next);
  }

  /** Stop the rounds; resolves when the one running (or a client write) is over. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.tail.catch(() => {});
  }

  /** Run `fn` when no round and no other write runs (in call order). */
  exclusive<R>(fn: () => Promise<R>): Promise<R> {
    const run = this.tail.then(fn, fn);
    this.tail = run.catch(() => {});
    return run;
  }

  /** Node `nodeId` took version `version` of webhook `id` (a client write it answered with success). */
  took(nodeId: string, id: string, version: number): void {
    this.taken.get(nodeId)?.set(id, version);
  }

  /**
   * One round over the live nodes. Nothing to do, and no node or scheduler asked: while nothing
   * was ever registered here, and without a node list (the scheduler down with none known).
   */
  async round(): Promise<void> {
    if (this.registry.list().length === 0 && this.registry.deleted().length === 0) return;
    let f: FanOut;
    try {
      f = await this.fan();
    } catch (e) {
      this.log.debug({ err: errorMessage(e) }, "webhook sync: no node list");
      return;
    }
    const live = new Set(f.nodes.live.map((n) => n.nodeId));
    // a node that left is checked in full when it is back
    for (const id of [...this.taken.keys()]) {
      if (live.has(id)) continue;
      this.taken.delete(id);
      this.checkedAt.delete(id);
    }
    await Promise.all(f.nodes.live.map((n) => this.syncNode(f, n)));
  }

  private async syncNode(f: FanOut, node: NodeRef): Promise<void> {
    const call = (method: string, path: string, body?: unknown) => callJson(node, method, path, body, f.apiKey, f.timeoutMs, f.maxBytes);
    const registrations = this.registry.list();
    const tombstones = this.registry.deleted();
    let taken = this.taken.get(node.nodeId);
    try {
      const due = performance.now() - (this.checkedAt.get(node.nodeId) ?? -Infinity) >= this.o.fullCheckMs;
      if (!taken || due) {
        const r = await call("GET", "/events/webhooks");
        if (r.status !== 200) throw new Error(`GET /events/webhooks answered HTTP ${r.status}`);
        const held = new Set(checkAnswer(node, r.body, "/events/webhooks", r.status, HELD).map((w) => w.id));
        const before = taken;
        taken = new Map();
        // what it holds as the gateway last gave it stays; every other registration is sent again
        for (const w of registrations) if (held.has(w.id) && before?.get(w.id) === w.version) taken.set(w.id, w.version);
        for (const t of tombstones) if (!held.has(t.id)) taken.set(t.id, t.version);
        this.taken.set(node.nodeId, taken);
        this.checkedAt.set(node.nodeId, performance.now());
        this.warned.delete(`${node.nodeId} list 0`);
      }
    } catch (e) {
      this.warnOnce(node, "list", 0, `webhook sync: node ${node.nodeId} not checked: ${errorMessage(e)}`);
      return;
    }
    for (const w of registrations) {
      if (taken.get(w.id) === w.version) continue;
      await this.send(node, w.id, w.version, () => call("PUT", `/events/webhooks/${w.id}`, w.body), (s) => s === 200 || s === 201, taken);
    }
    for (const t of tombstones) {
      if (taken.get(t.id) === t.version) continue;
      await this.send(node, t.id, t.version, () => call("DELETE", `/events/webhooks/${t.id}`), (s) => s === 200 || s === 404, taken);
    }
  }

  /** Send one change to `node`; record it as taken when `done(status)`. Failures are logged once and tried again next round. */
  private async send(node: NodeRef, id: string, version: number, req: () => Promise<{ status: number; body: unknown }>, done: (status: number) => boolean, taken: Map<string, number>): Promise<void> {
    try {
      const r = await req();
      if (!done(r.status)) throw new Error(`answered HTTP ${r.status}: ${JSON.stringify(r.body).slice(0, 300)}`);
      taken.set(id, version);
      this.log.info({ nodeId: node.nodeId, webhookId: id, version }, "webhook sync: node brought up to date");
    } catch (e) {
      this.warnOnce(node, id, version, `webhook sync: webhook ${id} not brought to node ${node.nodeId}: ${errorMessage(e)}`);
    }
  }

  private warnOnce(node: NodeRef, id: string, version: number, msg: string): void {
    const key = `${node.nodeId} ${id} ${version}`;
    if (this.warned.has(key)) return;
    // bounded: the set is forgotten whole once it is large (a failure may then be logged again)
    if (this.warned.size >= 10_000) this.warned.clear();
    this.warned.add(key);
    this.log.warn({ nodeId: node.nodeId, webhookId: id === "list" ? undefined : id }, msg);
  }
}
