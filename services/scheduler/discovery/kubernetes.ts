/**
 * Kubernetes discovery: the EndpointSlices of the headless node Service (label
 * `kubernetes.io/service-name=<service>`), listed once and then watched. Protocol facts
 * (Kubernetes API conventions, "Efficient detection of changes"): a list answers
 * `{metadata: {resourceVersion}, items}`; `?watch=1&resourceVersion=RV` streams one JSON event
 * per line, `{type: ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, object}`; a resourceVersion too old
 * is refused with HTTP 410 or an ERROR event whose Status has code 410, after which the client
 * lists again. EndpointConditions: `ready` nil means ready; `serving` nil defers to ready.
 * Written over fetch (Bun's `tls.ca` takes the in-cluster CA) rather than a client library:
 * only this list + watch of one resource is needed. Every request has a client-side deadline
 * (an API server that stops answering cannot stall discovery), and a watch that ends without
 * any event is followed by a pause (a server ending watches at once cannot make us spin).
 * What the server sends is read bounded (a list answer up to max_list_bytes, a watch event up to
 * max_event_bytes) and checked against the fields discovery reads: anything else is a
 * SchedulerError `scheduler.bad_event` naming the field, and discovery lists again.
 */
import { type Static, Type as T } from "@sinclair/typebox";
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import type { Logger } from "pino";
import { logger } from "../../../src/observability/log.ts";
import { describeProblem, jsonSchema, type JsonSchema } from "../../../src/util/json-check.ts";
import { readCapped } from "../../../src/util/read-capped.ts";
import { SchedulerError } from "../errors.ts";
import type { NodeRef } from "../../../src/cluster/index.ts";
import type { DiscoveredNodes } from "../types.ts";
import type { Discovery } from "./types.ts";
import { sleep } from "../../../src/util/wait.ts";
import { errorMessage } from "../../../src/util/error.ts";

const OPT_STRING = T.Optional(T.String());
/** A Go `*bool`: absent, null or a boolean. */
const OPT_BOOL = T.Optional(T.Union([T.Boolean(), T.Null()]));

/** The subset of discovery.k8s.io/v1 EndpointSlice that discovery reads (a Go nil list is `null`). */
const SLICE = T.Object({
  metadata: T.Object({ name: T.String(), namespace: OPT_STRING, resourceVersion: OPT_STRING, labels: T.Optional(T.Record(T.String(), T.String())) }),
  addressType: OPT_STRING,
  endpoints: T.Optional(
    T.Union([
      T.Null(),
      T.Array(
        T.Object({
          addresses: T.Array(T.String()),
          conditions: T.Optional(T.Object({ ready: OPT_BOOL, serving: OPT_BOOL, terminating: OPT_BOOL })),
          nodeName: OPT_STRING,
          targetRef: T.Optional(T.Object({ kind: OPT_STRING, name: OPT_STRING, namespace: OPT_STRING })),
        }),
      ),
    ]),
  ),
  ports: T.Optional(T.Union([T.Null(), T.Array(T.Object({ name: OPT_STRING, port: T.Optional(T.Integer()), protocol: OPT_STRING }))])),
});
/** The subset of discovery.k8s.io/v1 EndpointSlice that discovery reads. */
export type EndpointSlice = Static<typeof SLICE>;

/** What discovery reads of the API server's answers and events. */
const WIRE = {
  list: jsonSchema(T.Object({ metadata: T.Optional(T.Object({ resourceVersion: OPT_STRING })), items: T.Optional(T.Union([T.Null(), T.Array(SLICE)])) })),
  event: jsonSchema(T.Object({ type: T.String(), object: T.Unknown() })),
  slice: jsonSchema(SLICE),
  bookmark: jsonSchema(T.Object({ metadata: T.Optional(T.Object({ resourceVersion: OPT_STRING })) })),
  /** A meta/v1 Status (an ERROR event's object). */
  status: jsonSchema(T.Object({ code: T.Optional(T.Integer()), message: OPT_STRING })),
};

/** `value` checked against `schema`. @throws SchedulerError scheduler.bad_event naming `what` and the field. */
function checked<S extends JsonSchema<any>>(schema: S, value: unknown, what: string): Static<S["schema"]> {
  const r = schema.check(value);
  if (!r.ok) throw new SchedulerError("scheduler.bad_event", `the API server sent ${what} that is not what it should be: ${describeProblem(r.problem)}`, { field: r.problem.path });
  return r.value;
}

