/**
 * preadv2(2) into memory by address, optionally with RWF_NOWAIT (read only what the page cache
 * holds; never block on I/O). For a ublk queue thread that answers page-cached reads at once and
 * hands the rest to io_uring. Values: RWF_NOWAIT 0x8 (include/uapi/linux/fs.h); EAGAIN 11 (would
 * block), EOPNOTSUPP 95 (the file system cannot read without blocking, e.g. tmpfs on 6.1);
 * struct iovec = { void *iov_base; size_t iov_len } (16 bytes on x86_64).
 */
import type { Pointer } from "bun:ffi";
import { errno, libc } from "./libc.ts";
import { mapMemory, unmapMemory, type Mapping } from "./mmap.ts";

/** preadv2 flag: fail with EAGAIN instead of waiting for I/O. */
export const RWF_NOWAIT = 0x8;

/** A reader with its own iovec scratch (one per thread; not thread-safe). */
export class AddressReader {
  #iov: Mapping;
  #words: Uint32Array;
  #closed = false;

  constructor() {
    this.#iov = mapMemory(16);
    this.#words = new Uint32Array(this.#iov.buffer, 0, 4);
  }

  /**
   * Read up to `length` bytes at file offset `offset` of `fd` into memory at `address`.
   * @returns bytes read (0 at end of file), or -errno (-11 EAGAIN with `nowait` when the data is
   * not cached, -95 EOPNOTSUPP when the file cannot be read without blocking)
   */
  read(fd: number, address: number, length: number, offset: number, nowait: boolean): number {
    const w = this.#words;
    w[0] = address % 2 ** 32;
    w[1] = Math.floor(address / 2 ** 32);
    w[2] = length;
    w[3] = 0;
    const n = Number(libc().preadv2(fd, this.#iov.ptr as unknown as Pointer, 1, offset, nowait ? RWF_NOWAIT : 0));
    return n >= 0 ? n : -errno();
  }

  /** Release the scratch memory (idempotent). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    unmapMemory(this.#iov);
  }
}
