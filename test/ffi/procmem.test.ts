/**
 * procfs memory access on this very process: a file mapped privately (Bun.mmap, MAP_PRIVATE)
 * of which some pages were only read and two were written: pagemap reports exactly the written
 * pages as private copies, /proc/self/mem reads their current bytes; bad input is a typed error.
 */
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileMappings, PAGE_SIZE, privatePages, ProcessMemory, ProcMemError, readMapped } from "../../src/ffi/procmem.ts";

const dir = mkdtempSync(join(tmpdir(), "procmem-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("written pages of a private file mapping are found and read; read-only pages are not", () => {
  const path = join(dir, "image.bin");
  const data = new Uint8Array(32 * PAGE_SIZE);
  for (let i = 0; i < data.length; i++) data[i] = (i * 7) & 255;
  writeFileSync(path, data);
  const m = Bun.mmap(path, { shared: false });
  let sum = 0;
  for (let p = 0; p < 32; p++) sum += m[p * PAGE_SIZE]!; // fault every page in, read-only
  m[5 * PAGE_SIZE + 10] = 0xee;
  m[6 * PAGE_SIZE] = 0xef;
  m[20 * PAGE_SIZE + 4095] = 0xf0;
  const maps = fileMappings(process.pid, path);
  expect(maps.length).toBe(1);
  expect(maps[0]!.end - maps[0]!.start).toBe(32 * PAGE_SIZE);
  expect(maps[0]!.fileOffset).toBe(0);
  expect(privatePages(process.pid, maps)).toEqual([
    [5 * PAGE_SIZE, 7 * PAGE_SIZE],
    [20 * PAGE_SIZE, 21 * PAGE_SIZE],
  ]);
  const mem = new ProcessMemory(process.pid);
  try {
    const b = new Uint8Array(4);
    readMapped(mem, maps, b, 5 * PAGE_SIZE + 9);
    expect([...b]).toEqual([data[5 * PAGE_SIZE + 9]!, 0xee, data[5 * PAGE_SIZE + 11]!, data[5 * PAGE_SIZE + 12]!]);
    expect(() => readMapped(mem, maps, new Uint8Array(8), 32 * PAGE_SIZE - 4)).toThrow(ProcMemError);
  } finally {
    mem.close();
  }
  // the file itself is untouched: the writes are private copies
  expect(readFileSync(path)[5 * PAGE_SIZE + 10]).toBe(data[5 * PAGE_SIZE + 10]!);
  expect(sum).toBeGreaterThanOrEqual(0);
});

test("a file nobody maps has no mappings; a missing process is a typed error", () => {
  expect(fileMappings(process.pid, join(dir, "not-mapped"))).toEqual([]);
  expect(() => fileMappings(2 ** 22 + 12345, "/x")).toThrow(ProcMemError);
  expect(() => new ProcessMemory(2 ** 22 + 12345)).toThrow(ProcMemError);
});
