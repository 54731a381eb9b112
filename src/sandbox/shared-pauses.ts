/**
 * Paused sandboxes in the snapshot store the cluster's nodes share (`[snapshot.s3]`), for the VM
 * runtime: what the runtime keeps with a pause snapshot so another node can resume the sandbox
 * (`manifest.sandbox`: the orchestrator's portable record and the template's process defaults a
 * cold boot needs), and its state on the node that takes such a sandbox over (work dir here,
 * runs from the pause snapshot, no template layer files pinned: the snapshot's layers are whole).
 */
import type { RuntimeSharedPauses } from "../orchestrator/runtime.ts";
import type { SnapshotRemote } from "../snapshot/index.ts";
import { parseVmState, VM_STATE_VERSION, type BootDefaults, type VmState } from "./vm-state.ts";

/** What a pause snapshot carries of its sandbox (`SnapshotManifest.sandbox`). */
export interface PausedSandboxRecord {
  /** The orchestrator's portable record (src/orchestrator/portable.ts), opaque here. */
  record: Record<string, unknown>;
  /** The template's process defaults the sandbox started with (a cold boot runs them again). */
  boot: BootDefaults;
}

/** What a pause of sandbox state `st` keeps with its snapshot, given the orchestrator's record (null: it cannot move). */
export function pausedSandboxRecord(st: VmState, record: Record<string, unknown> | null | undefined): PausedSandboxRecord | undefined {
  return record ? { record, boot: st.template.boot } : undefined;
}

/** The runtime's `shared` port over the node's object store. */
export class SharedPauses implements RuntimeSharedPauses<VmState> {
  /** @param workDir where sandbox `id`'s work files go on this node */
  constructor(
    private readonly remote: SnapshotRemote,
    private readonly workDir: (id: string) => string,
  ) {}

  async find(id: string): Promise<{ record: unknown; runtimeState: VmState } | null> {
    const m = await this.remote.findPaused(id);
    if (!m) return null;
    const carried = m.sandbox as Partial<PausedSandboxRecord>;
    const state = {
      version: VM_STATE_VERSION,
      workDir: this.workDir(id),
      rootDisk: "",
      mac: m.vm.mac,
      base: m.id,
      coldBoot: m.memory === null,
      paused: m.id,
      vcpus: m.vm.vcpus,
      memoryMiB: m.vm.memoryMiB,
      envdToken: m.envd.accessToken,
      envdVersion: m.envd.version,
      template: { rootLayers: [], boot: carried.boot ?? null },
    };
    try {
      // checked as a stored state is: what another node wrote may not fit this version
      return { record: carried.record, runtimeState: parseVmState(id, state) };
    } catch (e) {
      // not taken over: removing the adopted copy here must leave the store's alone
      await this.remote.forget(m.id);
      throw e;
    }
  }

  stored(id: string, st: VmState): boolean {
    return st.paused !== undefined && this.remote.recordIn(st.paused) === id;
  }

  async release(_id: string, st: VmState): Promise<void> {
    if (st.paused) await this.remote.forget(st.paused);
  }
}
