/**
 * The one libc binding (src/ffi/libc.ts) and each wrapper's errno reporting, asserted as the exact
 * errno of an input that must fail that way.
 */
import { afterAll, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { dataExtents, ficlone, punchHole, SyscallError } from "../../src/ffi/file_extents.ts";
import { FlockError, tryFlockExclusive } from "../../src/ffi/flock.ts";
import { InotifyDecoder, InotifyFence, inotifyAddWatch, inotifyInit, InotifyError } from "../../src/ffi/inotify.ts";
import { mapMemory, MmapError, unmapMemory } from "../../src/ffi/mmap.ts";
import { mount, MountError, umount2 } from "../../src/ffi/mount.ts";
import { openPty, PtyError, resizePty } from "../../src/ffi/pty.ts";
import { getXattr, setXattr, XattrError } from "../../src/ffi/xattr.ts";
import { errno, libc } from "../../src/ffi/libc.ts";
import { encodeTimespec, setRealtimeClock, TIMESPEC_SIZE, timespecOfMs } from "../../src/ffi/clock.ts";
import { thrown } from "../helpers/thrown.ts";

const dir = mkdtempSync(join(tmpdir(), "libc-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The error `fn` throws (the test fails when it throws nothing). */
test("only src/ffi/libc.ts opens a shared library", () => {
  const root = join(import.meta.dir, "../../src");
  const offenders: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (p.endsWith(".ts") && !p.endsWith("/ffi/libc.ts") && /\bdlopen\s*\(/.test(readFileSync(p, "utf8"))) offenders.push(p);
    }
  };
  walk(root);
  expect(offenders).toEqual([]);
});

test("errno() reads the failed call's errno", () => {
  expect(libc().close(-1)).toBe(-1);
  expect(errno()).toBe(9); // EBADF
  expect(libc().flock(987654, 2)).toBe(-1);
  expect(errno()).toBe(9);
});

test("flock: a missing directory is ENOENT; a held lock answers null, not an error", () => {
  const e = thrown(() => tryFlockExclusive(join(dir, "nodir", "x.lock"))) as FlockError;
  expect(e).toBeInstanceOf(FlockError);
  expect([e.code, e.call, e.errno]).toEqual(["flock.failed", "open", 2]);
  const held = tryFlockExclusive(join(dir, "a.lock"))!;
  expect(held.fd).toBeGreaterThan(2);
  expect(tryFlockExclusive(join(dir, "a.lock"))).toBeNull();
  held.release();
  const again = tryFlockExclusive(join(dir, "a.lock"))!;
  expect(again).not.toBeNull();
  again.release();
});

test("file extents: a bad fd is EBADF; holes and FICLONE report exact values", () => {
  const e = thrown(() => punchHole(987654, 0, 4096)) as SyscallError;
  expect(e).toBeInstanceOf(SyscallError);
  expect([e.code, e.call, e.errno]).toEqual(["syscall.failed", "fallocate(PUNCH_HOLE)", 9]);
  expect(ficlone(987654, 987655)).toBe(9);
  const p = join(dir, "sparse");
  writeFileSync(p, new Uint8Array(3 * 65536).fill(7));
  const fd = openSync(p, "r+");
  try {
    punchHole(fd, 65536, 65536);
    expect(dataExtents(fd, 3 * 65536)).toEqual([
      [0, 65536],
      [131072, 196608],
    ]);
  } finally {
    closeSync(fd);
  }
  expect([...readFileSync(p).subarray(65536, 65540)]).toEqual([0, 0, 0, 0]);
});

test("inotify: a missing path is inotify.not_found with errno ENOENT", () => {
  const fd = inotifyInit();
  try {
    const e = thrown(() => inotifyAddWatch(fd, join(dir, "missing"), 0x100)) as InotifyError;
    expect(e).toBeInstanceOf(InotifyError);
    expect([e.code, e.details.errno]).toEqual(["inotify.not_found", 2]);
    expect(inotifyAddWatch(fd, dir, 0x100)).toBe(1);
  } finally {
    closeSync(fd);
  }
});

test("inotify fence: every mark is one event of its own, in queue order with the watched directory's events, even back to back; nothing appears in any directory", () => {
  const fd = inotifyInit();
  const fence = new InotifyFence(fd);
  try {
    const w = mkdtempSync(join(dir, "fence-"));
    const wd = inotifyAddWatch(fd, w, 0x100); // IN_CREATE
    expect(fence.wd).not.toBe(wd);
    const order: string[] = [];
    order.push(`mark ${fence.mark()}`);
    writeFileSync(join(w, "x"), "");
    order.push("create x");
    for (let i = 0; i < 3; i++) order.push(`mark ${fence.mark()}`);
    writeFileSync(join(w, "y"), "");
    order.push("create y", `mark ${fence.mark()}`);
    const buf = Buffer.alloc(65536);
    const n = readSync(fd, buf);
    let marks = 0;
    const got = new InotifyDecoder().push(buf.subarray(0, n)).map((ev) => (ev.wd === fence.wd ? `mark ${marks++}` : `create ${ev.name}`));
    expect(got).toEqual(order);
    expect(order).toEqual(["mark 0", "create x", "mark 1", "mark 2", "mark 3", "create y", "mark 4"]);
    expect(readdirSync(w).sort()).toEqual(["x", "y"]);
  } finally {
    fence.close();
    closeSync(fd);
  }
});

test("xattr: a missing file is xattr.not_found (ENOENT); a set value reads back", () => {
  const e = thrown(() => setXattr(join(dir, "missing"), "user.k", "v")) as XattrError;
  expect(e).toBeInstanceOf(XattrError);
  expect([e.code, e.details.errno]).toEqual(["xattr.not_found", 2]);
  const f = join(dir, "x");
  writeFileSync(f, "");
  setXattr(f, "user.k", "värde");
  expect(getXattr(f, "user.k")).toBe("värde");
  expect(getXattr(f, "user.none")).toBeUndefined();
  symlinkSync(join(dir, "missing"), join(dir, "dangling"));
  // l*xattr never follows the link: user.* on a symlink is EPERM, not the target's ENOENT
  const l = thrown(() => setXattr(join(dir, "dangling"), "user.k", "v")) as XattrError;
  expect([l.code, l.details.errno]).toEqual(["xattr.failed", 1]);
});

test("mount: an unknown file system type is ENODEV; umount2 of a non-mount point answers EINVAL", () => {
  const e = thrown(() => mount("none", dir, "nosuchfs", 0, "")) as MountError;
  expect(e).toBeInstanceOf(MountError);
  expect([e.code, e.details.errno]).toEqual(["mount.failed", 19]);
  expect(umount2(dir, 0)).toBe(22);
  expect((thrown(() => mount("a\0b", dir, "tmpfs", 0, "")) as MountError).code).toBe("mount.bad_argument");
});

test("pty: open and resize; resizing a closed fd is pty.resize_failed with EBADF", () => {
  const { master, slave } = openPty(80, 24);
  expect(master).toBeGreaterThan(2);
  expect(slave).toBeGreaterThan(2);
  resizePty(master, 100, 40);
  closeSync(master);
  closeSync(slave);
  const e = thrown(() => resizePty(master, 1, 1)) as PtyError;
  expect(e).toBeInstanceOf(PtyError);
  expect([e.code, e.details.errno]).toEqual(["pty.resize_failed", 9]);
});

test("mmap: an impossible length is EINVAL; a mapping reads back what was written", () => {
  const e = thrown(() => mapMemory(0)) as MmapError;
  expect(e).toBeInstanceOf(MmapError);
  expect([e.code, e.errno]).toEqual(["syscall.failed", 22]);
  const m = mapMemory(5000);
  expect(m.length).toBe(8192);
  const v = new Uint8Array(m.buffer);
  expect(v[8191]).toBe(0);
  v.set([1, 2, 3], 4096);
  expect([...new Uint8Array(m.buffer, 4096, 3)]).toEqual([1, 2, 3]);
  unmapMemory(m);
});

test("clock_settime: struct timespec layout; a bad time is EINVAL and the clock is not touched", () => {
  const b = encodeTimespec(1_700_000_000, 123_456_789);
  expect(b.length).toBe(TIMESPEC_SIZE);
  expect([...b]).toEqual([0x00, 0xf1, 0x53, 0x65, 0, 0, 0, 0, 0x15, 0xcd, 0x5b, 0x07, 0, 0, 0, 0]);
  expect(timespecOfMs(1_700_000_000_123.5)).toEqual({ sec: 1_700_000_000, nsec: 123_500_000 });
  expect(timespecOfMs(-1)).toEqual({ sec: -1, nsec: 999_000_000 });
  // the kernel checks the value before the capability: nothing is set by these
  for (const [sec, nsec] of [[1_700_000_000, 1_000_000_000], [1_700_000_000, -1], [-5, 0]] as const) {
    const e = thrown(() => setRealtimeClock(sec, nsec)) as SyscallError;
    expect(e).toBeInstanceOf(SyscallError);
    expect([e.code, e.details.call, e.errno]).toEqual(["syscall.failed", "clock_settime", 22]);
  }
});
