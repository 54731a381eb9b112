/**
 * clock_settime(2) of CLOCK_REALTIME: set the system clock without a child process (envd's
 * /init in a restored guest sets the clock on every create; under TCG a fork/exec of `date`
 * costs tens of milliseconds). Values: CLOCK_REALTIME 0 (include/uapi/linux/time.h);
 * struct timespec = { time_t tv_sec; long tv_nsec } (16 bytes on x86_64, both little-endian int64).
 * The kernel refuses tv_nsec outside [0, 1e9) and negative seconds with EINVAL before it checks
 * CAP_SYS_TIME (EPERM).
 */
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";

/** CLOCK_REALTIME, include/uapi/linux/time.h. */
export const CLOCK_REALTIME = 0;
/** Size of struct timespec on x86_64 and its field offsets. */
export const TIMESPEC_SIZE = 16;
const TV_SEC = 0;
const TV_NSEC = 8;

/** struct timespec for `sec` seconds and `nsec` nanoseconds (no range check: the kernel does it). */
export function encodeTimespec(sec: number, nsec: number): Uint8Array {
  const b = new Uint8Array(TIMESPEC_SIZE);
  const v = new DataView(b.buffer);
  v.setBigInt64(TV_SEC, BigInt(Math.trunc(sec)), true);
  v.setBigInt64(TV_NSEC, BigInt(Math.trunc(nsec)), true);
  return b;
}

/** The timespec of a time in ms since the epoch (sub-millisecond part kept). */
export function timespecOfMs(epochMs: number): { sec: number; nsec: number } {
  const sec = Math.floor(epochMs / 1000);
  return { sec, nsec: Math.round((epochMs - sec * 1000) * 1e6) % 1e9 };
}

/**
 * Set CLOCK_REALTIME to `sec` + `nsec` (needs CAP_SYS_TIME).
 * @throws SyscallError `clock_settime` with errno EINVAL (22) for a bad time, EPERM (1) without the capability
 */
export function setRealtimeClock(sec: number, nsec: number): void {
  if (libc().clock_settime(CLOCK_REALTIME, encodeTimespec(sec, nsec)) !== 0) throw new SyscallError("clock_settime", errno());
}
