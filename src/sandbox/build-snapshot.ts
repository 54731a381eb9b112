/**
 * A template build ends in a snapshot: its last build VM (booted from the build's layers, the
 * start command running and the ready check passed) is paused and committed to the node's
 * snapshot repository the way `template build-base` commits a template (template-snapshot.ts):
 * device state, guest memory, and a disk made of the layers the VM booted from plus what it wrote
 * since. The build records the snapshot's id (`BootSpec.snapshot`) and sandboxes of the build are
 * restores of it. A build VM is shaped like a sandbox (a slot's network, the tools drive, the
 * build's vCPUs and memory), so a restore into any slot finds the devices it was taken with.
 */
import { basename, dirname } from "node:path";
import type { LocalRepository, SnapshotManifest } from "../snapshot/index.ts";
import { upperPaths } from "../storage/daemon/index.ts";
import type { BuildVmSpec } from "../template/index.ts";
import type { VmHandle } from "../vmm/index.ts";
import { captureVm, commitUpper, kernelKey, layerPaths, templateManifest } from "./capture.ts";

/** What a build VM was booted with (the parts a snapshot records). */
export interface BuildVmBoot {
  spec: BuildVmSpec;
  /** The VMM driver's name. */
  driver: SnapshotManifest["vm"]["driver"];
  kernelPath: string;
  /** The tools drive image it booted through (`$home/tools/<key>/...`). */
  toolsImage: string;
  /** The guest MAC (every slot gives the same). */
  mac: string;
  /** The VM's work dir (holds the disk's upper). */
  workDir: string;
  /**
   * The boot snapshot the VM was restored from instead of booted (src/sandbox/boot-snapshot.ts):
   * its memory is the base of the capture, its tools drive and kernel the snapshot's.
   */
  fromBoot?: SnapshotManifest;
}

/** Key of the tools drive build an image path belongs to (`$home/tools/<key>/<image>`). */
export function toolsKeyOf(toolsImage: string): string {
  return basename(dirname(toolsImage));
}

/**
 * Commit the running build VM `vm` as the snapshot of build `source.buildID` of template
 * `source.templateID`: pause, capture device state and memory, stop the VM (`stopVm`, which also
 * stops serving its disk), then commit its disk's upper over the layers it booted from;
 * `source.record` gets the id just before the manifest is published.
 * @returns the new snapshot's id and the guest memory bytes its memory layer holds
 * @throws VmmError, OverlaybdError, SnapshotError from the parts (nothing is published then)
 */
export async function commitBuildSnapshot(
  repo: LocalRepository,
  vm: VmHandle,
  boot: BuildVmBoot,
  source: { templateID: string; buildID: string; record(snapshotId: string): void },
  stopVm: () => Promise<void>,
): Promise<{ snapshotId: string; memoryBytes: number }> {
  const { spec } = boot;
  const txn = repo.begin();
  try {
    await vm.pause();
    const fromBoot = boot.fromBoot;
    const cap = await captureVm(vm, txn, spec.memoryMB * 1024 * 1024, fromBoot ? layerPaths(repo, fromBoot.memory!.layers) : []);
    // stopped, the disk export closed: nothing writes the upper any more
    await stopVm();
    const lowers = spec.layers.map((p) => txn.addLayer(p, { keepSource: true }));
    const up = await commitUpper(txn, spec.layers, upperPaths(boot.workDir));
    const tpl = {
      name: source.templateID,
      dir: "",
      rootfsPath: "",
      rootLayers: spec.layers,
      bootArgs: spec.bootArgs,
      diskBytes: spec.diskBytes,
      buildKey: source.buildID,
      snapshot: null,
      cpuCount: spec.cpuCount,
      memoryMB: spec.memoryMB,
    };
    const vmInfo = { driver: boot.driver, vcpus: spec.cpuCount, memoryMiB: spec.memoryMB, kernelKey: fromBoot ? fromBoot.vm.kernelKey : kernelKey(boot.kernelPath), mac: boot.mac };
    const made = templateManifest(tpl, vmInfo, [...lowers, ...(up ? [up.layer] : [])], cap);
    const m: SnapshotManifest = fromBoot
      ? { ...made, memory: { ...made.memory!, layers: [...fromBoot.memory!.layers, cap.memory] }, tools: fromBoot.tools!, toolsKey: fromBoot.toolsKey! }
      : { ...made, tools: txn.addLayer(boot.toolsImage, { keepSource: true }), toolsKey: toolsKeyOf(boot.toolsImage) };
    source.record(m.id);
    txn.publish(m);
    return { snapshotId: m.id, memoryBytes: cap.changedBytes };
  } catch (e) {
    txn.abort();
    throw e;
  }
}
