/** src/ffi/io_uring.ts against real files (io_uring enabled on this kernel). */
import { afterAll, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { IoUring, IoUringError } from "../../src/ffi/io_uring.ts";

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
