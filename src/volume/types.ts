/**
 * Plain data of volumes: an entry of a volume's filesystem (E2B `VolumeEntryStat`), the options
 * of writes, and the file operations the content API performs, whichever side does them (the
 * node on a host mount, or the mounting sandbox's envd).
 * Paths are volume-relative, "/" being the volume's root. Times are unix ms; mode is the
 * permission bits (07777); uid/gid numeric.
 */

export type VolumeEntryType = "file" | "directory" | "symlink" | "unknown";

export interface VolumeEntry {
  name: string;
  /** Volume-relative path, e.g. "/data/a.txt" ("/" for the root). */
  path: string;
  type: VolumeEntryType;
  /** Bytes. */
  size: number;
  mode: number;
  uid: number;
  gid: number;
  atime: number;
  mtime: number;
  ctime: number;
  /** Symlink target, as stored. */
  target?: string;
}

/** Owner and permission bits to set; absent fields are left as they are (or defaulted on create). */
export interface VolumeMetadata {
  uid?: number;
  gid?: number;
  mode?: number;
}

/** makeDir: `force` creates missing parents and accepts an existing directory. writeFile: `force` creates missing parents. */
export interface VolumeWriteOptions extends VolumeMetadata {
  force?: boolean;
}

/** File operations on one volume (E2B's volume content API). Each throws `VolumeError`. */
export interface VolumeFiles {
  /** Entries below `path`, `depth` levels deep (1 = its children), sorted by path. */
  list(path: string, depth: number): Promise<VolumeEntry[]>;
  stat(path: string): Promise<VolumeEntry>;
  makeDir(path: string, opts: VolumeWriteOptions): Promise<VolumeEntry>;
  /** The file's bytes as a stream (the stream ends the operation). */
  readFile(path: string): Promise<{ size: number; stream: ReadableStream<Uint8Array> }>;
  /** Create or replace a file with `body` (null = empty). */
  writeFile(path: string, body: ReadableStream<Uint8Array> | null, opts: VolumeWriteOptions): Promise<VolumeEntry>;
  /** Remove a file, symlink or directory tree. */
  remove(path: string): Promise<void>;
  setMetadata(path: string, meta: VolumeMetadata): Promise<VolumeEntry>;
}
