/**
 * The contract between the orchestrator (state machine, timers, persistence) and whatever
 * really runs sandboxes. The VM assembly (src/sandbox/vm-runtime.ts: net slot + root disk
 * + VMM + envd init) implements it. Every method may take seconds; the orchestrator calls at
 * most one method per sandbox at a time and bounds each call with its own timeout (`signal`).
 */
import type { SandboxEndpoint, SandboxLogLine, SandboxMetricsSample, TemplateInfo } from "./types.ts";

/** What a runtime needs to start one sandbox. */
export interface RuntimeStartSpec {
  id: string;
  template: TemplateInfo;
  cpuCount: number;
  memoryMB: number;
  /** Sandbox-wide env vars for envd `/init`. */
  envVars: Record<string, string>;
  /** Token envd must require (`X-Access-Token`); null = open envd. */
  envdAccessToken: string | null;
  allowInternetAccess: boolean | null;
  network: Record<string, unknown> | null;
  /** Aborted when the orchestrator gives up (create timeout, shutdown). */
  signal: AbortSignal;
  /**
   * Sink for the sandbox's own log lines (guest console, envd): the orchestrator keeps them in the
   * sandbox's log. Called synchronously, possibly many times a second; must not throw.
   */
  onLog?: (line: SandboxLogLine) => void;
}

/** What `sampleMetrics` needs to reach a running sandbox. */
export interface RuntimeMetricsTarget {
  id: string;
  endpoint: SandboxEndpoint;
  envdAccessToken: string | null;
  runtimeState: Record<string, unknown> | null;
}

/** A sandbox the runtime has running (envd answered `/health` and took `/init`). */
export interface RuntimeSandbox {
  endpoint: SandboxEndpoint;
  /** Opaque JSON the runtime needs later (pid, slot, work dir); persisted by the orchestrator. */
  runtimeState: Record<string, unknown>;
  /** What envd reported (`X-Envd-Version`), semver. */
  envdVersion: string;
  /** Resolves when the sandbox dies on its own (VMM exit); the orchestrator then marks it failed. */
  exited?: Promise<unknown>;
}

/** A stored sandbox as the runtime sees it at start-up reconciliation. */
export interface RuntimeKnownSandbox {
  id: string;
  state: string;
  runtimeState: Record<string, unknown> | null;
}

/** What a start-up reconciliation did. */
export interface ReapReport {
  /** Sandboxes whose VM was running at start-up and has been stopped. */
  stoppedVms: string[];
  /** Other leftovers removed (netns, mounts, work dirs), described for the log. */
  removed: string[];
}

export interface SandboxRuntime {
  readonly name: string;
  /** Templates this node can boot. */
  listTemplates(): Promise<TemplateInfo[]>;
  /** Boot a sandbox and wait until envd is initialised. Frees everything it made if it throws. */
  start(spec: RuntimeStartSpec): Promise<RuntimeSandbox>;
  /** Pause + snapshot (memory, device state, disk upper) into the data dir, then stop the VMM. Returns the new runtimeState. */
  pause(id: string, state: Record<string, unknown>, signal: AbortSignal): Promise<Record<string, unknown>>;
  /** Restore a paused sandbox and re-init envd (same token, env vars). */
  resume(spec: RuntimeStartSpec, state: Record<string, unknown>): Promise<RuntimeSandbox>;
  /** Stop the sandbox and delete everything it owns (VM, slot, disk, snapshot). Idempotent. */
  kill(id: string, state: Record<string, unknown> | null): Promise<void>;
  /**
   * Check a create request's network settings before anything is made.
   * @throws OrchestratorError `orchestrator.bad_request` (400) naming the bad entry.
   */
  checkNetwork?(network: Record<string, unknown> | null, allowInternetAccess: boolean | null): void;
  /**
   * One resource sample of a running sandbox (vCPUs, CPU %, memory, disk) as its guest sees them.
   * `at` is left to the caller. Bounded by `signal`.
   * @throws any error when the sandbox cannot be sampled now (it is pausing, envd is busy, ...).
   */
  sampleMetrics?(target: RuntimeMetricsTarget, signal: AbortSignal): Promise<Omit<SandboxMetricsSample, "at">>;
  /** Apply a new egress policy to a running sandbox. */
  updateNetwork?(id: string, state: Record<string, unknown>, policy: Record<string, unknown>): Promise<void>;
  /**
   * Start-up reconciliation after a crash: stop VMs of sandboxes that cannot continue
   * (everything not paused), keep paused snapshots, remove leftovers no record names.
   */
  reap(known: RuntimeKnownSandbox[]): Promise<ReapReport>;
  /**
   * Called first when the node starts shutting down, before sandboxes are paused or killed:
   * helpers that die from now on (e.g. disk servers) are expected, not crashes to repair.
   */
  beginShutdown?(): void;
  /** Release runtime-wide resources (warm pools); running sandboxes are the orchestrator's job. */
  close(): Promise<void>;
}
