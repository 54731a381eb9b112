/**
 * Turning a paused VM and its disk upper into snapshot layers: the VMM's device state, a memory
 * layer (the whole RAM of a booted VM, or the pages a restored VM changed, over the image it
 * maps) and a disk layer (the upper's live data, compacted). The caller decides what happens to
 * the VM afterwards (stop for a pause, resume for a snapshot or fork).
 */
import { readFileSync, statSync } from "node:fs";
import { logger } from "../observability/log.ts";
import { ENVD_VERSION } from "../envd/version.ts";
import { type CommitTxn, type LayerRef, type LocalRepository, newSnapshotId, type SnapshotManifest, writeMemoryLayer } from "../snapshot/index.ts";
import type { ResolvedTemplate } from "../template/index.ts";
import { LayeredImage, openRoLayerFile, RwLayer, type RoLayer, type UpperPaths } from "../storage/overlaybd/index.ts";
import type { VmHandle } from "../vmm/index.ts";

const log = logger("sandbox.capture");

/** Layers a capture added to a commit, with what it cost. Sizes in bytes, times in ms. */
export interface CapturedVm {
  vmState: LayerRef;
  memory: LayerRef;
  /** Guest RAM bytes the memory layer covers (pages changed since the parent image). */
  changedBytes: number;
  /** Bytes written for the state and memory layer files. */
  bytesWritten: number;
  stateMs: number;
  memoryMs: number;
}

/**
 * Capture the paused `vm` into `txn`: device state, then its memory layer over `parentMemory`
 * (layer paths of the image it was restored from, bottom first; empty for a booted VM).
 * @param memorySize guest RAM in bytes
 * @throws VmmError from the VMM, OverlaybdError / SnapshotError from writing the layers
 */
export async function captureVm(vm: VmHandle, txn: CommitTxn, memorySize: number, parentMemory: string[]): Promise<CapturedVm> {
  const t0 = performance.now();
  const statePath = txn.file("vmstate");
  const capture = await vm.captureSnapshot(statePath);
  const t1 = performance.now();
  let changedBytes: number;
  const memPath = txn.file("memory.layer");
  try {
    changedBytes = (await writeMemoryLayer(capture, memPath, { size: memorySize, parentLayers: parentMemory })).changedBytes;
  } finally {
    capture.release();
  }
  const bytesWritten = statSync(statePath).size + statSync(memPath).size;
  const vmState = txn.addLayer(statePath);
  const memory = txn.addLayer(memPath);
  const t2 = performance.now();
  log.debug({ id: vm.id, changedBytes, bytesWritten }, "VM captured");
  return { vmState, memory, changedBytes, bytesWritten, stateMs: Math.round(t1 - t0), memoryMs: Math.round(t2 - t1) };
}

/**
 * Write the live data of the upper pair `upper` (over `lowers`, bottom first) as a committed
 * layer in `txn`, reading the upper read-only (a serving child may hold it open; nothing may
 * write while this runs: the VM is paused or stopped).
 * @returns the new layer and its file size, or null when the upper holds no data
 * @throws OverlaybdError from reading the upper or writing the layer
 */
export async function commitUpper(txn: CommitTxn, lowers: string[], upper: UpperPaths): Promise<{ layer: LayerRef; bytes: number } | null> {
  const layers: RoLayer[] = [];
  let up: RwLayer | null = null;
  try {
    for (const l of lowers) layers.push(await openRoLayerFile(l));
    up = await RwLayer.open(upper.data, upper.index, { readOnly: true });
    if (up.segments.length === 0) return null;
    const img = new LayeredImage(layers, up);
    const out = txn.file("disk.layer");
    const r = await img.commit(out);
    return { layer: txn.addLayer(out), bytes: r.size };
  } finally {
    await up?.close();
    for (const l of layers) await l.lsmt.close();
  }
}

/** Name of the shared memory image of `m` (same layers, same image): 16 hex of the sha256 of its layer digests. */
export function memoryKey(m: SnapshotManifest): string {
  return memoryKeyOf(m.memory?.layers ?? []);
}

/** Name of the shared memory image of memory layers `layers` (see `memoryKey`). */
export function memoryKeyOf(layers: readonly LayerRef[]): string {
  const h = new Bun.CryptoHasher("sha256");
  for (const l of layers) h.update(l.digest);
  return h.digest("hex").slice(0, 16);
}

/** Layer paths of refs in `repo`. */
export function layerPaths(repo: LocalRepository, refs: readonly LayerRef[]): string[] {
  return refs.map((r) => repo.layerPath(r));
}

/** sha256 prefix (16 hex) of the guest kernel file at `path`, which snapshots record (a restore needs the same kernel). */
export function kernelKey(path: string): string {
  const h = new Bun.CryptoHasher("sha256");
  h.update(readFileSync(path));
  return h.digest("hex").slice(0, 16);
}

/**
 * Keys of guest kernel files, each hashed once per version of the file (inode, size, mtime):
 * the VM runtime needs its kernel's key at every snapshot and every check of a template snapshot.
 */
export class KernelKeys {
  readonly #known = new Map<string, { key: string; stamp: string }>();

  /** `kernelKey(path)`, hashed again only when the file changed. */
  of(path: string): string {
    const st = statSync(path);
    const stamp = `${st.ino}:${st.size}:${st.mtimeMs}`;
    const k = this.#known.get(path);
    if (k && k.stamp === stamp) return k.key;
    const key = kernelKey(path);
    this.#known.set(path, { key, stamp });
    return key;
  }
}

/**
 * The manifest of template `tpl`'s own snapshot (kind `template`, no parent, open envd): a
 * booted-and-captured one (`memory` + `vmState`) or a disk-only one (both null: a cold boot).
 */
export function templateManifest(
  tpl: ResolvedTemplate,
  vm: Omit<SnapshotManifest["vm"], "bootArgs">,
  disk: LayerRef[],
  captured: { memory: LayerRef; vmState: LayerRef } | null,
): SnapshotManifest {
  return {
    version: 1,
    id: newSnapshotId(),
    kind: "template",
    parent: null,
    createdAt: new Date().toISOString(),
    names: [],
    source: { sandboxId: null, templateId: tpl.name },
    vm: { ...vm, bootArgs: tpl.bootArgs },
    envd: { version: ENVD_VERSION, accessToken: null },
    disk: { virtualSize: tpl.diskBytes, layers: disk },
    memory: captured ? { size: vm.memoryMiB * 1024 * 1024, layers: [captured.memory] } : null,
    vmState: captured?.vmState ?? null,
    templateBuild: tpl.buildKey,
  };
}
