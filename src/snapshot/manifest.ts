/**
 * The committed snapshot: a manifest naming content-addressed layer files (sha256) for the root
 * disk (overlaybd layers, bottom first), the guest memory (overlaybd layers over the RAM image,
 * bottom first) and the VMM device state, plus the VM shape needed to restore it. Manifests are
 * immutable once committed; plain JSON (`manifests/<id>.json` in a repository).
 */
import { SnapshotError } from "./errors.ts";

/** Version of the manifest format written here. */
export const MANIFEST_VERSION = 1;

/**
 * Why a snapshot exists:
 * - `template`: a template's committed state (`template build-base`, or the disk-only snapshot
 *   made for a template that has none)
 * - `user`: `POST /sandboxes/{id}/snapshots`; listed, kept until deleted
 * - `pause`: the state of one paused sandbox; deleted with it or when it resumes and pauses again
 * - `fork`: the checkpoint children of one fork start from; removed once no sandbox uses it
 * - `boot`: a VM of one shape booted up to envd with no root filesystem mounted
 *   (src/sandbox/boot-snapshot.ts); a cold boot of any template restores it and mounts its disk
 */
export type SnapshotKind = "template" | "user" | "pause" | "fork" | "boot";

/** A layer file in a repository: `sha256:<64 hex>` of its bytes and its size in bytes. */
export interface LayerRef {
  digest: string;
  size: number;
}

/** A committed snapshot. Sizes in bytes. */
export interface SnapshotManifest {
  version: typeof MANIFEST_VERSION;
  id: string;
  kind: SnapshotKind;
  /** Snapshot this one descends from (the tree of checkpoints); null for a root. */
  parent: string | null;
  /** RFC 3339. */
  createdAt: string;
  /** User-given names (`my-snapshot`, `team/my-snapshot:v1`), may be empty. */
  names: string[];
  /** Sandbox it was taken from (null for a template's own snapshot) and the template it descends from. */
  source: { sandboxId: string | null; templateId: string };
  vm: {
    driver: "qemu" | "firecracker";
    /**
     * `VmmDriver.machineKey` of the VM a template or boot snapshot captured (absent: made before
     * the key existed); one made under another key is made again.
     */
    machine?: string;
    vcpus: number;
    memoryMiB: number;
    /** sha256 prefix of the guest kernel the memory image was booted with. */
    kernelKey: string;
    /** Guest MAC (the guest keeps it across restores). */
    mac: string;
    /** Kernel command line of the template (for a cold boot from a disk-only snapshot). */
    bootArgs: string;
    /**
     * Kind `boot` only: how many placeholder volume drives the captured VM had after its tools
     * drive and root disk (`vol0`, `vol1`, ...); a restore attaches that many volumes in their
     * place (0..MAX_VOLUME_SLOTS). Absent: none.
     */
    volumeSlots?: number;
  };
  envd: {
    version: string;
    /**
     * Token envd requires at snapshot time (null: open). Needed to re-initialise a restored
     * envd; the memory layers hold it anyway, so the manifest exposes nothing they do not.
     */
    accessToken: string | null;
  };
  disk: { virtualSize: number; layers: LayerRef[] };
  /** Guest RAM image, null for a disk-only snapshot (a restore boots from the disk). */
  memory: { size: number; layers: LayerRef[] } | null;
  /** VMM device state (QEMU migration stream without guest RAM); null when memory is null. */
  vmState: LayerRef | null;
  /**
   * The tools drive image (read-only ext4 carrying init and envd) the captured VM booted through,
   * attached again by a restore (the guest has it mounted); absent: no tools drive (a cold boot
   * takes the node's current one).
   */
  tools?: LayerRef;
  /**
   * Key of the node's tools drive build (src/tools) that `tools` is a copy of (kinds `template`, `boot`):
   * a template snapshot is current only while the node's tools drive is this one, so a new
   * agentenv (init, envd) reaches restored sandboxes.
   */
  toolsKey?: string;
  /** Build key of the template this snapshot is the state of (kind `template`), else absent. */
  templateBuild?: string;
  /**
   * Kind `pause` only: the paused sandbox's record (settings, envd token, env vars, lifecycle,
   * network policy) and what its runtime needs to resume it, as JSON its node's orchestrator and
   * runtime write and read back (src/orchestrator/portable.ts). With it, a node that finds this
   * snapshot in a shared store can resume the sandbox under the same id. Absent: the sandbox
   * cannot move to another node (volumes attached, or written before sandboxes could move).
   */
  sandbox?: Record<string, unknown>;
}

/** Snapshot ids: 20 lowercase letters and digits, like sandbox ids (valid as E2B template ids). */
export const SNAPSHOT_ID_RE = /^[a-z0-9]{20}$/;
/** Most placeholder volume drives a boot snapshot may have (`vm.volumeSlots`): the most volumes a sandbox may mount (`[volumes] max_mounts_per_sandbox`'s maximum). */
export const MAX_VOLUME_SLOTS = 16;
/** Layer digests. */
export const DIGEST_RE = /^sha256:[0-9a-f]{64}$/;
/** User snapshot names: a path-like name with an optional `:tag`. */
export const SNAPSHOT_NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(\/[A-Za-z0-9][A-Za-z0-9._-]{0,63})?(:[A-Za-z0-9._-]{1,64})?$/;

const ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789";

/** A new random snapshot id. */
export function newSnapshotId(): string {
  let s = "";
  for (const b of crypto.getRandomValues(new Uint8Array(20))) s += ALNUM[b % ALNUM.length];
  return s;
}

/** The hex part of a digest (its file name in a repository). */
export function digestHex(ref: LayerRef | string): string {
  const d = typeof ref === "string" ? ref : ref.digest;
  return d.slice("sha256:".length);
}

/** Every layer a manifest names, deduplicated by digest. */
export function layersOf(m: SnapshotManifest): LayerRef[] {
  const all = [...m.disk.layers, ...(m.memory?.layers ?? []), ...(m.vmState ? [m.vmState] : []), ...(m.tools ? [m.tools] : [])];
  return [...new Map(all.map((l) => [l.digest, l])).values()];
}

/**
 * Validate a parsed manifest.
 * @throws SnapshotError `snapshot.bad_manifest` naming the field at fault
 */
export function parseManifest(v: unknown, where: string): SnapshotManifest {
  const bad = (field: string): never => {
    throw new SnapshotError("snapshot.bad_manifest", `snapshot manifest ${where}: invalid ${field}`, { where, field });
  };
  if (typeof v !== "object" || v === null) bad("document");
  const m = v as Record<string, any>;
  if (m.version !== MANIFEST_VERSION) bad("version");
  if (typeof m.id !== "string" || !SNAPSHOT_ID_RE.test(m.id)) bad("id");
  if (!["template", "user", "pause", "fork", "boot"].includes(m.kind)) bad("kind");
  if (m.parent !== null && (typeof m.parent !== "string" || !SNAPSHOT_ID_RE.test(m.parent))) bad("parent");
  if (typeof m.createdAt !== "string" || Number.isNaN(Date.parse(m.createdAt))) bad("createdAt");
  if (!Array.isArray(m.names) || !m.names.every((n: unknown) => typeof n === "string" && SNAPSHOT_NAME_RE.test(n))) bad("names");
  if (typeof m.source !== "object" || m.source === null || (m.source.sandboxId !== null && typeof m.source.sandboxId !== "string") || typeof m.source.templateId !== "string") bad("source");
  const vm = m.vm;
  if (typeof vm !== "object" || vm === null) bad("vm");
  if (vm.driver !== "qemu" && vm.driver !== "firecracker") bad("vm.driver");
  for (const k of ["vcpus", "memoryMiB"]) if (!Number.isInteger(vm[k]) || vm[k] < 1) bad(`vm.${k}`);
  for (const k of ["kernelKey", "mac", "bootArgs"]) if (typeof vm[k] !== "string") bad(`vm.${k}`);
  if (vm.machine !== undefined && (typeof vm.machine !== "string" || !/^[0-9a-f]{16}$/.test(vm.machine))) bad("vm.machine");
  if (vm.volumeSlots !== undefined && (!Number.isInteger(vm.volumeSlots) || vm.volumeSlots < 0 || vm.volumeSlots > MAX_VOLUME_SLOTS || m.kind !== "boot")) bad("vm.volumeSlots");
  if (typeof m.envd !== "object" || m.envd === null || typeof m.envd.version !== "string" || (m.envd.accessToken !== null && typeof m.envd.accessToken !== "string")) bad("envd");
  const layer = (l: unknown, field: string) => {
    const x = l as Record<string, unknown>;
    if (typeof x !== "object" || x === null || typeof x.digest !== "string" || !DIGEST_RE.test(x.digest) || !Number.isSafeInteger(x.size) || (x.size as number) < 0) bad(field);
  };
  if (typeof m.disk !== "object" || m.disk === null || !Number.isSafeInteger(m.disk.virtualSize) || !Array.isArray(m.disk.layers) || m.disk.layers.length === 0) bad("disk");
  m.disk.layers.forEach((l: unknown, i: number) => layer(l, `disk.layers[${i}]`));
  if (m.memory !== null) {
    if (typeof m.memory !== "object" || !Number.isSafeInteger(m.memory.size) || !Array.isArray(m.memory.layers) || m.memory.layers.length === 0) bad("memory");
    m.memory.layers.forEach((l: unknown, i: number) => layer(l, `memory.layers[${i}]`));
    if (m.vmState === null) bad("vmState");
    layer(m.vmState, "vmState");
  } else if (m.vmState !== null) bad("vmState");
  if (m.tools !== undefined) layer(m.tools, "tools");
  if (m.templateBuild !== undefined && typeof m.templateBuild !== "string") bad("templateBuild");
  if (m.toolsKey !== undefined && typeof m.toolsKey !== "string") bad("toolsKey");
  if (m.sandbox !== undefined && (typeof m.sandbox !== "object" || m.sandbox === null || Array.isArray(m.sandbox) || m.kind !== "pause" || m.source.sandboxId === null)) bad("sandbox");
  return m as SnapshotManifest;
}
