/**
 * What a FUSE connection (connection.ts) serves and how: the kinds of image it can serve faster
 * (a plain backing file, synchronous reads), the direct plan its reader threads answer from, its
 * options and their checks, and its counters.
 */
import type { BlockImage } from "../block.ts";
import { FuseError } from "./errors.ts";

/** A plain file holding the image's bytes 1:1 (offset = file offset). */
export interface DirectFile {
  /** Open fd of the file; valid until the image's `close()`. */
  fd: number;
  /** True when the fd must not be written. */
  readOnly: boolean;
}

/**
 * A BlockImage whose bytes are one plain file: reader threads may pread/pwrite its fd directly
 * (the fd is shared by every thread of the process). `directFile()` returns null when that is
 * not possible.
 */
export interface DirectFileImage extends BlockImage {
  directFile(): DirectFile | null;
}

/** A BlockImage that can read synchronously (same range rules and errors as `pread`). */
export interface SyncReadImage extends BlockImage {
  preadSync(buf: Uint8Array, offset: number): number;
  /** False when some part of the image needs asynchronous reads (then `preadSync` throws). */
  readonly syncReadable?: boolean;
}

/**
 * Where the image's bytes live in plain files, for reader threads answering READ without the
 * main thread. Valid while the image is open (the connection stops using it before `image.close()`).
 */
export interface DirectPlan {
  /** Sorted, non-overlapping extents in bytes; virtual bytes outside every extent read as zeros. */
  extents: Array<{ offset: number; length: number; fd: number; fileOffset: number }>;
  /** fd that WRITE goes to at the same virtual offset (a raw file); absent: WRITE via the image. */
  writeFd?: number;
  /** A file shorter than its extent reads as zeros past its end (overlaybd); false: short reply (raw). */
  zeroFill: boolean;
  /**
   * Byte ranges that already differ from `extents` (an overlaybd upper's mapped segments): READ
   * there goes to the image. Ranges later written or discarded through the image are added.
   */
  diverted: Array<[number, number]>;
}

/** Size of a block of the diverted-reads bitmap (bytes). */
export const DIRTY_BLOCK = 4096;

/** The direct plan of an image that offers its backing file (`DirectFileImage`), or null. */
export function directFileOf(img: BlockImage): DirectPlan | null {
  const d = (img as Partial<DirectFileImage>).directFile;
  const f = typeof d === "function" ? d.call(img) : null;
  if (!f) return null;
  return { extents: [{ offset: 0, length: img.size, fd: f.fd, fileOffset: 0 }], writeFd: f.readOnly || img.readOnly ? undefined : f.fd, zeroFill: false, diverted: [] };
}

/** Whether `img` can answer READ synchronously (a `SyncReadImage` that says so). */
export function canReadSync(img: BlockImage): img is SyncReadImage {
  const s = img as Partial<SyncReadImage>;
  return typeof s.preadSync === "function" && s.syncReadable !== false;
}

/** What a connection serves and how. */
export interface ServeOptions {
  /** Name of the single file inside the mount, e.g. "root.img". */
  fileName: string;
  image: BlockImage;
  /** Open the file with FOPEN_DIRECT_IO (no page cache on the host for this file). */
  directIo: boolean;
  /** Direct-read plan for the reader threads; default: from `image.directFile()` when offered. */
  direct?: DirectPlan;
  /**
   * For a read-only image: accept read-write opens anyway (WRITE still gets EROFS). A VMM maps a
   * guest-RAM file MAP_PRIVATE but opens it O_RDWR (QEMU memory-backend-file,share=off). A hole
   * punch (PUNCH_HOLE|KEEP_SIZE) is then a discard hint: answered as done, the image unchanged.
   * QEMU 7.2 gives guest RAM a guest reported free (virtio-balloon free page reporting) back by
   * punching the range in its RAM file and then dropping the range from its mapping
   * (ram_block_discard_range: fallocate, then madvise DONTNEED; a failed fallocate stops it
   * before the madvise): the madvise frees the VM's private copies of those pages; the kernel
   * drops the range from this file's page cache (other VMs mapping it read it again through
   * READ), and every reader still reads the image's bytes. docs/density.md.
   */
  acceptWritableOpen?: boolean;
}

/** Options of one connection. */
export interface FuseConnectionOptions {
  /** The /dev/fuse fd of a mounted connection (see `mountFuse`); the caller owns it. */
  fd: number;
  /** Mount point, for logs and `path`. */
  mountPoint: string;
  /** Largest READ/WRITE payload in bytes (4096..1048576, a multiple of 4096): the INIT reply's max_write. */
  maxWrite: number;
  /** Kernel request timeout in seconds (0 = none; needs protocol 7.43). */
  requestTimeoutSec: number;
  /** Readahead window of the mount once INIT is answered, KiB (0 = the kernel's 128 KiB); see `setReadAheadKb`. */
  readAheadKb?: number;
  /**
   * A replacement server of a live connection (the kernel sends no second INIT): first ask the
   * kernel to re-queue every request the previous server read but never answered
   * (FUSE_NOTIFY_RESEND, kernel 6.9+).
   */
  resume: boolean;
  /** What to serve now; absent = an empty directory until `bind`. */
  serve?: ServeOptions;
}

/** Counters of served requests, for tests and metrics. */
export interface FuseStats {
  /** READ requests answered with data. */
  reads: number;
  writes: number;
  /** bytes */
  bytesRead: number;
  /** bytes */
  bytesWritten: number;
  fsyncs: number;
  /** PUNCH_HOLE / ZERO_RANGE requests done (on a read-only image: discard hints, nothing changed). */
  discards: number;
  /** OPEN requests of the file (each open(2) by a VMM or reader). */
  opens: number;
  errors: number;
  /** READs of those answered by splice(2) (file pages into /dev/fuse through a pipe). */
  splicedReads: number;
}

/** @throws FuseError `fuse.bad_options` naming the option that is out of range */
export function validate(o: FuseConnectionOptions): void {
  const bad = (why: string) => new FuseError("fuse.bad_options", `invalid FUSE connection options: ${why}`, { mountPoint: o.mountPoint, maxWrite: o.maxWrite, fd: o.fd });
  if (!Number.isInteger(o.fd) || o.fd < 0) throw bad("fd must be an open /dev/fuse fd");
  if (!o.mountPoint.startsWith("/")) throw bad("mountPoint must be absolute");
  if (!Number.isInteger(o.maxWrite) || o.maxWrite < 4096 || o.maxWrite > 1 << 20 || o.maxWrite % 4096) {
    throw bad("maxWrite must be a multiple of 4096 in 4096..1048576");
  }
  if (!Number.isInteger(o.requestTimeoutSec) || o.requestTimeoutSec < 0 || o.requestTimeoutSec > 65535) throw bad("requestTimeoutSec must be 0..65535");
  if (o.readAheadKb !== undefined && (!Number.isInteger(o.readAheadKb) || o.readAheadKb < 0 || o.readAheadKb > 65536)) throw bad("readAheadKb must be 0..65536");
}

/** @throws FuseError `fuse.bad_options` for a file name that is not plain, or an image size not a multiple of 512 */
export function validateServe(s: ServeOptions): void {
  const bad = (why: string) => new FuseError("fuse.bad_options", `invalid FUSE export options: ${why}`, { fileName: s.fileName });
  if (!s.fileName || s.fileName.includes("/") || s.fileName === "." || s.fileName === ".." || s.fileName.includes("\0")) {
    throw bad("fileName must be a plain file name");
  }
  if (s.image.size % 512 !== 0) throw bad("image size must be a multiple of 512");
}
