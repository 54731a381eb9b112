/**
 * The CoW target (src/storage/ublk/cow.ts) on real files: reads come from the origin until a
 * chunk is written, a partial write copies the rest of the chunk from the origin, the chunk state
 * survives a reopen (from the CoW file's allocated extents), two threads writing the same chunks
 * copy each chunk once and lose neither write, and bad input gives typed errors.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { closeSync, ftruncateSync, openSync, readFileSync, statSync, writeFileSync, writeSync } from "node:fs";
import { Worker } from "node:worker_threads";
import { dataExtents } from "../../../src/ffi/file_extents.ts";
import { COW_FILE_COW, COW_FILE_ORIGIN, CowImage, planCowRead, cowFilesOf } from "../../../src/storage/ublk/cow.ts";
import type { ReadPiece } from "../../../src/storage/ublk/plan.ts";
import { rng, scratch } from "../overlaybd/helpers.ts";

const s = scratch();
afterAll(() => s.cleanup());
const C = 65536;

function origin(name: string, size: number, seed: number): Uint8Array {
  const b = new Uint8Array(size);
  const r = rng(seed);
  for (let i = 0; i < size; i += 4) new DataView(b.buffer).setUint32(i, (r() * 2 ** 32) >>> 0, true);
  writeFileSync(s.path(name), b);
  return b;
}

async function readAll(img: CowImage): Promise<Uint8Array> {
  const out = new Uint8Array(img.size);
  expect(await img.pread(out, 0)).toBe(img.size);
  return out;
}

describe("CoW target", () => {
  test("reads the origin, copies a chunk on its first partial write, keeps the origin untouched", async () => {
    const size = 16 * C + 8192; // a short last chunk
    const o = origin("o1", size, 1);
    const img = CowImage.open({ origin: s.path("o1"), cow: s.path("c1"), chunkBytes: C, create: true });
    try {
      expect(img.size).toBe(size);
      expect(statSync(s.path("c1")).size).toBe(size);
      expect(Buffer.compare(await readAll(img), o)).toBe(0);
      expect(img.copiedChunks).toBe(0);
      const w = new Uint8Array(1000).fill(0xab);
      await img.pwrite(w, 3 * C + 100); // inside chunk 3
      await img.pwrite(new Uint8Array(C).fill(0xcd), 5 * C); // exactly chunk 5
      await img.pwrite(new Uint8Array(2 * C).fill(0xef), 7 * C + C / 2); // half of 7, all of 8, half of 9
      await img.pwrite(new Uint8Array(4096).fill(0x11), size - 4096); // the short last chunk
      const want = o.slice();
      want.fill(0xab, 3 * C + 100, 3 * C + 1100);
      want.fill(0xcd, 5 * C, 6 * C);
      want.fill(0xef, 7 * C + C / 2, 9 * C + C / 2);
      want.fill(0x11, size - 4096, size);
      expect(Buffer.compare(await readAll(img), want)).toBe(0);
      expect(img.copiedChunks).toBe(6); // 3, 5, 7, 8, 9, 16
      expect(Buffer.compare(readFileSync(s.path("o1")), o)).toBe(0);
      // adjacent chunks in one place read as one piece
      const pieces: ReadPiece[] = [];
      planCowRead(cowFilesOf(img.plan()), 6 * C, 4 * C, pieces);
      expect(pieces).toEqual([
        { file: COW_FILE_ORIGIN, fileOffset: 6 * C, bufOffset: 0, length: C },
        { file: COW_FILE_COW, fileOffset: 7 * C, bufOffset: C, length: 3 * C },
      ]);
      await img.sync();
      await img.discard(3 * C, C); // zeros, still a CoW chunk
      want.fill(0, 3 * C, 4 * C);
      expect(Buffer.compare(await readAll(img), want)).toBe(0);
    } finally {
      await img.close();
    }
    // a reopened target finds its chunks from the CoW file's allocated extents
    const again = CowImage.open({ origin: s.path("o1"), cow: s.path("c1"), chunkBytes: C });
    try {
      expect(again.copiedChunks).toBe(6);
      const want = o.slice();
      want.fill(0, 3 * C, 4 * C);
      want.fill(0xcd, 5 * C, 6 * C);
      want.fill(0xef, 7 * C + C / 2, 9 * C + C / 2);
      want.fill(0x11, size - 4096, size);
      expect(Buffer.compare(await readAll(again), want)).toBe(0);
    } finally {
      await again.close();
    }
  });

  test("a chunk only partly allocated (a copy cut short) reads from the origin again", async () => {
    const o = origin("o2", 4 * C, 2);
    const fd = openSync(s.path("c2"), "w+");
    ftruncateSync(fd, 4 * C);
    writeSync(fd, new Uint8Array(4096).fill(9), 0, 4096, C); // 4 KiB of chunk 1 only
    expect(dataExtents(fd, 4 * C).length).toBe(1);
    closeSync(fd);
    const img = CowImage.open({ origin: s.path("o2"), cow: s.path("c2"), chunkBytes: C });
    try {
      expect(img.copiedChunks).toBe(0);
      expect(Buffer.compare(await readAll(img), o)).toBe(0);
    } finally {
      await img.close();
    }
  });

  test("two threads writing halves of the same chunks: every chunk copied once, both halves kept", async () => {
    const size = 64 * C;
    const o = origin("o3", size, 3);
    const img = CowImage.open({ origin: s.path("o3"), cow: s.path("c3"), chunkBytes: C, create: true });
    try {
      const plan = img.plan();
      const run = (half: number, value: number) =>
        new Promise<void>((resolve, reject) => {
          const w = new Worker(new URL("./fixtures/cow-writer.ts", import.meta.url), { workerData: { plan, half, value, rounds: 3 } });
          w.on("message", () => resolve());
          w.on("error", reject);
        });
      await Promise.all([run(0, 0x31), run(1, 0x32)]);
      const got = await readAll(img);
      for (let c = 0; c < 64; c++) {
        expect(got.subarray(c * C, c * C + C / 2).every((b) => b === 0x31)).toBe(true);
        expect(got.subarray(c * C + C / 2, (c + 1) * C).every((b) => b === 0x32)).toBe(true);
      }
      expect(img.copiedChunks).toBe(64);
      expect(Buffer.compare(readFileSync(s.path("o3")), o)).toBe(0);
    } finally {
      await img.close();
    }
  });

  test("bad input: typed errors, nothing created", async () => {
    origin("o4", 4 * C, 4);
    writeFileSync(s.path("odd"), new Uint8Array(1000));
    const code = (f: () => unknown) => {
      try {
        f();
        return "no error";
      } catch (e) {
        return (e as { code: string }).code;
      }
    };
    expect(code(() => CowImage.open({ origin: s.path("o4"), cow: s.path("c4"), chunkBytes: 3000, create: true }))).toBe("ublk.bad_config");
    expect(code(() => CowImage.open({ origin: s.path("odd"), cow: s.path("c4"), chunkBytes: C, create: true }))).toBe("ublk.target_failed");
    expect(code(() => CowImage.open({ origin: s.path("missing"), cow: s.path("c4"), chunkBytes: C, create: true }))).toBe("ublk.target_failed");
    expect(code(() => CowImage.open({ origin: s.path("o4"), cow: s.path("c4"), chunkBytes: C }))).toBe("ublk.target_failed"); // no create
    writeFileSync(s.path("c5"), new Uint8Array(C));
    expect(code(() => CowImage.open({ origin: s.path("o4"), cow: s.path("c5"), chunkBytes: C }))).toBe("ublk.target_failed"); // size mismatch
    expect(() => statSync(s.path("c4"))).toThrow();
    const img = CowImage.open({ origin: s.path("o4"), cow: s.path("c4"), chunkBytes: C, create: true });
    try {
      await expect(img.pread(new Uint8Array(512), 4 * C + 512)).rejects.toMatchObject({ code: "ublk.out_of_range" });
      await expect(img.pwrite(new Uint8Array(1024), 4 * C - 512)).rejects.toMatchObject({ code: "ublk.out_of_range" });
      expect(await img.pread(new Uint8Array(1024), 4 * C - 512)).toBe(512); // short at the end, like a file
      expect(img.copiedChunks).toBe(0);
    } finally {
      await img.close();
    }
    await expect(img.pread(new Uint8Array(512), 0)).rejects.toMatchObject({ code: "ublk.io_failed" });
  });
});
