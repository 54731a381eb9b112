/**
 * The contract between the orchestrator (state machine, timers, persistence) and whatever
 * really runs sandboxes. The VM assembly (src/sandbox/vm-runtime.ts: net slot + root disk
 * + VMM + envd init) implements it. Every method may take seconds; the orchestrator calls at
 * most one method per sandbox at a time and bounds each call with its own timeout (`signal`).
 *
 * A required core (start, pause, resume, kill, reap, ...) and capability ports a runtime may
 * have (snapshots, metrics, volumes, network policy, prepared starts): the orchestrator asks
 * for a capability by name (`runtime.snapshots`) and answers what a runtime without it cannot do.
 * The runtime's per-sandbox state `S` is its own: the orchestrator persists it as JSON and reads
 * it back through the runtime's `state.parse`, never looking inside.
 */
import type { VolumeFiles } from "../volume/types.ts";
import type { SandboxEndpoint, SandboxLogLine, SandboxMetricsSample, TemplateInfo, VolumeMount } from "./types.ts";

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
  /**
   * Volumes to attach as extra drives (in this order, after the root drive) and mount in the
   * guest; the orchestrator has made sure no other sandbox writes them.
   */
  volumes: VolumeMount[];
  /** Aborted when the orchestrator gives up (create timeout, shutdown). */
  signal: AbortSignal;
  /**
   * Sink for the sandbox's own log lines (guest console, envd): the orchestrator keeps them in the
   * sandbox's log. Called synchronously, possibly many times a second; must not throw.
   */
  onLog?: (line: SandboxLogLine) => void;
}

/** Where a running sandbox's guest answers: what calls into the guest (envd) need. */
export interface GuestTarget {
  id: string;
  endpoint: SandboxEndpoint;
  envdAccessToken: string | null;
}

/**
 * How a runtime's per-sandbox state is read back from the database. The state is plain JSON
 * (what `JSON.stringify` keeps); a runtime versions its shape and reads every version it wrote.
 */
export interface RuntimeStateCodec<S> {
  /**
   * Check a stored state and bring it to the current shape.
   * @throws OrchestratorError `orchestrator.bad_runtime_state` naming the sandbox and the field
   */
  parse(sandboxId: string, stored: unknown): S;
}

/** A sandbox the runtime has running (envd answered `/health` and took `/init`). */
export interface RuntimeSandbox<S> {
  endpoint: SandboxEndpoint;
  /** What the runtime needs later (pid, slot, work dir, ...); persisted by the orchestrator. */
  runtimeState: S;
  /** What envd reported (`X-Envd-Version`), semver. */
  envdVersion: string;
  /** Resolves when the sandbox dies on its own (VMM exit); the orchestrator then marks it failed. */
  exited?: Promise<unknown>;
  /**
   * Resolves with a reason when the sandbox can no longer run though its VMM may live on (its
   * root disk or a volume drive was removed under it: the guest sees I/O errors); the
   * orchestrator then marks it failed and kills it.
   */
  lost?: Promise<string>;
}

/** A stored sandbox as the runtime sees it at start-up reconciliation. */
export interface RuntimeKnownSandbox<S> {
  id: string;
  state: string;
  /** Its stored runtime state, read back; null when it has none or it did not parse. */
  runtimeState: S | null;
  /** Why its stored state did not parse: what it may name is unknown (keep it rather than lose data). */
  unreadable?: Error;
  /** Its egress settings as stored (a kept network slot is re-applied with them). */
  network: Record<string, unknown> | null;
  allowInternetAccess: boolean | null;
  /** Volumes attached to it, in drive order. */
  volumes: VolumeMount[];
  /** Sink for its log lines from now on (an adopted guest's console), as `RuntimeStartSpec.onLog`. */
  onLog?: (line: SandboxLogLine) => void;
}

