/**
 * The sandbox proxy's routes in memory: one entry per live sandbox (state, the host its guest
 * ports are reached at, tokens, autoResume), seeded once from the service and then kept by its
 * state events, so a proxied request reads no database. Waits for a sandbox in a transitional
 * state are woken by the event that ends it (no polling).
 */
import { LIVE_STATES, type SandboxRecord, type SandboxService, type SandboxState } from "../orchestrator/index.ts";
import { Notifier } from "../util/wait.ts";

/** What the proxy needs of one sandbox. */
export interface Route {
  id: string;
  state: SandboxState;
  /** Where guest port P is reached (host:P) while running; null otherwise. */
  host: string | null;
  /** Non-envd ports need header e2b-traffic-access-token equal to it (E2B allowPublicTraffic=false); null: open. */
  trafficAccessToken: string | null;
  /** The token envd requires and signs file URLs with; null: open envd. */
  envdAccessToken: string | null;
  autoResume: boolean;
  /** While paused: "filesystem" when only the disk was kept (traffic must not resume it). */
  snapshotKind: SandboxRecord["snapshotKind"];
  /** `network.maskRequestHost`: the Host sent into the sandbox (`${PORT}`: the port); null: the node's own. */
  maskRequestHost: string | null;
  /** `network.httpsPorts`: guest ports spoken to over TLS (their certificate is not verified). */
  httpsPorts: readonly number[];
}

/** States a request waits out instead of being refused (the sandbox is about to run or pause). */
export const TRANSITIONAL: ReadonlySet<SandboxState> = new Set(["creating", "pausing", "resuming"]);

function routeOf(r: SandboxRecord): Route {
  return {
    id: r.id,
    state: r.state,
    host: r.state === "running" ? (r.endpoint?.host ?? null) : null,
    trafficAccessToken: r.trafficAccessToken,
    envdAccessToken: r.envdAccessToken,
    autoResume: r.autoResume,
    snapshotKind: r.snapshotKind,
    maskRequestHost: typeof r.network?.maskRequestHost === "string" ? r.network.maskRequestHost : null,
    httpsPorts: Array.isArray(r.network?.httpsPorts) ? (r.network.httpsPorts as unknown[]).filter((p): p is number => typeof p === "number") : [],
  };
}

export class RouteTable {
  private readonly routes = new Map<string, Route>();
  /** Per sandbox with waiters: woken by each of its events. */
  private readonly waiters = new Map<string, Notifier>();
  private readonly unobserve: () => void;

  /** Subscribe to `sandboxes`' events, then seed from its live sandboxes (events win over the seed). */
  constructor(sandboxes: Pick<SandboxService, "observe" | "inStates">) {
    this.unobserve = sandboxes.observe({ onEvent: (e) => this.apply(e.sandbox) });
    for (const r of sandboxes.inStates(LIVE_STATES)) if (!this.routes.has(r.id)) this.apply(r);
  }

  /** The route of `id`, undefined when it is not live (unknown, killing, killed, failed). */
  get(id: string): Route | undefined {
    return this.routes.get(id);
  }

  /** Every live route (for matching a signed URL to its sandbox). */
  values(): IterableIterator<Route> {
    return this.routes.values();
  }

  /**
   * The route of `id` once it is not in a transitional state (creating, pausing, resuming),
   * waiting at most `timeoutMs`; the route as it then is (possibly still transitional after the
   * timeout), or undefined when the sandbox went away.
   */
  async settled(id: string, timeoutMs: number): Promise<Route | undefined> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const r = this.routes.get(id);
      if (!r || !TRANSITIONAL.has(r.state)) return r;
      const left = deadline - performance.now();
      if (left <= 0) return r;
      let n = this.waiters.get(id);
      if (!n) this.waiters.set(id, (n = new Notifier()));
      await n.wait(left);
      if (n.waiting === 0 && this.waiters.get(id) === n) this.waiters.delete(id);
    }
  }

  /** Stop following events; pending waits return what they have. */
  close(): void {
    this.unobserve();
    for (const n of [...this.waiters.values()]) n.notify();
  }

  private apply(r: SandboxRecord): void {
    if ((LIVE_STATES as readonly string[]).includes(r.state)) this.routes.set(r.id, routeOf(r));
    else this.routes.delete(r.id);
    this.waiters.get(r.id)?.notify();
  }
}