/** `bytes` as JSON. @throws SchedulerError scheduler.bad_event when they are not UTF-8 JSON. */
function parsed(bytes: Uint8Array, what: string): unknown {
  try {
    return JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    throw new SchedulerError("scheduler.bad_event", `the API server sent ${what} that is not JSON (${e instanceof Error ? e.message : String(e)})`, { field: "" });
  }
}

/**
 * Splits a watch body into lines as chunks arrive, holding at most `maxBytes` of a line: each
 * byte is copied at most once.
 */
class LineSplitter {
  #parts: Uint8Array[] = [];
  #held = 0;
  constructor(readonly maxBytes: number) {}

  /** The lines `chunk` completes (without their newline). @throws SchedulerError scheduler.bad_event for a line over `maxBytes`. */
  push(chunk: Uint8Array): Uint8Array[] {
    const out: Uint8Array[] = [];
    let from = 0;
    for (let nl = chunk.indexOf(0x0a, from); nl >= 0; nl = chunk.indexOf(0x0a, from)) {
      const piece = chunk.subarray(from, nl);
      this.#hold(piece.byteLength);
      out.push(this.#parts.length === 0 ? piece : Buffer.concat([...this.#parts, piece]));
      this.#parts = [];
      this.#held = 0;
      from = nl + 1;
    }
    if (from < chunk.byteLength) {
      this.#hold(chunk.byteLength - from);
      this.#parts.push(chunk.slice(from));
    }
    return out;
  }

  #hold(n: number): void {
    this.#held += n;
    if (this.#held > this.maxBytes) throw new SchedulerError("scheduler.bad_event", `a watch event exceeds ${this.maxBytes} bytes ([scheduler.kubernetes] max_event_bytes)`, { field: "", max: this.maxBytes });
  }
}

/** Settings of Kubernetes discovery (`[scheduler.kubernetes]`). */
export interface KubernetesOptions {
  /** API server base URL, e.g. `https://10.96.0.1:443`. */
  apiUrl: string;
  namespace: string;
  serviceName: string;
  /** Node API port the slices must carry. */
  port: number;
  scheme: "http" | "https";
  /** Bearer token file (read at every request: tokens rotate); null = no auth. */
  tokenPath: string | null;
  /** PEM CA bundle of the API server; null = system roots. */
  caPath: string | null;
  /** Server-side watch timeout, seconds. */
  watchTimeoutSecs: number;
  /** Wait before re-listing after a failure, and before re-watching after an empty watch, ms. */
  retryBackoffMs: number;
  /** Bound on a list (body included) and on a watch's response headers, ms. */
  requestTimeoutMs: number;
  /** Largest list answer read, bytes. */
  maxListBytes: number;
  /** Largest watch event (one line) read, bytes. */
  maxEventBytes: number;
}

/**
 * Nodes of a set of EndpointSlices: for each endpoint with a `targetRef` name (the Pod name =
 * the node id) and an IP address, on a slice that carries `port`: ready → active;
 * not ready but serving and terminating → lingering; otherwise left out.
 */
export function nodesFromSlices(slices: Iterable<EndpointSlice>, port: number, scheme: string): DiscoveredNodes {
  const active = new Map<string, NodeRef>();
  const lingering = new Map<string, NodeRef>();
  for (const s of slices) {
    if (!(s.ports ?? []).some((p) => p.port === port)) continue;
    for (const ep of s.endpoints ?? []) {
      const id = ep.targetRef?.name;
      const addr = ep.addresses.find((a) => isIP(a) !== 0);
      if (!id || !addr) continue;
      const ready = ep.conditions?.ready ?? true;
      const serving = ep.conditions?.serving ?? ready;
      const terminating = ep.conditions?.terminating ?? false;
      const node = { nodeId: id, endpoint: `${scheme}://${isIP(addr) === 6 ? `[${addr}]` : addr}:${port}` };
      if (ready && !terminating) active.set(id, node);
      else if (serving && terminating) lingering.set(id, node);
    }
  }
  for (const id of active.keys()) lingering.delete(id);
  const sorted = (m: Map<string, NodeRef>) => [...m.values()].sort((a, b) => (a.nodeId < b.nodeId ? -1 : 1));
  return { active: sorted(active), lingering: sorted(lingering) };
}

class Gone extends Error {}

/**
 * Discovery from the EndpointSlices of the node Service: `start()` lists them once (and fails
 * if that fails), then a background loop watches, re-watching when a watch ends and re-listing
 * after a 410 or a failure. `nodes()` answers from memory.
 */
export class KubernetesDiscovery implements Discovery {
  readonly mode = "kubernetes" as const;
  private readonly log: Logger = logger("scheduler.discovery");
  private readonly slices = new Map<string, EndpointSlice>();
  private current: DiscoveredNodes = { active: [], lingering: [] };
  private readonly stop = new AbortController();
  private loop: Promise<void> | undefined;
  private readonly ca: string | undefined;
  /** Number of completed lists (first one included); for tests and logs. */
  lists = 0;
  /** Number of watch requests made; for tests and logs. */
  watches = 0;
  /** Pauses begun (after a failure, or a watch without events); for tests and logs. */
  pauses = 0;
  /** The last resourceVersion seen (list, event or bookmark); for tests and logs. */
  resourceVersion = "";