/**
 * What start-up recovery made of one sandbox the database says was alive (running, or pausing):
 * - `adopted`: its VM runs on under this node (VMM, disks, slot taken over), as a start returns it;
 * - `paused`: its VM could not be kept (it died, or its disk export or slot was lost) but its files
 *   were: `runtimeState` names a pause snapshot (`snapshotKind` filesystem: a resume cold-boots
 *   it; memory: a pause that had committed before the node died); `why` says what happened;
 * - `gone`: nothing could be kept (`why`); the orchestrator records it killed.
 */
export type RecoveredSandbox<S> =
  | { kind: "adopted"; sandbox: RuntimeSandbox<S> }
  | { kind: "paused"; runtimeState: S; snapshotKind: "memory" | "filesystem"; why: string }
  | { kind: "gone"; why: string };

/** What a start-up reconciliation did. */
export interface ReapReport<S = unknown> {
  /** Ids of VMMs a previous run left that were stopped (not adopted). */
  stoppedVms: string[];
  /** Other leftovers removed (netns, mounts, work dirs), described for the log. */
  removed: string[];
  /**
   * The outcome for each known sandbox in state running or pausing (by id); one absent was not
   * kept (a runtime that adopts nothing reports none).
   */
  recovered: Map<string, RecoveredSandbox<S>>;
  /** Time taken, ms: all of it, and the part spent adopting (attaches, claims, slots). */
  timings?: { totalMs: number; adoptMs: number };
}

/** The core every runtime has. */
export interface SandboxRuntime<S = unknown> {
  readonly name: string;
  /** Reads this runtime's stored per-sandbox state back. */
  readonly state: RuntimeStateCodec<S>;
  /** Templates this node can boot. */
  listTemplates(): Promise<TemplateInfo[]>;
  /**
   * A template by id or alias, or named with a tag (`name:tag`, `id:tag`): its info with
   * `buildID` the build that name boots (the tag's), which `start` then boots; else a snapshot a
   * sandbox can be created from (by id or name), described as a template; null when none of
   * these exists.
   */
  resolveTemplate(ref: string): Promise<TemplateInfo | null>;
  /** Boot a sandbox and wait until envd is initialised. Frees everything it made if it throws. */
  start(spec: RuntimeStartSpec): Promise<RuntimeSandbox<S>>;
  /**
   * Pause + commit a pause snapshot (memory, device state, disk upper), then stop the VMM.
   * With `memory: false` only the disk is kept (a filesystem-only snapshot): the VMM is stopped
   * without a snapshot (the orchestrator has flushed the guest's filesystems first). `record`:
   * the sandbox's portable record (portable.ts), kept with the pause snapshot so another node can
   * take the sandbox over from a shared store (`shared.find`); null: it cannot move.
   * Returns the paused sandbox's state.
   */
  pause(id: string, state: S, signal: AbortSignal, opts: { memory: boolean; record?: Record<string, unknown> | null }): Promise<S>;
  /**
   * Restore a paused sandbox and re-init envd (same token, env vars). With `memory: false` the
   * sandbox cold-boots on its disk instead (any memory snapshot is discarded once it runs): a new
   * kernel, envd initialised again with the same token, env vars, default user and workdir.
   */
  resume(spec: RuntimeStartSpec, state: S, opts: { memory: boolean }): Promise<RuntimeSandbox<S>>;
  /**
   * Before the VM is stopped for good (kill) or without its memory: flush the guest's
   * filesystems and unmount its volumes, so their disks are clean. Bounded by `timeoutMs`.
   * @throws when the guest could not be reached or a volume stayed mounted (it was synced then)
   */
  quiesce(target: GuestTarget, volumes: VolumeMount[], timeoutMs: number): Promise<void>;
  /**
   * Stop the sandbox and delete everything it owns (VM, slot, disk, pause snapshot). Idempotent.
   * `state` null: none stored, or it did not parse (what it names is then left to the next reap).
   */
  kill(id: string, state: S | null): Promise<void>;
  /**
   * Start-up reconciliation with what a previous node of this runtime left (issue 27): take over
   * the sandboxes `known` says are running or pausing whose VM still runs (`adopted`), keep the
   * files of those whose VM is gone (`paused`), keep paused sandboxes' snapshots, and remove what
   * no known sandbox names (VMMs, disks, slots, work dirs, snapshots only dead VMs used).
   * Called once, before anything is started.
   */
  recover(known: RuntimeKnownSandbox<S>[]): Promise<ReapReport<S>>;
  /**
   * Called first when the node starts shutting down, before sandboxes are paused or killed:
   * helpers that die from now on (e.g. disk servers) are expected, not crashes to repair.
   */
  beginShutdown(): void;
  /** Release runtime-wide resources (warm pools); running sandboxes are the orchestrator's job. */
  close(): Promise<void>;
  /**
   * Instead of `close`: let go of everything without stopping the running sandboxes (VMMs, disk
   * exports, slots stay) for the next node on this runtime path to adopt (`recover`); warm pools
   * are freed. Absent: this runtime cannot leave sandboxes running (`shutdown_action = "detach"`
   * then kills them).
   */
  detach?(): Promise<void>;

