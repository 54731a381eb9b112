/**
 * The contract between a block image (an overlaybd stack, a raw file, a memory image) and the
 * servers that export it to a VM (FUSE file, NBD, ublk). Offsets and lengths are in bytes.
 * Implementations throw their subsystem's typed error (e.g. `OverlaybdError`) on failure and
 * never return wrong bytes silently.
 */
export interface BlockImage {
  /** Virtual size in bytes (a multiple of 512). */
  readonly size: number;
  /** True when writes are refused. */
  readonly readOnly: boolean;
  /** Fill `buf` from virtual offset `offset`; returns bytes read (short only at the end). */
  pread(buf: Uint8Array, offset: number): Promise<number>;
  /** Write `buf` at virtual offset `offset`; returns bytes written. Throws when read-only. */
  pwrite(buf: Uint8Array, offset: number): Promise<number>;
  /** Mark [offset, offset+length) as zero (discard/trim); later reads return zeros. */
  discard(offset: number, length: number): Promise<void>;
  /**
   * Where offered: grow the virtual size to `newSize` bytes (a multiple of 512, not below `size`),
   * durably (a reopened image has it). The new range reads as zeros until written.
   */
  grow?(newSize: number): Promise<void>;
  /** Persist every completed write (data and index). */
  sync(): Promise<void>;
  /** Release files and memory; the image is unusable afterwards. */
  close(): Promise<void>;
}