  /** @throws SchedulerError scheduler.bad_config when the CA file cannot be read. */
  constructor(private readonly o: KubernetesOptions) {
    if (o.caPath) {
      try {
        this.ca = readFileSync(o.caPath, "utf8");
      } catch (e) {
        throw new SchedulerError("scheduler.bad_config", `cannot read the Kubernetes CA bundle ${o.caPath}: ${errorMessage(e)}`, { path: o.caPath });
      }
    }
  }

  nodes(): DiscoveredNodes {
    return { active: [...this.current.active], lingering: [...this.current.lingering] };
  }

  /**
   * List the slices, then keep watching in the background.
   * @throws SchedulerError scheduler.discovery_failed when the first list fails.
   */
  async start(): Promise<void> {
    let rv: string;
    try {
      rv = await this.list();
    } catch (e) {
      throw new SchedulerError("scheduler.discovery_failed", `listing EndpointSlices of service ${this.o.namespace}/${this.o.serviceName} at ${this.o.apiUrl} failed: ${errorMessage(e)}`, { apiUrl: this.o.apiUrl }, { cause: e });
    }
    this.loop = this.run(rv);
  }

  async close(): Promise<void> {
    this.stop.abort();
    await this.loop;
  }

  private path(): string {
    return `/apis/discovery.k8s.io/v1/namespaces/${encodeURIComponent(this.o.namespace)}/endpointslices?labelSelector=${encodeURIComponent(`kubernetes.io/service-name=${this.o.serviceName}`)}`;
  }

  private request(query: string, signal: AbortSignal): Promise<Response> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (this.o.tokenPath) headers.authorization = `Bearer ${readFileSync(this.o.tokenPath, "utf8").trim()}`;
    return fetch(this.o.apiUrl.replace(/\/+$/, "") + this.path() + query, { headers, signal: AbortSignal.any([this.stop.signal, signal]), ...(this.ca ? { tls: { ca: this.ca } } : {}) } as RequestInit);
  }

