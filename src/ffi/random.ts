/**
 * The kernel random generator's ioctls on /dev/urandom (drivers/char/random.c,
 * include/uapi/linux/random.h): RNDADDENTROPY mixes bytes into the input pool and credits them
 * as entropy; RNDRESEEDCRNG makes the base CRNG take a new key from the input pool at once, so the
 * next read of every CPU's CRNG (getrandom, /dev/urandom, /proc/sys/kernel/random/uuid) comes
 * from the new key. Both need CAP_SYS_ADMIN. envd calls them with host bytes on every /init: a
 * guest restored from a snapshot otherwise runs on the CRNG state it was captured with, the same
 * in every clone.
 */
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errno, libc } from "./libc.ts";

/** `_IOW('R', 0x03, int[2])`: struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }. */
export const RNDADDENTROPY = 0x40085203;
/** `_IO('R', 0x07)`. */
export const RNDRESEEDCRNG = 0x5207;
/** Offsets in struct rand_pool_info (include/uapi/linux/random.h). */
const ENTROPY_COUNT = 0;
const BUF_SIZE = 4;
const BUF = 8;
/** Largest buffer RNDADDENTROPY takes in one call (the input pool is 256 bits; more only mixes). */
export const MAX_ENTROPY_BYTES = 4096;
const O_RDWR = 2;
const O_CLOEXEC = 0o2000000;

/** A failed random-generator call; `details.call` names it, `details.errno` the C errno. */
export class RandomError extends AgentEnvError<FfiCodes<"random">> {
  constructor(call: string, readonly errno: number) {
    super("random.failed", `${call} failed: errno ${errno}`, { call, errno });
  }
}

/** struct rand_pool_info holding `bytes`, credited as 8 bits of entropy per byte. */
export function encodeRandPoolInfo(bytes: Uint8Array): Uint8Array {
  const out = new Uint8Array(BUF + bytes.length);
  const v = new DataView(out.buffer);
  v.setInt32(ENTROPY_COUNT, bytes.length * 8, true);
  v.setInt32(BUF_SIZE, bytes.length, true);
  out.set(bytes, BUF);
  return out;
}

/**
 * Mix `bytes` (1..MAX_ENTROPY_BYTES) into the kernel's input pool, credited, then reseed the CRNG
 * from it. `device` is the random device to open (tests may pass another path to see the errors).
 * @throws RandomError `random.failed` (call `open`, `RNDADDENTROPY` or `RNDRESEEDCRNG`, with
 *   errno: EPERM without CAP_SYS_ADMIN, ENODATA when the CRNG is not initialised yet, ENOTTY
 *   for a file that is not a random device); RangeError for an empty or too large buffer.
 */
export function reseedKernelRandom(bytes: Uint8Array, device = "/dev/urandom"): void {
  if (bytes.length === 0 || bytes.length > MAX_ENTROPY_BYTES) throw new RangeError(`entropy must be 1..${MAX_ENTROPY_BYTES} bytes, got ${bytes.length}`);
  const c = libc();
  const fd = c.open(Buffer.from(`${device}\0`), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) throw new RandomError("open", errno());
  try {
    if (c.ioctl(fd, RNDADDENTROPY, encodeRandPoolInfo(bytes)) !== 0) throw new RandomError("RNDADDENTROPY", errno());
    if (c.ioctl(fd, RNDRESEEDCRNG, null) !== 0) throw new RandomError("RNDRESEEDCRNG", errno());
  } finally {
    c.close(fd);
  }
}
