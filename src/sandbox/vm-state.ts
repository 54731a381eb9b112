/**
 * What the VM runtime keeps in `SandboxRecord.runtimeState` (JSON in the database), as a schema:
 * a stored value is parsed (checked field by field) when it is read back, never cast, so a
 * record written by another version or damaged fails with the field named instead of later as
 * an undefined path. Adding a field: add it here (Type.Optional for values older records lack).
 */
import { type Static, Type as T } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { OrchestratorError } from "../orchestrator/errors.ts";

const VM_STATE = T.Object({
  workDir: T.String({ minLength: 1 }),
  rootDisk: T.String({ minLength: 1 }),
  mac: T.String(),
  /** "overlaybd": served by the disk daemon; "copy": a plain file. */
  diskKind: T.Union([T.Literal("overlaybd"), T.Literal("copy")]),
  /**
   * Tools drive image the VM booted through; a restore attaches the same one (its guest has it
   * mounted). Absent in sandboxes booted before the tools drive: they had the root disk alone.
   */
  toolsImage: T.Optional(T.String()),
  vmmPid: T.Optional(T.Integer({ minimum: 1 })),
  snapshot: T.Optional(T.Object({ statePath: T.String({ minLength: 1 }), memPath: T.String({ minLength: 1 }) })),
  /**
   * What the sandbox booted from, fixed at start: its template's layers (absolute, lowest first)
   * and process defaults. A resume stacks the upper on these, never on the template's current
   * build (a rebuild would put other blocks under the upper; a delete would lose the sandbox);
   * garbage collection keeps these layers while the sandbox lives. Absent in sandboxes started
   * before it was recorded.
   */
  template: T.Optional(
    T.Object({
      name: T.String(),
      dir: T.String(),
      rootfsPath: T.String(),
      rootLayers: T.Array(T.String({ minLength: 1 })),
      bootArgs: T.String(),
      diskBytes: T.Integer({ minimum: 1 }),
      boot: T.Union([
        T.Null(),
        T.Object({ envs: T.Record(T.String(), T.String()), workdir: T.String(), user: T.String(), startCmd: T.String(), readyCmd: T.String() }),
      ]),
    }),
  ),
});

/** The VM runtime's per-sandbox state. */
export type VmState = Static<typeof VM_STATE>;

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
  return raw as VmState;
}
