/**
 * The VM runtime as template builds see it (the `BuildVmLauncher` port of src/template): build
 * VMs booted through the runtime's parts (restoring its boot snapshots), and the snapshots builds
 * end in, kept in the node's repository while a build names them.
 */
import type { Logger } from "pino";
import type { BuildVmLauncher } from "../template/index.ts";
import type { BootSnapshots } from "./boot-snapshots.ts";
import { toolsKeyOf } from "./build-snapshot.ts";
import { bootBuildVm, type BuildVmTimeouts } from "./build-vm.ts";
import type { KernelKeys } from "./capture.ts";
import type { VmRuntimeOptions } from "./options.ts";
import type { SnapshotUsers } from "./snapshot-users.ts";

/** What the build VMs' launcher uses of the runtime. */
export interface BuildLauncherDeps {
  o: VmRuntimeOptions;
  boots: BootSnapshots;
  users: SnapshotUsers;
  kernelKeys: KernelKeys;
  /** Collect what a removed snapshot left. */
  gc: () => void;
  log: Logger;
}

/** Boots template build VMs (internal sandboxes outside the orchestrator's table) bounded by `timeouts`. */
export function buildVmLauncher(d: BuildLauncherDeps, timeouts: BuildVmTimeouts): BuildVmLauncher {
  const repo = d.o.snapshots.repo;
  return {
    boot: (spec) => bootBuildVm(d.o, spec, timeouts, d.boots.forBuildVms()),
    snapshotUsable: (id) => {
      const m = repo.find(id);
      if (!m || m.memory === null || m.vmState === null || repo.isTombstoned(id)) return false;
      try {
        // taken with the node's current guest kernel and tools drive (a new envd reaches sandboxes)
        return m.vm.kernelKey === d.kernelKeys.of(d.o.kernelPath()) && m.toolsKey === toolsKeyOf(d.o.toolsImage());
      } catch (e) {
        d.log.warn({ err: e, snapshot: id }, "kernel or tools drive unreadable: the build snapshot is not reused");
        return false;
      }
    },
    releaseSnapshot: (id) => {
      // hidden now; removed once no sandbox runs from it (SnapshotUsers.unuse)
      repo.tombstone(id);
      if (!d.users.inUse(id)) repo.remove(id);
      d.gc();
    },
  };
}