  /** Snapshots of sandboxes; absent: snapshot and fork requests are refused. */
  readonly snapshots?: RuntimeSnapshots<S>;
  /** Resource samples of running sandboxes; absent: none are taken. */
  readonly metrics?: RuntimeMetrics;
  /** The volumes' disks; absent: creates with volumeMounts are refused. */
  readonly volumes?: VolumeBackend;
  /** Egress policies; absent: network settings are not checked at create and cannot be changed. */
  readonly network?: RuntimeNetwork;
  /** Sandboxes started ahead of creates; absent: every create starts its own. */
  readonly prepared?: PreparedStarts;
  /** Paused sandboxes in a store nodes share; absent: sandboxes never move between nodes. */
  readonly shared?: RuntimeSharedPauses<S>;
}

/**
 * Paused sandboxes in a snapshot store the cluster's nodes share: a node taking a sandbox over
 * from a node that is gone, and a node letting one go that another holds now.
 */
export interface RuntimeSharedPauses<S> {
  /**
   * Paused sandbox `id` as another node left it in the shared store: the record `pause` was
   * given, and this runtime's state for it here (its pause snapshot adopted; layers fetched when
   * it resumes). Null when the store names no pause snapshot of `id`.
   * @throws when the store cannot be read (the caller answers 503)
   */
  find(id: string): Promise<{ record: unknown; runtimeState: S } | null>;
  /**
   * Whether paused sandbox `id`'s state `state` is the one the shared store named it by (its
   * pause snapshot was pushed with its record): what another node resumed it from.
   */
  stored(id: string, state: S): boolean;
  /**
   * Another node holds sandbox `id` now: from here on, killing this node's copy leaves the
   * shared store's copy alone (that node may still be fetching it).
   */
  release(id: string, state: S): Promise<void>;
}

/** A committed snapshot as the API lists it (E2B `SnapshotInfo` plus what filters need). */
export interface SnapshotInfo {
  snapshotID: string;
  names: string[];
  /** Sandbox it was taken from (null for a template's own). */
  sandboxID: string | null;
  /** Template the snapshot descends from. */
  templateID: string;
  /** Unix ms. */
  createdAt: number;
}

/** What a snapshot commits: a listed user snapshot or a fork's checkpoint. */
export interface SnapshotRequest {
  kind: "user" | "fork";
  name?: string;
  /** Volumes the sandbox has attached (a snapshot of such a sandbox is refused). */
  volumes: number;
}

