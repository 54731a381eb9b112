/**
 * Memory mappings outside the JS heap: anonymous memory for buffers the kernel reads or writes
 * asynchronously (io_uring I/O buffers, control-command payloads: their address must not move
 * while an operation is in flight), and shared read-only mappings of device memory (the ublk
 * io-descriptor array). Values from include/uapi/asm-generic/mman-common.h and mman.h (x86_64):
 * PROT_READ 1, PROT_WRITE 2, MAP_SHARED 0x01, MAP_PRIVATE 0x02, MAP_ANONYMOUS 0x20,
 * MAP_NORESERVE 0x4000, MAP_POPULATE 0x8000.
 */
import { toArrayBuffer, type Pointer } from "bun:ffi";
import { SyscallError } from "./errors.ts";
import { errno, libc, mapFailed } from "./libc.ts";

export const PROT_READ = 1;
export const PROT_WRITE = 2;
export const MAP_SHARED = 0x01;
export const MAP_PRIVATE = 0x02;
export const MAP_ANONYMOUS = 0x20;
export const MAP_NORESERVE = 0x4000;
export const MAP_POPULATE = 0x8000;
/** Page size this code assumes (x86_64). */
export const PAGE_SIZE = 4096;


/** A failed mmap/munmap; `errno` is the raw number. */
export class MmapError extends SyscallError {}

/** One mapping: its address (a plain number, valid in every thread of the process), length and a view. */
export interface Mapping {
  /** Start address. */
  readonly ptr: number;
  /** Length in bytes. */
  readonly length: number;
  /** The mapped bytes (no copy). */
  readonly buffer: ArrayBuffer;
}

/** Round `n` up to a multiple of the page size. */
export function pageAlign(n: number): number {
  return Math.ceil(n / PAGE_SIZE) * PAGE_SIZE;
}

/**
 * Map `length` bytes (rounded up to pages) of `fd` at `offset`, or of anonymous zeroed memory
 * when `fd` is -1.
 * @throws MmapError with the errno (EINVAL for a size or offset the device refuses, EPERM for a
 * forbidden protection)
 */
export function mapMemory(length: number, opts: { fd?: number; offset?: number; prot?: number; flags?: number } = {}): Mapping {
  const len = pageAlign(length);
  const fd = opts.fd ?? -1;
  const flags = opts.flags ?? (fd < 0 ? MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE : MAP_SHARED);
  const p = libc().mmap(null, len, opts.prot ?? PROT_READ | PROT_WRITE, flags, fd, opts.offset ?? 0) as Pointer | null;
  if (mapFailed(p)) throw new MmapError("mmap", errno());
  return { ptr: Number(p), length: len, buffer: toArrayBuffer(p, 0, len) };
}

/**
 * Wrap memory another thread of this process mapped (its `ptr` and `length`) without mapping
 * it again; valid until that mapping is unmapped.
 */
export function viewMemory(address: number, length: number): ArrayBuffer {
  return toArrayBuffer(address as unknown as Pointer, 0, length);
}

/**
 * Unmap a mapping; views over it must not be used afterwards.
 * @throws MmapError on failure
 */
export function unmapMemory(m: Pick<Mapping, "ptr" | "length">): void {
  if (libc().munmap(m.ptr as unknown as Pointer, m.length) !== 0) throw new MmapError("munmap", errno());
}
