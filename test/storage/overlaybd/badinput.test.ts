/** Corrupted and truncated inputs: each is a typed OverlaybdError naming the file and the offset. */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { copyFileSync, readFileSync, truncateSync, writeFileSync } from "node:fs";
import { IoUring } from "../../../src/ffi/io_uring.ts";
import { compressLayer, createUpper, openStack, OverlaybdError } from "../../../src/storage/overlaybd/index.ts";
import type { OverlaybdErrorCode } from "../../../src/storage/overlaybd/errors.ts";
import { encodeSegments, HT_SIZE } from "../../../src/storage/overlaybd/format.ts";
import { scratch } from "./helpers.ts";

const tmp = scratch();
let layer: Uint8Array, zlayer: Uint8Array;
beforeAll(async () => {
  await createUpper({ data: tmp.path("u.data"), index: tmp.path("u.index") }, 1 << 20);
  const img = await openStack({ lowers: [], upper: { data: tmp.path("u.data"), index: tmp.path("u.index") } });
  for (let i = 0; i < 8; i++) await img.pwrite(new Uint8Array(8192).fill(i + 1), i * 65536);
  await img.commit(tmp.path("good.layer"));
  await img.close();
  await compressLayer(tmp.path("good.layer"), tmp.path("good.zfile"), { algo: "lz4" });
  layer = new Uint8Array(readFileSync(tmp.path("good.layer")));
  zlayer = new Uint8Array(readFileSync(tmp.path("good.zfile")));
}, 60_000);
afterAll(() => tmp.cleanup());

