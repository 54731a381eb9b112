/** src/ffi/preadv2.ts: positioned reads into mapped memory, with and without RWF_NOWAIT, on a real file. */
import { afterAll, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { mapMemory, unmapMemory } from "../../src/ffi/mmap.ts";
import { AddressReader } from "../../src/ffi/preadv2.ts";

const dir = mkdtempSync(join(tmpdir(), "preadv2-test-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("reads land at the given address; short at the end of the file; errors are -errno", () => {
  const data = new Uint8Array(10000);
  for (let i = 0; i < data.length; i++) data[i] = (i * 31) & 0xff;
  writeFileSync(join(dir, "f"), data);
  const fd = openSync(join(dir, "f"), "r");
  const mem = mapMemory(16384);
  const r = new AddressReader();
  try {
    const view = new Uint8Array(mem.buffer);
    expect(r.read(fd, mem.ptr + 100, 4096, 512, false)).toBe(4096);
    expect(Buffer.compare(view.subarray(100, 4196), data.subarray(512, 4608))).toBe(0);
    expect(view[99]).toBe(0); // nothing written before the address
    expect(view[4196]).toBe(0); // nor after the length
    // the file was just written: in the page cache, so a no-wait read succeeds too
    expect(r.read(fd, mem.ptr + 8192, 4096, 8000, true)).toBe(2000);
    expect(Buffer.compare(view.subarray(8192, 10192), data.subarray(8000))).toBe(0);
    expect(r.read(fd, mem.ptr, 4096, 10000, false)).toBe(0);
    expect(r.read(987654, mem.ptr, 4096, 0, false)).toBe(-9); // EBADF
  } finally {
    r.close();
    unmapMemory(mem);
    closeSync(fd);
  }
});
