/**
 * Reading a runtime's per-sandbox state back from the database (`SandboxRecord.runtimeState`,
 * JSON) through the runtime's codec: the one place the orchestrator turns a stored state into
 * the runtime's typed one, and decides what an unreadable one means for each operation.
 */
import type { Logger } from "pino";
import { asError } from "../util/error.ts";
import type { RuntimeKnownSandbox, RuntimeStateCodec } from "./runtime.ts";
import type { SandboxRecord } from "./types.ts";

/** Stored runtime states of one runtime, read back. */
export class StoredStates<S> {
  constructor(
    private readonly codec: RuntimeStateCodec<S>,
    private readonly log: Logger,
  ) {}

  /**
   * The runtime's state of `r`.
   * @throws OrchestratorError `orchestrator.bad_runtime_state` when it does not parse (or is none)
   */
  of(r: SandboxRecord): S {
    return this.codec.parse(r.id, r.runtimeState);
  }

  /** The runtime's state of `r` for a kill: null when it has none or it does not parse (logged: the sandbox still goes). */
  forKill(r: SandboxRecord): S | null {
    if (r.runtimeState == null) return null;
    try {
      return this.of(r);
    } catch (e) {
      this.log.warn({ sandboxId: r.id, err: e }, "kill of a sandbox whose runtime state does not parse");
      return null;
    }
  }

  /** `r` as start-up reconciliation sees it: its state read back, or why it cannot be. */
  known(r: SandboxRecord): RuntimeKnownSandbox<S> {
    const k = { id: r.id, state: r.state, network: r.network, allowInternetAccess: r.allowInternetAccess, volumes: r.volumeMounts };
    if (r.runtimeState == null) return { ...k, runtimeState: null };
    try {
      return { ...k, runtimeState: this.of(r) };
    } catch (e) {
      return { ...k, runtimeState: null, unreadable: asError(e) };
    }
  }
}