async function expectError(bytes: Uint8Array, code: OverlaybdErrorCode, offset?: number, read = false): Promise<OverlaybdError> {
  const p = tmp.path(`bad-${Math.random().toString(36).slice(2)}`);
  writeFileSync(p, bytes);
  let err: unknown;
  try {
    const img = await openStack({ lowers: [p] });
    try {
      if (read) {
        const b = new Uint8Array(1 << 20);
        await img.pread(b, 0);
      }
    } finally {
      await img.close();
    }
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(OverlaybdError);
  const e = err as OverlaybdError;
  expect(e.code).toBe(code);
  expect(e.details.file).toBe(p);
  if (offset !== undefined) expect(e.details.offset).toBe(offset);
  expect(e.message).toContain(p);
  return e;
}

describe("LSMT layer", () => {
  test("the good layer reads", async () => {
    const img = await openStack({ lowers: [tmp.path("good.layer")] });
    const b = new Uint8Array(8192);
    await img.pread(b, 3 * 65536);
    expect(b.every((x) => x === 4)).toBe(true);
    await img.close();
  });
  test("truncated", async () => {
    await expectError(layer.slice(0, 5000), "overlaybd.truncated");
    await expectError(layer.slice(0, layer.length - 100), "overlaybd.bad_magic", layer.length - 100 - HT_SIZE);
  });
  test("wrong header magic", async () => {
    const b = layer.slice();
    b[0] = 0x58;
    await expectError(b, "overlaybd.bad_magic", 0);
  });
  test("trailer flags of a writable file", async () => {
    const b = layer.slice();
    b[b.length - HT_SIZE + 28] = 3;
    await expectError(b, "overlaybd.bad_flags", b.length - HT_SIZE);
  });
  const trailerIndexOffset = () => Number(new DataView(layer.buffer, layer.byteOffset).getBigUint64(layer.length - HT_SIZE + 32, true));
  test("index entry past the data", async () => {
    const b = layer.slice();
    const io = trailerIndexOffset();
    b.set(encodeSegments([{ offset: 0, length: 16, moffset: io / 512 - 8, zeroed: false, tag: 0 }]), io);
    const e = await expectError(b, "overlaybd.bad_index", io);
    expect(e.details.entry).toBe(0);
  });
  test("overlapping segments", async () => {
    const b = layer.slice();
    const io = trailerIndexOffset();
    // entry 1 starts inside entry 0 (sector 128 + 16 long; entry 0 ends at 16)
    b.set(encodeSegments([{ offset: 8, length: 16, moffset: 8, zeroed: false, tag: 0 }]), io + 16);
    await expectError(b, "overlaybd.bad_index", io + 16);
  });
  test("index claimed past the trailer", async () => {
    const b = layer.slice();
    new DataView(b.buffer).setUint32(b.length - HT_SIZE + 40, 100000, true);
    await expectError(b, "overlaybd.bad_index", b.length - HT_SIZE + 32);
  });
});

describe("ZFile layer", () => {
  test("the good ZFile reads", async () => {
    const img = await openStack({ lowers: [tmp.path("good.zfile")] });
    const b = new Uint8Array(8192);
    await img.pread(b, 7 * 65536);
    expect(b.every((x) => x === 8)).toBe(true);
    await img.close();
  });
  test("block CRC mismatch names the block's file offset", async () => {
    const b = zlayer.slice();
    // block 1 (the first data block after the LSMT header) starts after header + block 0
    const jt = Number(new DataView(b.buffer).getBigUint64(40, true));
    const len0 = new DataView(b.buffer).getUint32(jt, true);
    const start1 = 512 + len0;
    b[start1 + 3] ^= 0xff;
    await expectError(b, "overlaybd.crc_mismatch", start1, true);
  });
  test("header digest mismatch", async () => {
    const b = zlayer.slice();
    b[77] = 9; // the level byte is covered by the digest
    await expectError(b, "overlaybd.digest_mismatch", 0);
  });
  test("jump table CRC mismatch", async () => {
    const b = zlayer.slice();
    const jt = Number(new DataView(b.buffer).getBigUint64(40, true));
    b[jt] ^= 1;
    await expectError(b, "overlaybd.crc_mismatch", jt);
  });
  test("truncated ZFile", async () => {
    await expectError(zlayer.slice(0, 700), "overlaybd.truncated");
  });
});

describe("writable layer", () => {
  test("wrong magic in the index file; reads past the size", async () => {
    await createUpper({ data: tmp.path("w.data"), index: tmp.path("w.index") }, 1 << 20);
    const ix = readFileSync(tmp.path("w.index"));
    ix[2] = 0;
    writeFileSync(tmp.path("w.index"), ix);
    await expect(openStack({ lowers: [], upper: { data: tmp.path("w.data"), index: tmp.path("w.index") } })).rejects.toMatchObject({ code: "overlaybd.bad_magic", details: { file: tmp.path("w.index"), offset: 0 } });
    const img = await openStack({ lowers: [tmp.path("good.layer")] });
    await expect(img.pread(new Uint8Array(512), (1 << 20) + 512)).rejects.toMatchObject({ code: "overlaybd.out_of_range", details: { offset: (1 << 20) + 512 } });
    await img.close();
  });
});

describe("files truncated after they were opened", () => {
  test("a read of data past a layer's or the upper's end is overlaybd.truncated naming the file, never zeros", async () => {
    copyFileSync(tmp.path("good.layer"), tmp.path("t.layer"));
    await createUpper({ data: tmp.path("t.data"), index: tmp.path("t.index") }, 0);
    const img = await openStack({ lowers: [tmp.path("t.layer")], upper: { data: tmp.path("t.data"), index: tmp.path("t.index") } });
    const ring = new IoUring(8);
    try {
      await img.pwrite(new Uint8Array(4096).fill(0x77), 3 * 65536);
      const buf = new Uint8Array(8192);
      expect(await img.pread(buf, 0)).toBe(8192); // layer data, intact so far
      expect(buf.every((b) => b === 1)).toBe(true);
      truncateSync(tmp.path("t.layer"), HT_SIZE); // the layer's data is gone under the open image
      truncateSync(tmp.path("t.data"), HT_SIZE); // and so is the upper's
      for (const [off, file] of [[0, "t.layer"], [3 * 65536, "t.data"]] as const) {
        const e = await img.pread(buf, off).then(() => null, (x: OverlaybdError) => x);
        expect(e).toBeInstanceOf(OverlaybdError);
        expect(e!.code).toBe("overlaybd.truncated");
        expect(e!.details).toMatchObject({ file: tmp.path(file), offset: HT_SIZE, got: 0 });
        expect(() => img.preadSync(buf, off)).toThrow(/short read/);
        expect(() => img.preadBatchSync([{ buf, offset: off }], ring)).toThrow(/the file ends inside the image's data/);
      }
      // ranges no file backs still read as zeros
      expect(await img.pread(buf, 900 * 1024)).toBe(8192);
      expect(buf.every((b) => b === 0)).toBe(true);
    } finally {
      ring.close();
      await img.close();
    }
  });
});
