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
 */
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import type { Logger } from "pino";
import { logger } from "../../../src/observability/log.ts";
import { SchedulerError } from "../errors.ts";
import type { DiscoveredNodes, NodeRef } from "../types.ts";
import type { Discovery } from "./types.ts";

/** The subset of discovery.k8s.io/v1 EndpointSlice that discovery reads. */
export interface EndpointSlice {
  metadata: { name: string; namespace?: string; resourceVersion?: string; labels?: Record<string, string> };
  addressType?: string;
  endpoints?: {
    addresses: string[];
    conditions?: { ready?: boolean | null; serving?: boolean | null; terminating?: boolean | null };
    nodeName?: string;
    targetRef?: { kind?: string; name?: string; namespace?: string };
  }[];
  ports?: { name?: string; port?: number; protocol?: string }[] | null;
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

  /** @throws SchedulerError scheduler.bad_config when the CA file cannot be read. */
  constructor(private readonly o: KubernetesOptions) {
    if (o.caPath) {
      try {
        this.ca = readFileSync(o.caPath, "utf8");
      } catch (e) {
        throw new SchedulerError("scheduler.bad_config", `cannot read the Kubernetes CA bundle ${o.caPath}: ${(e as Error).message}`, { path: o.caPath });
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
      throw new SchedulerError("scheduler.discovery_failed", `listing EndpointSlices of service ${this.o.namespace}/${this.o.serviceName} at ${this.o.apiUrl} failed: ${(e as Error).message}`, { apiUrl: this.o.apiUrl }, { cause: e });
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

  /** Replace the slice set with a fresh list. @returns its resourceVersion. @throws Error (HTTP status, deadline). */
  private async list(): Promise<string> {
    const d = this.deadline(this.o.requestTimeoutMs, `the API server did not answer the list within ${this.o.requestTimeoutMs} ms`);
    let body: { metadata?: { resourceVersion?: string }; items?: EndpointSlice[] };
    try {
      const res = await this.request("", d.signal);
      if (!res.ok) throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 300)}`);
      body = (await res.json()) as typeof body;
    } catch (e) {
      throw d.signal.aborted ? (d.signal.reason as Error) : e;
    } finally {
      d.clear();
    }
    this.slices.clear();
    for (const s of body.items ?? []) this.slices.set(s.metadata.name, s);
    this.lists++;
    this.update();
    return body.metadata?.resourceVersion ?? "";
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
    return new Promise((resolve) => {
      const t = setTimeout(resolve, this.o.retryBackoffMs);
      this.stop.signal.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
    });
  }

  /**
   * One watch request, bounded: response headers within requestTimeoutMs, the whole watch within
   * watchTimeoutSecs + requestTimeoutMs.
   * @returns the last resourceVersion seen and how many events came.
   * @throws Gone on 410; Error on another status, a deadline, a malformed event.
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
      const decoder = new TextDecoder();
      let buf = "";
      for await (const chunk of res.body) {
        buf += decoder.decode(chunk, { stream: true });
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (!line) continue;
          events++;
          rv = this.apply(JSON.parse(line) as { type: string; object: EndpointSlice & { code?: number; message?: string } }, rv);
        }
      }
    } catch (e) {
      for (const s of [d.signal, h.signal]) if (s.aborted) throw s.reason as Error;
      throw e;
    } finally {
      d.clear();
      h.clear();
    }
    return { rv, events };
  }

  private apply(ev: { type: string; object: EndpointSlice & { code?: number; message?: string } }, rv: string): string {
    const o = ev.object;
    switch (ev.type) {
      case "ADDED":
      case "MODIFIED":
        this.slices.set(o.metadata.name, o);
        this.update();
        break;
      case "DELETED":
        this.slices.delete(o.metadata.name);
        this.update();
        break;
      case "BOOKMARK":
        break;
      case "ERROR":
        if (o.code === 410) throw new Gone();
        throw new Error(`watch error event: ${o.message ?? JSON.stringify(o)}`);
      default:
        throw new Error(`unknown watch event type ${JSON.stringify(ev.type)}`);
    }
    return o.metadata?.resourceVersion ?? rv;
  }
}
