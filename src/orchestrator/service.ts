/**
 * What the API layer speaks: the sandbox operations behind the E2B routes and the sandbox
 * proxy, as plain data. The node's Orchestrator implements it; a cluster front end may implement
 * the same interface to serve the same routes. The API never reaches behind it (no store, no
 * runtime). Errors: OrchestratorError codes (./errors.ts); the API maps them to statuses.
 */
import type { SandboxState } from "./states.ts";
import type {
  CreateSandboxRequest, ListSandboxesQuery, OrchestratorCounters, SandboxLogEntry, SandboxLogQuery, SandboxMetricsSample, SandboxRecord, TemplateListing,
} from "./types.ts";
import type { VolumeManager } from "./volumes.ts";
import type { SnapshotInfo } from "./runtime.ts";

/**
 * Who or what stopped a sandbox (a pause or a kill); E2B's `kill_reason` words where it has
 * them: a client's request, its timeout, the node's shutdown (`shutdown_action`), a node restart
 * that found it in a state it could not continue from (`orphaned`: a create or kill cut by the
 * restart, a VM whose files could not be kept), this node's own `vm_lost`: its VM died or
 * lost its disk export or slot (while the node ran, or while no node watched), and the sandbox
 * was paused with its files, and another node holding it now (`moved`: this node's copy goes).
 */
export type StopReason = "request" | "timeout" | "shutdown" | "orphaned" | "vm_lost" | "moved";

/** A state change of one sandbox, with its record as it is after the change. */
export interface SandboxEvent {
  id: string;
  /** Null for a new sandbox. */
  from: SandboxState | null;
  to: SandboxState;
  /** Unix ms. */
  at: number;
  /** The record after the change (state `to`; endpoint set while running). */
  sandbox: SandboxRecord;
  /** Why a pause or kill happened (on the changes to pausing, paused, killing, killed). */
  reason?: StopReason;
}

/**
 * A change to a sandbox that is not a state change: a snapshot taken of it (`purpose` fork: the
 * checkpoint its fork children start from), a fork child started (`id` the child), its end time
 * or its egress policy replaced. `sandbox` is the record after the change.
 */
export type SandboxNote =
  | { kind: "snapshot"; id: string; at: number; sandbox: SandboxRecord; snapshotId: string; names: string[]; purpose: "user" | "fork" }
  | { kind: "forked"; id: string; at: number; sandbox: SandboxRecord; sourceId: string }
  | { kind: "timeout"; id: string; at: number; sandbox: SandboxRecord }
  | { kind: "network"; id: string; at: number; sandbox: SandboxRecord };

/** Observer of counters, state changes and notes; called synchronously, in order, after each change is stored. */
export interface OrchestratorObserver {
  onEvent?(e: SandboxEvent): void;
  onNote?(n: SandboxNote): void;
  onCounters?(c: OrchestratorCounters): void;
}

/** Most children one fork may ask for (E2B `SandboxForkRequest.count`). */
export const MAX_FORK_COUNT = 100;
export { FORK_DEFAULT_TIMEOUT_SECS } from "./timeouts.ts";

/** One fork child: the sandbox, or why it did not start. */
export type ForkResult = { sandbox: SandboxRecord; error?: undefined } | { sandbox?: undefined; error: Error };

/** Result of `connect()`: the record and whether it had to be resumed (HTTP 201 vs 200). */
export interface ConnectResult {
  sandbox: SandboxRecord;
  resumed: boolean;
}

/** The sandbox operations the API serves. Times in seconds where the name says so, else unix ms. */
export interface SandboxService {
  /** Templates that can be booted, with spawn statistics. */
  listTemplates(): Promise<TemplateListing[]>;
  /** Create and boot; resolves once envd is initialised. */
  create(req: CreateSandboxRequest): Promise<SandboxRecord>;
  /** The live record of `id`. @throws not_found. */
  get(id: string): SandboxRecord;
  /** One page of live sandboxes; `nextToken` when more exist. */
  list(q: ListSandboxesQuery): { items: SandboxRecord[]; nextToken?: string };
  /** Every sandbox in one of `states` (e.g. LIVE_STATES), for the node's figures and the proxy's routes. */
  inStates(states: readonly SandboxState[]): SandboxRecord[];
  /** Sandboxes in state running. */
  runningCount(): number;
  kill(id: string): Promise<void>;
  /** `memory: false`: keep only the disk (a filesystem-only snapshot). */
  pause(id: string, opts?: { memory?: boolean }): Promise<void>;
  /**
   * A filesystem-only snapshot, or `memory: false`, cold-boots the sandbox on its disk.
   * `fromStore`: the sandbox was moved here from a node that is gone (the cluster's gateway says
   * so): take it over from the shared snapshot store first when it is not here.
   */
  connect(id: string, timeoutSecs?: number, opts?: { memory?: boolean; fromStore?: boolean }): Promise<ConnectResult>;
  resume(id: string, timeoutSecs?: number, opts?: { memory?: boolean; fromStore?: boolean }): Promise<SandboxRecord>;
  setTimeout(id: string, secs: number): Promise<void>;
  refresh(id: string, secs: number): Promise<void>;
  updateNetwork(id: string, policy: Record<string, unknown>): Promise<void>;
  /** Someone reads the metrics of `ids`: keep them sampled (`keep`) and take current samples first. */
  watchMetrics(ids: readonly string[], keep: boolean): Promise<void>;
  metrics(id: string, startMs?: number, endMs?: number): SandboxMetricsSample[];
  latestMetrics(ids: readonly string[]): Map<string, SandboxMetricsSample>;
  sandboxLogs(id: string, q: SandboxLogQuery): SandboxLogEntry[];
  getCounters(): OrchestratorCounters;
  /** Subscribe to state changes and counters; returns the unsubscribe function. */
  observe(o: OrchestratorObserver): () => void;
  /** The node's volumes (E2B volume routes). */
  readonly volumes: VolumeManager;
  /** Commit a snapshot of a running (briefly paused, then on) or paused sandbox; `name` optional. */
  createSnapshot(id: string, name?: string): Promise<SnapshotInfo>;
  /** Snapshot once, then create `count` children from it (E2B fork); one result per child. */
  fork(id: string, opts: { count?: number; timeoutSecs?: number }): Promise<ForkResult[]>;
  /** One page of user snapshots, filtered by source sandbox and/or name. */
  listSnapshots(q: { sandboxId?: string; name?: string; limit?: number; nextToken?: string }): { items: SnapshotInfo[]; nextToken?: string };
  /** Delete a snapshot by id or name; false when there is none. */
  deleteSnapshot(ref: string): Promise<boolean>;
}
