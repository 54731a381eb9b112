/**
 * File-extent system calls Bun's fs does not expose: lseek(2) with SEEK_DATA/SEEK_HOLE and the
 * FICLONE ioctl (reflink) and fallocate(2) hole punching. Values from include/uapi/linux/fs.h and
 * include/uapi/linux/falloc.h: SEEK_DATA 3, SEEK_HOLE 4, FICLONE _IOW(0x94, 9, int) = 0x40049409,
 * FALLOC_FL_KEEP_SIZE 1, FALLOC_FL_PUNCH_HOLE 2.
 */
import type { Pointer } from "bun:ffi";
import { SyscallError } from "./errors.ts";
import { errno, libc } from "./libc.ts";

const SEEK_DATA = 3;
const SEEK_HOLE = 4;
const FICLONE = 0x40049409;
const ENXIO = 6;



export { SyscallError };

/**
 * The data extents of an open file in [0, size), from SEEK_DATA/SEEK_HOLE. Filesystems without
 * hole support report one extent covering the file.
 * @param fd an open file descriptor
 * @param size file size in bytes
 * @returns sorted, non-overlapping [start, end) byte ranges holding data
 * @throws SyscallError on an lseek failure other than ENXIO (no more data)
 */
export function dataExtents(fd: number, size: number): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  let pos = 0;
  while (pos < size) {
    const d = Number(libc().lseek(fd, pos, SEEK_DATA));
    if (d < 0) {
      const e = errno();
      if (e === ENXIO) break;
      throw new SyscallError("lseek(SEEK_DATA)", e);
    }
    if (d >= size) break;
    let h = Number(libc().lseek(fd, d, SEEK_HOLE));
    if (h < 0) throw new SyscallError("lseek(SEEK_HOLE)", errno());
    h = Math.min(h, size);
    out.push([d, h]);
    pos = h;
  }
  return out;
}

/**
 * Make `dstFd` share `srcFd`'s extents (ioctl FICLONE).
 * @returns 0 on success, else the errno (EOPNOTSUPP 95 / EXDEV 18 / EINVAL 22 where not supported)
 */
export function ficlone(dstFd: number, srcFd: number): number {
  // the int argument travels as a pointer-sized value (ioctl is variadic)
  const r = libc().ioctl(dstFd, FICLONE, srcFd as unknown as Pointer);
  return r === 0 ? 0 : errno();
}

const FALLOC_FL_KEEP_SIZE = 1;
const FALLOC_FL_PUNCH_HOLE = 2;

/**
 * Deallocate [offset, offset+length) bytes of an open file (reads return zeros; size unchanged).
 * @throws SyscallError with the errno (EOPNOTSUPP 95 where the filesystem cannot punch holes)
 */
export function punchHole(fd: number, offset: number, length: number): void {
  if (libc().fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) !== 0) throw new SyscallError("fallocate(PUNCH_HOLE)", errno());
}