  /** An abort signal firing `ms` from now with `why` (cancel the timer with `clear`). */
  private deadline(ms: number, why: string): { signal: AbortSignal; clear: () => void } {
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(new Error(why)), ms);
    return { signal: ctl.signal, clear: () => clearTimeout(t) };
  }

  /**
   * Replace the slice set with a fresh list. @returns its resourceVersion.
   * @throws Error (HTTP status, deadline); SchedulerError scheduler.bad_event (an answer over
   *   max_list_bytes, not JSON, or not a list of EndpointSlices).
   */
  private async list(): Promise<string> {
    const d = this.deadline(this.o.requestTimeoutMs, `the API server did not answer the list within ${this.o.requestTimeoutMs} ms`);
    let bytes: Uint8Array;
    try {
      const res = await this.request("", d.signal);
      if (!res.ok) {
        const text = await readCapped(res.body, 300);
        throw new Error(`HTTP ${res.status}: ${new TextDecoder().decode(text.bytes)}`);
      }
      const b = await readCapped(res.body, this.o.maxListBytes);
      if (b.truncated) throw new SchedulerError("scheduler.bad_event", `the EndpointSlice list exceeds ${this.o.maxListBytes} bytes ([scheduler.kubernetes] max_list_bytes)`, { field: "", max: this.o.maxListBytes });
      bytes = b.bytes;
    } catch (e) {
      throw d.signal.aborted ? d.signal.reason : e;
    } finally {
      d.clear();
    }
    const body = checked(WIRE.list, parsed(bytes, "a list"), "a list");
    this.slices.clear();
    for (const s of body.items ?? []) this.slices.set(s.metadata.name, s);
    this.lists++;
    this.update();
    this.resourceVersion = body.metadata?.resourceVersion ?? "";
    return this.resourceVersion;
  }

  private update(): void {
    const next = nodesFromSlices(this.slices.values(), this.o.port, this.o.scheme);
    if (JSON.stringify(next) !== JSON.stringify(this.current)) this.log.info({ active: next.active.map((n) => n.nodeId), lingering: next.lingering.map((n) => n.nodeId) }, "node set changed");
    this.current = next;
  }

  /** Watch from `rv`; re-watch when a watch ends (after a pause if it brought no event), re-list after 410 or a failure. */
  private async run(rv: string): Promise<void> {
    while (!this.stop.signal.aborted) {
      try {
        const w = await this.watch(rv);
        rv = w.rv;
        if (w.events === 0) {
          this.log.debug("EndpointSlice watch ended without an event; watching again after a pause");
          await this.pause();
        }
      } catch (e) {
        if (this.stop.signal.aborted) return;
        // a pause even after 410: a server that refuses every fresh resourceVersion must not spin us
        if (e instanceof Gone) this.log.info("EndpointSlice resourceVersion expired; listing again");
        else this.log.warn({ err: e }, "EndpointSlice watch failed; listing again after a pause");
        await this.pause();
        while (!this.stop.signal.aborted) {
          try {
            rv = await this.list();
            break;
          } catch (e2) {
            if (this.stop.signal.aborted) return;
            this.log.warn({ err: e2 }, "EndpointSlice list failed; retrying");
            await this.pause();
          }
        }
      }
    }
  }

  /** Wait retryBackoffMs, cut short by close(). */
  private pause(): Promise<void> {
    this.pauses++;
    return sleep(this.o.retryBackoffMs, this.stop.signal);
  }

  /**
   * One watch request, bounded: response headers within requestTimeoutMs, the whole watch within
   * watchTimeoutSecs + requestTimeoutMs.
   * @returns the last resourceVersion seen and how many events came.
   * @throws Gone on 410; Error on another status or a deadline; SchedulerError scheduler.bad_event
   *   for a malformed event or one over max_event_bytes.
   */
  private async watch(rv: string): Promise<{ rv: string; events: number }> {
    this.watches++;
    const whole = this.o.watchTimeoutSecs * 1000 + this.o.requestTimeoutMs;
    const d = this.deadline(whole, `the API server did not end the watch within ${whole} ms`);
    const h = this.deadline(this.o.requestTimeoutMs, `the API server did not answer the watch within ${this.o.requestTimeoutMs} ms`);
    let events = 0;
    try {
      const res = await this.request(`&watch=1&allowWatchBookmarks=true&timeoutSeconds=${this.o.watchTimeoutSecs}&resourceVersion=${encodeURIComponent(rv)}`, AbortSignal.any([d.signal, h.signal]));
      h.clear();
      if (res.status === 410) throw new Gone();
      if (!res.ok || !res.body) throw new Error(`watch answered HTTP ${res.status}`);
      const lines = new LineSplitter(this.o.maxEventBytes);
      for await (const chunk of res.body) {
        for (const line of lines.push(chunk)) {
          if (line.every((b) => b === 0x20 || b === 0x09 || b === 0x0d)) continue;
          events++;
          rv = this.apply(checked(WIRE.event, parsed(line, "a watch event"), "a watch event"), rv);
          this.resourceVersion = rv;
        }
      }
    } catch (e) {
      for (const s of [d.signal, h.signal]) if (s.aborted) throw s.reason;
      throw e;
    } finally {
      d.clear();
      h.clear();
    }
    return { rv, events };
  }

  /** Apply one event. @returns the resourceVersion after it. @throws Gone (410), Error (an ERROR event, an unknown type), SchedulerError scheduler.bad_event. */
  private apply(ev: { type: string; object: unknown }, rv: string): string {
    switch (ev.type) {
      case "ADDED":
      case "MODIFIED": {
        const o = checked(WIRE.slice, ev.object, `an ${ev.type} event`);
        this.slices.set(o.metadata.name, o);
        this.update();
        return o.metadata.resourceVersion ?? rv;
      }
      case "DELETED": {
        const o = checked(WIRE.slice, ev.object, "a DELETED event");
        this.slices.delete(o.metadata.name);
        this.update();
        return o.metadata.resourceVersion ?? rv;
      }
      case "BOOKMARK":
        return checked(WIRE.bookmark, ev.object, "a BOOKMARK event").metadata?.resourceVersion ?? rv;
      case "ERROR": {
        const o = checked(WIRE.status, ev.object, "an ERROR event");
        if (o.code === 410) throw new Gone();
        throw new Error(`watch error event: ${o.message ?? JSON.stringify(ev.object)}`);
      }
      default:
        throw new Error(`unknown watch event type ${JSON.stringify(ev.type)}`);
    }
  }
}
