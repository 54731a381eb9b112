/**
 * The disk-export interface: how the daemon turns an open BlockImage into something a VMM opens
 * (a file on a FUSE mount, or a /dev/ublkbN block device). One implementation per engine:
 * ./fuse-engine.ts, ./ublk-engine.ts (over src/storage/ublk). The daemon owns images and rows; an
 * engine owns the kernel objects (mounts and connections, ublk devices and queue threads).
 */
import type { BlockImage } from "../block.ts";
import type { DirectPlan } from "../fuse/index.ts";
import type { EngineName } from "./protocol.ts";
import type { DeviceRow } from "./store.ts";

/** Counters every engine reports (bytes, requests). */
export interface EngineStats {
  reads: number;
  bytesRead: number;
  writes: number;
  bytesWritten: number;
  fsyncs: number;
  discards: number;
  /** Opens of the exported file/device seen by the engine (0 where it cannot see them). */
  opens: number;
  errors: number;
  /** READs answered without copying through the server (FUSE splice); 0 where not done. */
  splicedReads: number;
}

/** Where and how to export an image. */
export interface PlaceSpec {
  /** Device id (names mounts and logs). */
  devId: string;
  /** FUSE: directory to mount on; FUSE: name of the file in it. */
  mountPoint: string;
  fileName: string;
  /** FUSE: FOPEN_DIRECT_IO. */
  directIo: boolean;
  /** A read-only image that accepts read-write opens (guest RAM mapped MAP_PRIVATE). */
  acceptWritableOpen: boolean;
  /** FUSE: plain-file extents reader threads may answer from. */
  direct?: DirectPlan;
}

/** One exported image (or a pre-created export waiting for one). */
export interface EngineDevice {
  /** What a VMM opens (null while a pre-created export has no image). */
  readonly path: string | null;
  /** Engine facts to persist for recovery and clean-up (JSON). */
  readonly engineState: Record<string, unknown>;
  /** FUSE: this process's fd of the connection (a holder copies it). */
  readonly fuseFd?: number;
  /** The image served (null for a pre-created export). */
  readonly image: BlockImage | null;
  /**
   * Resolves with a reason when the kernel object stopped being served: after `destroy` or
   * `detach`, or on its own (a FUSE connection aborted or unmounted from outside, a ublk device
   * stopped or its queues gone), which makes the device lost to its users.
   */
  readonly ended: Promise<string>;
  stats(): EngineStats;
  /** Run `op` with no image mutation in flight (used around a restack). */
  exclusive<T>(op: () => Promise<T>): Promise<T>;
  /** The image's layers changed (restack): refresh what the engine derived from them. */
  refresh(direct: DirectPlan | undefined): void;
  /**
   * Grow the image to `newSize` bytes (a multiple of 512, above its size) and let the kernel
   * see the new size; no image mutation runs meanwhile.
   * @throws DiskError `disk.unsupported` when the engine cannot resize a live device; the image's error
   */
  grow(newSize: number): Promise<void>;
  /**
   * Give a pre-created export its image and place (FUSE: the mount appears at
   * `place.mountPoint` as well; ublk: the device gets the image's size and starts).
   * @throws DiskError `disk.unsupported` when the engine cannot; the engine's error (the export
   *   is then unusable: destroy it)
   */
  bind(image: BlockImage, place: PlaceSpec): Promise<void>;
  /**
   * Stop serving and close the image (synced), but leave the kernel objects to a restarted
   * daemon (FUSE: the holder's copy of the connection keeps the mount). Idempotent.
   */
  detach(): Promise<void>;
  /**
   * Stop serving, close the image (synced), and remove the kernel objects. The device must no
   * longer be in use by a VMM. Idempotent.
   */
  destroy(): Promise<void>;
}

/** An export engine. */
export interface ExportEngine {
  readonly name: EngineName;
  /** Export `image` as `place` describes. */
  create(image: BlockImage, place: PlaceSpec): Promise<EngineDevice>;
  /** A pre-created export without an image (warm pool), or null when the engine has none. */
  precreate(devId: string, mountPoint: string): Promise<EngineDevice | null>;
  /**
   * Serve a device again after the daemon restarted, from its row (`image` reopened by the
   * caller).
   * @throws any error when it cannot be recovered; the caller then calls `cleanup(row)`
   */
  recover(row: DeviceRow, image: BlockImage, place: PlaceSpec): Promise<EngineDevice>;
  /** Remove what a device of `row` left in the kernel (mounts, devices) when it cannot be recovered. Never throws. */
  cleanup(row: DeviceRow): Promise<void>;
  /**
   * Remove what this engine's earlier daemons left in the kernel that no row names (a crash
   * between making a kernel object and recording it in its row); `rows` are every device the
   * daemon keeps. Called at start, after recovery.
   * @returns what was removed, for the log
   */
  sweep(rows: DeviceRow[]): Promise<string[]>;
  /**
   * Stop engine-wide resources (threads, control channels). Devices must be destroyed first, or
   * detached (`opts.detached`: they stay in the kernel for the next daemon).
   */
  close(opts: { detached: boolean }): Promise<void>;
}
