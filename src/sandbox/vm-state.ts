/**
 * What the VM runtime keeps in `SandboxRecord.runtimeState` (JSON in the database), as a schema:
 * a stored value is parsed (checked field by field) when it is read back, never cast, so a
 * record written by another version or damaged fails with the field named instead of later as
 * an undefined path. Versioned: a state carries `version` (VM_STATE_VERSION); one stored without
 * it was written before versions and has version 1's shape. Adding a field: add it here
 * (Type.Optional for values older records lack); changing one: a new version, with the older
 * versions still read (converted to the new shape in parseVmState).
 *
 * Versions: 1 (and unversioned): what a node needs to pause, snapshot, resume and kill the
 * sandbox it started. 2 (issue 27) adds `held`, what the running VM holds, so that the next node
 * can take it over: the VMM's start time and control socket, its slot, the disk daemon's device
 * ids of its exports and the memory images it maps. A version 1 state reads as version 2 without
 * `held` (its sandbox is adopted by what can be derived: the sandbox id names its root export).
 */
import { type Static, Type as T } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { OrchestratorError } from "../orchestrator/errors.ts";
import type { RuntimeStateCodec } from "../orchestrator/runtime.ts";

const SNAPSHOT_ID = { pattern: "^[a-z0-9]{20}$" };

/** Version of the state this code writes. */
export const VM_STATE_VERSION = 2;

/** What a running VM holds (version 2): what the next node takes over. */
const HELD = T.Object({
  /** The VMM process's start time (/proc/<pid>/stat field 22): with `vmmPid`, which process it is. */
  vmmStartTime: T.Integer({ minimum: 0 }),
  /** Its QMP / Firecracker API socket. */
  controlSocket: T.String(),
  /** Index of its network slot. */
  slot: T.Integer({ minimum: 0 }),
  /** Disk daemon device ids: the root disk's, and the volume drives' in drive order. */
  rootExport: T.String({ minLength: 1 }),
  volumeExports: T.Array(T.String({ minLength: 1 })),
  /** Keys of the shared memory images its VMM maps (the base's, or its boot snapshot's): at most one. */
  memoryImages: T.Array(T.String({ pattern: "^[0-9a-f]{16}$" }), { maxItems: 1 }),
});

const VM_STATE = T.Object({
  /** Shape version; absent in states stored before versions (the shape of 1). */
  version: T.Optional(T.Union([T.Literal(1), T.Literal(VM_STATE_VERSION)])),
  /** What the running VM holds (version 2; absent while paused, and in version 1 states). */
  held: T.Optional(HELD),
  workDir: T.String({ minLength: 1 }),
  /** The served root disk (empty while paused). */
  rootDisk: T.String(),
  /** Guest MAC (kept across restores). */
  mac: T.String(),
  /** Snapshot the VM runs from: memory image mapped (unless cold-booted), disk layers under the upper. */
  base: T.String(SNAPSHOT_ID),
  /** True when the VM booted from the base's disk (no memory image mapped). */
  coldBoot: T.Boolean(),
  /**
   * The boot snapshot a cold boot was restored from (src/sandbox/boot-snapshot.ts): the memory
   * image the VM maps, the tools drive it has mounted and the kernel it runs, which its captures
   * record. Absent: booted (or restored from `base`).
   */
  bootSnapshot: T.Optional(
    T.Object({
      id: T.String(SNAPSHOT_ID),
      memory: T.Array(T.Object({ digest: T.String(), size: T.Integer({ minimum: 0 }) }), { minItems: 1 }),
      tools: T.Object({ digest: T.String(), size: T.Integer({ minimum: 0 }) }),
      kernelKey: T.String(),
    }),
  ),
  /** Snapshot holding the paused state, while paused. */
  paused: T.Optional(T.String(SNAPSHOT_ID)),
  /**
   * Tools drive image the VM booted through (a cold boot: the node's current one; a restore: the
   * snapshot's copy in the repository); recorded into its snapshots. Absent: booted without one.
   */
  toolsImage: T.Optional(T.String({ minLength: 1 })),
  vmmPid: T.Optional(T.Integer({ minimum: 1 })),
  /** VM shape, recorded into snapshots. */
  vcpus: T.Integer({ minimum: 1 }),
  memoryMiB: T.Integer({ minimum: 1 }),
  /** envd token and version, recorded into snapshots (a restore re-initialises envd with them). */
  envdToken: T.Union([T.String(), T.Null()]),
  envdVersion: T.String(),
  /**
   * What the sandbox started from, fixed at start: the template's layer files (absolute, lowest
   * first; empty for a sandbox created from a user snapshot), which template garbage collection
   * keeps while the sandbox lives (its base snapshot holds hard links to them anyway), and the
   * template's process defaults, which a resume re-initialises envd with (never the template's
   * current build: a rebuild or delete must not change a paused sandbox).
   */
  template: T.Object({
    rootLayers: T.Array(T.String({ minLength: 1 })),
    boot: T.Union([
      T.Null(),
      T.Object({ envs: T.Record(T.String(), T.String()), workdir: T.String(), user: T.String(), startCmd: T.String(), readyCmd: T.String() }),
    ]),
  }),
});

/** The VM runtime's per-sandbox state. */
export type VmState = Static<typeof VM_STATE>;

/** What a running VM holds (`VmState.held`). */
export type VmHeld = Static<typeof HELD>;

/** What a sandbox records of the template it started from (`VmState.template`). */
export type StartedFrom = VmState["template"];

/** What runs in sandboxes of a template (a catalog build's process defaults: `BootSpec`'s), or null. */
export type BootDefaults = StartedFrom["boot"];

/**
 * Check a stored runtime state.
 * @throws OrchestratorError `orchestrator.bad_runtime_state` naming the sandbox, the field and the problem.
 */
export function parseVmState(sandboxId: string, raw: unknown): VmState {
  // JSON has no undefined: a stored vmmPid: undefined comes back absent, fine for Optional
  const first = Value.Errors(VM_STATE, raw).First();
  if (first) {
    throw new OrchestratorError("orchestrator.bad_runtime_state", `sandbox ${sandboxId}: stored runtime state ${first.path || "(root)"}: ${first.message}`, {
      sandboxId,
      field: first.path,
      value: first.value ?? null,
    });
  }
  const st = raw as VmState;
  // version 1 has no fields version 2 lacks: it reads as version 2 without `held`
  return st.version === 1 || st.version === undefined ? { ...st, version: VM_STATE_VERSION } : st;
}

/** The VM runtime's state as the orchestrator reads it back (`SandboxRuntime.state`). */
export const VM_STATE_CODEC: RuntimeStateCodec<VmState> = { parse: parseVmState };

/**
 * The template layer files (absolute) a sandbox's stored runtime state pins, `template.rootLayers`,
 * which template garbage collection must keep; none while the sandbox has no state yet (null:
 * not started).
 * @throws OrchestratorError `orchestrator.bad_runtime_state` when the state does not parse: the
 *   caller cannot know what it pins and must collect nothing
 */
export function pinnedTemplateLayers(sandboxId: string, raw: unknown): string[] {
  return raw === null || raw === undefined ? [] : parseVmState(sandboxId, raw).template.rootLayers;
}