/** Snapshots: taken of running or paused sandboxes, listed, deleted. */
export interface RuntimeSnapshots<S> {
  /**
   * Commit a snapshot of a running (briefly paused, then running on) or paused sandbox.
   * @throws OrchestratorError `orchestrator.bad_request` for a bad name or a sandbox with volumes
   */
  take(id: string, state: S, req: SnapshotRequest, signal: AbortSignal): Promise<SnapshotInfo>;
  /** Listed (user) snapshots, oldest first. */
  list(): SnapshotInfo[];
  /** Delete a user or fork snapshot by id or name (kept for running users until they stop); false when absent. */
  delete(ref: string): Promise<boolean>;
  /**
   * Running sandbox `id`'s VM ended by itself or lost a drive (`why`): stop what is left of it and
   * keep its disk as the VM left it, as a filesystem-only pause snapshot (a resume cold-boots it,
   * the guest's journal replayed), freeing its slot and exports.
   * @returns the paused sandbox's state
   * @throws when the disk cannot be kept (its upper files are gone or unreadable); what the VM
   *   held is freed either way
   */
  salvage(id: string, state: S, why: string): Promise<S>;
}

/** Resource samples of running sandboxes. */
export interface RuntimeMetrics {
  /**
   * One resource sample of a running sandbox (vCPUs, CPU %, memory, disk) as its guest sees them.
   * `at` is left to the caller. Bounded by `signal`.
   * @throws any error when the sandbox cannot be sampled now (it is pausing, envd is busy, ...).
   */
  sample(target: GuestTarget, signal: AbortSignal): Promise<Omit<SandboxMetricsSample, "at">>;
}

/** Egress policies of sandboxes. */
export interface RuntimeNetwork {
  /**
   * Check a create request's network settings before anything is made (the runtime may ask its
   * secrets store whether the rules' secrets exist).
   * @throws OrchestratorError `orchestrator.bad_request` (400) naming the bad entry.
   */
  check(network: Record<string, unknown> | null, allowInternetAccess: boolean | null): void | Promise<void>;
  /**
   * Apply a new egress policy to running sandbox `id`.
   * @throws OrchestratorError `orchestrator.bad_request` (400) naming the bad entry.
   */
  update(id: string, policy: Record<string, unknown>): Promise<void>;
}

/** Sandboxes a runtime prepares ahead of creates. */
export interface PreparedStarts {
  /**
   * The id of a sandbox the runtime prepared ahead for a create of `template` in this shape,
   * reserved for this create, or null (none ready). The create then uses that id and calls
   * start() with it soon: a reservation not started within the create timeout lapses.
   */
  claim(template: TemplateInfo, shape: { cpuCount: number; memoryMB: number; volumes: number }): Promise<string | null>;
}

/**
 * The volumes' disks, as the orchestrator manages them (create, delete, host access for the
 * content API), and file access through a running guest that has one mounted. Whoever attaches
 * a volume to a VM or the node is coordinated by the orchestrator: one writer or many readers,
 * never both.
 */
export interface VolumeBackend {
  /** Make the disk of new volume `id` (empty ext4 of `sizeBytes`, label `name`). */
  create(id: string, name: string, sizeBytes: number): Promise<void>;
  /** Delete volume `id`'s disk (the node's own access is closed first). */
  destroy(id: string): Promise<void>;
  /**
   * Make the filesystem consistent for read-only mounts (replay the journal a killed writer
   * left). Called before the first reader attaches, while nobody holds the volume.
   */
  prepareShared(id: string): Promise<void>;
  /**
   * The node's own access to volume `id` (mounted on the host), read-only beside read-only
   * guests. `release()` ends the operation (the mount may stay for a while for the next one).
   */
  hostFiles(id: string, readOnly: boolean): Promise<{ files: VolumeFiles; release(): void }>;
  /** Close the node's access to `id` (before a sandbox attaches it). */
  releaseHost(id: string): Promise<void>;
  /** File operations on a volume mounted at `mountPath` in running sandbox `target`, done by its envd. */
  guestFiles(target: GuestTarget, mountPath: string): VolumeFiles;
  /** Close every host access. */
  close(): Promise<void>;
}
