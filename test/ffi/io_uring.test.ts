/** src/ffi/io_uring.ts (with eventfd.ts and mmap.ts) against real files (io_uring enabled on this kernel). */
import { afterAll, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, readSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { closeEventfd, createEventfd } from "../../src/ffi/eventfd.ts";
import { IORING_FSYNC_DATASYNC, IORING_OP, IORING_SETUP, IoUring, IoUringError, SQE } from "../../src/ffi/io_uring.ts";
import { mapMemory, unmapMemory } from "../../src/ffi/mmap.ts";

const dir = mkdtempSync(join(tmpdir(), "uring-test-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("batched reads return the right bytes, short at EOF; errors carry errno", () => {
  const size = 1 << 20;
  const data = new Uint8Array(size + 100);
  for (let i = 0; i < data.length; i++) data[i] = (i * 7 + (i >> 12)) & 0xff;
  writeFileSync(join(dir, "f"), data);
  const fd = openSync(join(dir, "f"), "r");
  const ring = new IoUring(16);
  try {
    expect(ring.entries).toBe(16);
    const big = new Uint8Array(64 * 1024);
    for (let round = 0; round < 50; round++) {
      const reqs = Array.from({ length: 16 }, (_, i) => ({ buf: big, bufOffset: i * 4096, length: 4096, offset: ((round * 131 + i * 977) % 256) * 4096 }));
      const res = ring.readBatch(fd, reqs);
      expect(res).toEqual(new Array(16).fill(4096));
      for (const r of reqs) expect(Buffer.compare(big.subarray(r.bufOffset, r.bufOffset + 4096), data.subarray(r.offset, r.offset + 4096))).toBe(0);
    }
    const tail = new Uint8Array(4096);
    expect(ring.readBatch(fd, [{ buf: tail, bufOffset: 0, length: 4096, offset: size }])).toEqual([100]);
    expect(Buffer.compare(tail.subarray(0, 100), data.subarray(size))).toBe(0);
    expect(() => ring.readBatch(fd, Array.from({ length: 17 }, () => ({ buf: tail, bufOffset: 0, length: 1, offset: 0 })))).toThrow(IoUringError);
    try {
      ring.readBatch(987654, [{ buf: tail, bufOffset: 0, length: 4096, offset: 0 }]);
      throw new Error("no throw");
    } catch (e) {
      expect(e).toBeInstanceOf(IoUringError);
      expect((e as IoUringError).errno).toBe(9); // EBADF
    }
    // the ring still works after a failed read
    expect(ring.readBatch(fd, [{ buf: tail, bufOffset: 0, length: 4096, offset: 0 }])).toEqual([4096]);
  } finally {
    ring.close();
    closeSync(fd);
  }
});

test("SQE128 ring: NOP, WRITE, FSYNC, READ and URING_CMD go through with their user_data; completions signal a registered eventfd", () => {
  const path = join(dir, "w");
  writeFileSync(path, new Uint8Array(8192));
  const fd = openSync(path, "r+");
  const ring = new IoUring({ entries: 8, cqEntries: 64, flags: IORING_SETUP.SQE128 });
  const efd = createEventfd();
  const mem = mapMemory(8192);
  try {
    expect(ring.sqeSize).toBe(128);
    expect(ring.entries).toBe(8);
    expect(ring.cqEntries).toBe(64);
    ring.registerEventfd(efd);
    const src = new Uint8Array(mem.buffer, 0, 4096);
    for (let i = 0; i < 4096; i++) src[i] = (i * 13) & 0xff;
    // SQE slots are 128 bytes apart: the second SQE starts at word 32
    const w0 = ring.prep({ opcode: IORING_OP.NOP, fd: -1, userData: 2 ** 40 + 7 });
    const w1 = ring.prep({ opcode: IORING_OP.WRITE, fd, addr: mem.ptr, len: 4096, off: 4096, userData: 11 });
    expect(w1 - w0).toBe(32);
    expect(ring.sqeWords[w1]! & 0xff).toBe(IORING_OP.WRITE);
    expect(ring.sqeWords[w1 + 2]).toBe(4096); // off low word
    expect(ring.sqeWords[w1 + 6]).toBe(4096); // len
    expect(ring.sqeWords[w1 + 8]).toBe(11); // user_data low word
    expect(ring.pending).toBe(2);
    const seen: Array<[number, number]> = [];
    ring.submit(2);
    ring.reap((ud, res) => seen.push([ud, res]));
    expect(seen.sort((a, b) => a[0] - b[0])).toEqual([[11, 4096], [2 ** 40 + 7, 0]]);
    ring.prep({ opcode: IORING_OP.FSYNC, fd, opFlags: IORING_FSYNC_DATASYNC, userData: 12 });
    ring.prep({ opcode: IORING_OP.READ, fd, addr: mem.ptr + 4096, len: 4096, off: 4096, userData: 13 });
    // a regular file has no uring_cmd handler: the command reaches the kernel and is refused
    const w = ring.prepUringCmd(fd, 0xc0107520, 14);
    expect(ring.sqeWords[w + SQE.CMD_OP / 4]).toBe(0xc0107520);
    seen.length = 0;
    let got = 0;
    while (got < 3) {
      ring.submit(3 - got);
      got += ring.reap((ud, res) => seen.push([ud, res]));
    }
    expect(seen.sort((a, b) => a[0] - b[0])).toEqual([[12, 0], [13, 4096], [14, -95]]); // EOPNOTSUPP
    expect(Buffer.compare(new Uint8Array(mem.buffer, 4096, 4096), src)).toBe(0);
    // the eventfd counted the completions
    const cnt = Buffer.alloc(8);
    expect(readSync(efd, cnt, 0, 8, null)).toBe(8);
    expect(cnt.readBigUInt64LE(0)).toBeGreaterThanOrEqual(2n);
  } finally {
    ring.close();
    closeEventfd(efd);
    unmapMemory(mem);
    closeSync(fd);
  }
});

test("ring setup refuses bad input with the kernel's errno", () => {
  expect(() => new IoUring({ entries: 8, flags: 1 << 30 })).toThrow(IoUringError);
  try {
    new IoUring({ entries: 0 });
    throw new Error("no throw");
  } catch (e) {
    expect((e as IoUringError).errno).toBe(22); // EINVAL
  }
});
