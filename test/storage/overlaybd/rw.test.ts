import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { appendFileSync, readFileSync, statSync, truncateSync, writeFileSync, openSync, writeSync, ftruncateSync, closeSync } from "node:fs";
import {
  createUpper, importRaw, importSparse, openImageConfig, openRoLayerFile, openStack, OverlaybdError, RwLayer,
} from "../../../src/storage/overlaybd/index.ts";
import { encodeHeaderTrailer, HTFlag } from "../../../src/storage/overlaybd/format.ts";
import { hex, scratch, sha256 } from "./helpers.ts";

let tmp: ReturnType<typeof scratch>;
beforeEach(() => {
  tmp = scratch();
});
afterEach(() => tmp.cleanup());

const MiB = 1 << 20;
const up = () => ({ data: tmp.path("w.data"), index: tmp.path("w.index") });

describe("writable layer", () => {
  test("an upper opened read-only (one of several readers) reads its data, refuses writes and leaves its files untouched", async () => {
    await createUpper(up(), 8 * MiB);
    const w = await openStack({ lowers: [], upper: up() });
    await w.pwrite(new Uint8Array(4096).fill(0x5a), MiB);
    await w.sync();
    await w.close();
    // a torn index tail a writer would truncate on open: a reader must leave it as it is
    appendFileSync(up().index, new Uint8Array(7));
    const before = [readFileSync(up().data), readFileSync(up().index)];
    const a = await openStack({ lowers: [], upper: up(), upperReadOnly: true });
    const b = await openStack({ lowers: [], upper: up(), upperReadOnly: true });
    expect(a.readOnly).toBe(true);
    const buf = new Uint8Array(4096);
    await b.pread(buf, MiB);
    expect(buf.every((x) => x === 0x5a)).toBe(true);
    await expect(a.pwrite(new Uint8Array(512), 0)).rejects.toMatchObject({ code: "overlaybd.read_only" });
    await expect(a.discard(0, 4096)).rejects.toMatchObject({ code: "overlaybd.read_only" });
    await a.sync();
    await a.close();
    await b.close();
    expect(Buffer.compare(readFileSync(up().data), before[0]!)).toBe(0);
    expect(Buffer.compare(readFileSync(up().index), before[1]!)).toBe(0);
  });

  test("section 6.2 file layout after one 4 KiB write", async () => {
    await createUpper(up(), 64 * MiB, { uuid: "11111111-2222-3333-4444-555555555555" });
    const img = await openStack({ lowers: [], upper: up() });
    expect(img.size).toBe(64 * MiB);
    await img.pwrite(new Uint8Array(4096).fill(0xcc), MiB);
    await img.sync();
    await img.close();
    const data = readFileSync(up().data), index = readFileSync(up().index);
    expect(data.length).toBe(8192);
    expect(index.length).toBe(4112);
    expect(data[0x1c]).toBe(3);
    expect(index[0x1c]).toBe(1);
    expect(Array.from(index.subarray(0x20, 0x28))).toEqual([0, 0x10, 0, 0, 0, 0, 0, 0]);
    expect(Array.from(index.subarray(4096))).toEqual(Array.from(hex("00 08 00 00 00 00 20 00 08 00 00 00 00 00 00 00")));
    expect(new TextDecoder().decode(data.subarray(0x38, 0x38 + 36))).toBe("11111111-2222-3333-4444-555555555555");
    expect(data.subarray(4096).every((b) => b === 0xcc)).toBe(true);
  });

  test("commit writes the section 6.1 committed file exactly", async () => {
    await createUpper(up(), 64 * MiB);
    const img = await openStack({ lowers: [], upper: up() });
    await img.pwrite(new Uint8Array(4096).fill(0xcc), MiB);
    const out = tmp.path("c.layer");
    await img.commit(out, { meta: { uuid: "00000000-0000-0000-0000-000000000000" } });
    await img.close();
    const b = readFileSync(out);
    expect(b.length).toBe(16384);
    expect(Buffer.compare(b.subarray(0, 4096), Buffer.from(encodeHeaderTrailer({ flags: 7, virtualSize: 64 * MiB })))).toBe(0);
    expect(b.subarray(0x1000, 0x2000).every((x) => x === 0xcc)).toBe(true);
    expect(Array.from(b.subarray(0x2000, 0x2010))).toEqual(Array.from(hex("00 08 00 00 00 00 20 00 08 00 00 00 00 00 00 00")));
    for (let i = 1; i < 256; i++) expect(Array.from(b.subarray(0x2000 + i * 16, 0x2010 + i * 16))).toEqual(Array.from(hex("ff ff ff ff ff ff 03 00 00 00 00 00 00 00 00 00")));
    expect(Buffer.compare(b.subarray(0x3000), Buffer.from(encodeHeaderTrailer({ flags: 6, virtualSize: 64 * MiB, indexOffset: 8192, indexSize: 256 })))).toBe(0);
    // and it reads back
    const ro = await openStack({ lowers: [out] });
    const r = new Uint8Array(8192);
    await ro.pread(r, MiB - 4096);
    expect(r.subarray(0, 4096).every((x) => x === 0)).toBe(true);
    expect(r.subarray(4096).every((x) => x === 0xcc)).toBe(true);
    await ro.close();
  });

  test("writes, overwrites, unaligned writes, discards survive reopen", async () => {
    await createUpper(up(), 8 * MiB);
    let img = await openStack({ lowers: [], upper: up() });
    await img.pwrite(new Uint8Array(MiB).fill(1), 0);
    await img.pwrite(new Uint8Array(100).fill(2), 1000);
    await img.discard(4096, 8192);
    await img.discard(300, 10); // sub-sector: written as zeros
    await img.sync();
    await img.close();
    img = await openStack({ lowers: [], upper: up() });
    const r = new Uint8Array(MiB + 512);
    await img.pread(r, 0);
    const want = new Uint8Array(MiB + 512).fill(1, 0, MiB);
    want.fill(2, 1000, 1100);
    want.fill(0, 4096, 12288);
    want.fill(0, 300, 310);
    expect(Buffer.compare(r, want)).toBe(0);
    await img.close();
  });

  test("a crash tail (index entries without data, a torn entry) loses only unsynced writes", async () => {
    await createUpper(up(), 8 * MiB);
    let img = await openStack({ lowers: [], upper: up() });
    await img.pwrite(new Uint8Array(4096).fill(7), 0);
    await img.sync();
    await img.pwrite(new Uint8Array(4096).fill(8), 8192);
    await img.close();
    // simulate: the second write's data never reached the disk, and half an entry was appended
    truncateSync(up().data, 4096 + 4096);
    appendFileSync(up().index, new Uint8Array(8).fill(0x55));
    img = await openStack({ lowers: [], upper: up() });
    const r = new Uint8Array(16384);
    await img.pread(r, 0);
    expect(r.subarray(0, 4096).every((x) => x === 7)).toBe(true);
    expect(r.subarray(4096).every((x) => x === 0)).toBe(true);
    // the log was cut back, so new writes are not shadowed by stale entries on the next open
    await img.pwrite(new Uint8Array(512).fill(9), 0);
    await img.sync();
    await img.close();
    expect(statSync(up().index).size).toBe(4096 + 32);
    img = await openStack({ lowers: [], upper: up() });
    await img.pread(r, 0);
    expect(r.subarray(0, 512).every((x) => x === 9)).toBe(true);
    expect(r.subarray(512, 4096).every((x) => x === 7)).toBe(true);
    await img.close();
  });

  test("read-only and range errors are typed", async () => {
    await createUpper(up(), MiB);
    const img = await openStack({ lowers: [], upper: up() });
    await expect(img.pwrite(new Uint8Array(512), MiB)).rejects.toMatchObject({ code: "overlaybd.out_of_range" });
    expect(await img.pread(new Uint8Array(512), MiB)).toBe(0); // end of disk
    await expect(img.pread(new Uint8Array(512), MiB + 512)).rejects.toMatchObject({ code: "overlaybd.out_of_range", details: { file: up().data, offset: MiB + 512 } });
    expect(() => img.preadSync(new Uint8Array(512), MiB + 512)).toThrow(OverlaybdError);
    await expect(img.pread(new Uint8Array(512), -1)).rejects.toMatchObject({ code: "overlaybd.bad_range" });
    expect(await img.pread(new Uint8Array(1024), MiB - 512)).toBe(512);
    await img.close();
    await expect(img.pread(new Uint8Array(512), 0)).rejects.toMatchObject({ code: "overlaybd.closed" });
    const ro = await openStack({ lowers: [] });
    await expect(ro.pwrite(new Uint8Array(512), 0)).rejects.toMatchObject({ code: "overlaybd.read_only" });
    await expect(createUpper(up(), MiB)).rejects.toMatchObject({ code: "overlaybd.open_failed" });
    await expect(createUpper({ data: tmp.path("a"), index: tmp.path("b") }, 1000)).rejects.toMatchObject({ code: "overlaybd.bad_size" });
  });
});

describe("growing a stack", () => {
  test("grow records the size in the upper (data before index header), keeps data, reads zeros past the lowers; sparse too", async () => {
    const raw = tmp.path("base.raw");
    writeFileSync(raw, new Uint8Array(2 * MiB).fill(0x61));
    await importRaw(raw, tmp.path("l0"));
    for (const sparse of [false, true]) {
      const u = { data: tmp.path(`g${sparse}.data`), index: tmp.path(`g${sparse}.index`) };
      await createUpper(u, 2 * MiB, { sparse });
      const img = await openStack({ lowers: [tmp.path("l0")], upper: u });
      await img.pwrite(new Uint8Array(4096).fill(0x62), MiB);
      await img.grow(2 * MiB); // same size: nothing to do
      await img.grow(3 * MiB);
      expect(img.size).toBe(3 * MiB);
      await img.pwrite(new Uint8Array(4096).fill(0x63), 3 * MiB - 4096);
      await expect(img.pwrite(new Uint8Array(512), 3 * MiB)).rejects.toMatchObject({ code: "overlaybd.out_of_range" });
      await expect(img.grow(2 * MiB)).rejects.toMatchObject({ code: "overlaybd.bad_size" });
      await expect(img.grow(3 * MiB + 100)).rejects.toMatchObject({ code: "overlaybd.bad_size" });
      await img.sync();
      await img.close();
      await expect(img.grow(4 * MiB)).rejects.toMatchObject({ code: "overlaybd.closed" });
      // both headers carry the size; a reopened stack has it and every byte
      for (const f of [u.data, u.index]) expect(readFileSync(f).readBigUInt64LE(48)).toBe(BigInt(3 * MiB)); // virtual_size @48 (overlaybd-format.md)
      const again = await openStack({ lowers: [tmp.path("l0")], upper: u });
      expect(again.size).toBe(3 * MiB);
      const all = new Uint8Array(3 * MiB);
      expect(await again.pread(all, 0)).toBe(3 * MiB);
      const want = new Uint8Array(3 * MiB);
      want.fill(0x61, 0, 2 * MiB);
      want.fill(0x62, MiB, MiB + 4096);
      want.fill(0x63, 3 * MiB - 4096);
      expect(Buffer.compare(Buffer.from(all), Buffer.from(want))).toBe(0);
      await again.close();
    }
    // a stack without a writable upper cannot grow
    const ro = await openStack({ lowers: [tmp.path("l0")] });
    await expect(ro.grow(4 * MiB)).rejects.toMatchObject({ code: "overlaybd.read_only" });
    await ro.close();
  });
});

describe("stacks", () => {
  test("restack, zeroed upper entries hide lower data, vsize from the lower", async () => {
    await createUpper(up(), 4 * MiB);
    const img = await openStack({ lowers: [], upper: up() });
    await img.pwrite(new Uint8Array(MiB).fill(3), 0);
    await img.restack(tmp.path("l1.layer"), { data: tmp.path("w2.data"), index: tmp.path("w2.index") });
    expect(img.lowers.length).toBe(1);
    await img.discard(0, 4096);
    await img.pwrite(new Uint8Array(512).fill(4), 8192);
    await img.sync();
    const r = new Uint8Array(16384);
    await img.pread(r, 0);
    expect(r.subarray(0, 4096).every((x) => x === 0)).toBe(true);
    expect(r.subarray(4096, 8192).every((x) => x === 3)).toBe(true);
    expect(r.subarray(8192, 8704).every((x) => x === 4)).toBe(true);
    expect(r.subarray(8704).every((x) => x === 3)).toBe(true);
    await img.close();
    // an upper of size 0 takes the lower's size; the parent chain checks
    await createUpper({ data: tmp.path("z.data"), index: tmp.path("z.index") }, 0);
    const l1 = await openRoLayerFile(tmp.path("l1.layer"));
    const again = await openStack({ lowers: [l1], upper: { data: tmp.path("w2.data"), index: tmp.path("w2.index") }, verifyChain: true });
    expect(again.size).toBe(4 * MiB);
    await again.close();
    const z = await openStack({ lowers: [tmp.path("l1.layer")], upper: { data: tmp.path("z.data"), index: tmp.path("z.index") } });
    expect(z.size).toBe(4 * MiB);
    await z.close();
    await createUpper({ data: tmp.path("y.data"), index: tmp.path("y.index") }, 0, { parentUuid: "AAAAAAAA-0000-0000-0000-000000000000" });
    await expect(openStack({ lowers: [tmp.path("l1.layer")], upper: { data: tmp.path("y.data"), index: tmp.path("y.index") }, verifyChain: true })).rejects.toMatchObject({ code: "overlaybd.bad_chain" });
  });

  test("await using closes the image at scope end", async () => {
    await createUpper(up(), MiB);
    let leaked: Awaited<ReturnType<typeof openStack>> | null = null;
    {
      await using img = await openStack({ lowers: [], upper: up() });
      leaked = img;
      await img.pwrite(new Uint8Array(512).fill(1), 0);
      await img.sync();
    }
    await expect(leaked!.pread(new Uint8Array(512), 0)).rejects.toMatchObject({ code: "overlaybd.closed" });
  });

  test("snapshot copy of a live upper (reflink where supported, else copy)", async () => {
    await createUpper(up(), MiB);
    const img = await openStack({ lowers: [], upper: up() });
    await img.pwrite(new Uint8Array(4096).fill(5), 0);
    const how = await img.snapshotUpper({ data: tmp.path("s.data"), index: tmp.path("s.index") });
    expect(["reflink", "copy"]).toContain(how);
    await img.pwrite(new Uint8Array(4096).fill(6), 0);
    await img.close();
    const snap = await openStack({ lowers: [], upper: { data: tmp.path("s.data"), index: tmp.path("s.index") } });
    const r = new Uint8Array(4096);
    await snap.pread(r, 0);
    expect(r.every((x) => x === 5)).toBe(true);
    await snap.close();
  });
});

describe("import", () => {
  test("importRaw skips zero blocks; the layer reads back the raw image", async () => {
    const raw = new Uint8Array(3 * MiB + 1000);
    for (let i = 0; i < raw.length; i += 3) raw[i] = i & 0xff;
    raw.fill(0, MiB, 2 * MiB);
    writeFileSync(tmp.path("raw.img"), raw);
    const { segments } = await importRaw(tmp.path("raw.img"), tmp.path("raw.layer"));
    expect(segments.every((s) => !s.zeroed)).toBe(true);
    expect(segments.some((s) => s.offset * 512 <= MiB && (s.offset + s.length) * 512 > MiB)).toBe(false);
    const img = await openStack({ lowers: [tmp.path("raw.layer")] });
    expect(img.size).toBe(3 * MiB + 1024);
    const r = new Uint8Array(img.size);
    await img.pread(r, 0);
    expect(sha256(r.subarray(0, raw.length))).toBe(sha256(raw));
    expect(r.subarray(raw.length).every((x) => x === 0)).toBe(true);
    await img.close();
  });

  test("importSparse visits only data extents; with a parent, stores only differences", async () => {
    const p = tmp.path("mem.img");
    const fd = openSync(p, "w+");
    ftruncateSync(fd, 64 * MiB);
    writeSync(fd, new Uint8Array(8192).fill(0xab), 0, 8192, 10 * MiB);
    writeSync(fd, new Uint8Array(4096).fill(0xcd), 0, 4096, 40 * MiB);
    closeSync(fd);
    const res = await importSparse(p, tmp.path("mem.layer"));
    expect(res.segments.map((s) => [s.offset, s.length])).toEqual([[10 * 2048, 16], [40 * 2048, 8]]);
    expect(statSync(tmp.path("mem.layer")).size).toBe(4096 + 12288 + 4096 + 4096);
    // second dump: one block changed, one block zeroed, everything else equal
    const parent = await openStack({ lowers: [tmp.path("mem.layer")] });
    const p2 = tmp.path("mem2.img");
    const fd2 = openSync(p2, "w+");
    ftruncateSync(fd2, 64 * MiB);
    writeSync(fd2, new Uint8Array(4096).fill(0xab), 0, 4096, 10 * MiB);
    writeSync(fd2, new Uint8Array(4096).fill(0xee), 0, 4096, 10 * MiB + 4096);
    closeSync(fd2);
    const res2 = await importSparse(p2, tmp.path("mem2.layer"), { parent });
    expect(res2.segments.map((s) => [s.offset, s.length, s.zeroed])).toEqual([[10 * 2048 + 8, 8, false], [40 * 2048, 8, true]]);
    await parent.close();
    const img = await openStack({ lowers: [tmp.path("mem.layer"), tmp.path("mem2.layer")] });
    const r = new Uint8Array(64 * MiB);
    await img.pread(r, 0);
    expect(sha256(r)).toBe(sha256(readFileSync(p2)));
    await img.close();
  });
});

describe("image config", () => {
  test("config.v1.json with lowers, dir lookup, upper and resultFile", async () => {
    writeFileSync(tmp.path("raw.img"), new Uint8Array(MiB).fill(1));
    await importRaw(tmp.path("raw.img"), tmp.path("base.layer"));
    require("node:fs").mkdirSync(tmp.path("snap/block"), { recursive: true });
    writeFileSync(tmp.path("raw2.img"), new Uint8Array(4096).fill(2));
    await importRaw(tmp.path("raw2.img"), tmp.path("snap/block/overlaybd.commit"), { meta: { virtualSize: MiB } });
    await createUpper(up(), 0);
    const cfg = { lowers: [{ file: "base.layer" }, { dir: tmp.path("snap/block"), digest: "sha256:00" }], upper: { data: "w.data", index: "w.index" }, resultFile: "result" };
    writeFileSync(tmp.path("config.v1.json"), JSON.stringify(cfg));
    const img = await openImageConfig(tmp.path("config.v1.json"));
    expect(readFileSync(tmp.path("result"), "utf8")).toBe("success");
    const r = new Uint8Array(8192);
    await img.pread(r, 0);
    expect(r.subarray(0, 4096).every((x) => x === 2)).toBe(true);
    expect(r.subarray(4096).every((x) => x === 1)).toBe(true);
    expect(img.readOnly).toBe(false);
    await img.close();
    writeFileSync(tmp.path("bad.json"), JSON.stringify({ lowers: [{ file: "missing.layer" }], resultFile: "result2" }));
    await expect(openImageConfig(tmp.path("bad.json"))).rejects.toBeInstanceOf(OverlaybdError);
    expect(readFileSync(tmp.path("result2"), "utf8")).toStartWith("failed:");
    writeFileSync(tmp.path("bad2.json"), "{ nope");
    await expect(openImageConfig(tmp.path("bad2.json"))).rejects.toMatchObject({ code: "overlaybd.bad_config" });
  });
});

describe("seal", () => {
  test("section 6.2 sealed layout; the sealed data file opens as a read-only layer", async () => {
    await createUpper(up(), 64 * MiB, { uuid: "11111111-2222-3333-4444-555555555555" });
    const img = await openStack({ lowers: [], upper: up() });
    await img.pwrite(new Uint8Array(4096).fill(0xcc), MiB);
    const path = await img.restack(null, { data: tmp.path("n.data"), index: tmp.path("n.index") });
    expect(path).toBe(up().data);
    const b = readFileSync(up().data);
    expect(b.length).toBe(0x2200 + 4096);
    expect(b[0x1c]).toBe(3); // header untouched
    expect(Array.from(b.subarray(0x2000, 0x2010))).toEqual(Array.from(hex("00 08 00 00 00 00 20 00 08 00 00 00 00 00 00 00")));
    const t = b.subarray(0x2200);
    expect(t[0x1c]).toBe(6);
    expect(Array.from(t.subarray(0x20, 0x30))).toEqual(Array.from(hex("00 20 00 00 00 00 00 00 01 00 00 00 00 00 00 00")));
    expect(new TextDecoder().decode(t.subarray(0x38, 0x38 + 36))).toBe("11111111-2222-3333-4444-555555555555");
    // the stack keeps working on the fresh upper, whose parent is the sealed layer
    await img.pwrite(new Uint8Array(512).fill(1), MiB);
    const r = new Uint8Array(4096);
    await img.pread(r, MiB);
    expect(r.subarray(0, 512).every((x) => x === 1)).toBe(true);
    expect(r.subarray(512).every((x) => x === 0xcc)).toBe(true);
    await img.close();
    const ro = await openStack({ lowers: [up().data], upper: { data: tmp.path("n.data"), index: tmp.path("n.index") }, verifyChain: true });
    await ro.pread(r, MiB);
    expect(r.subarray(0, 512).every((x) => x === 1)).toBe(true);
    await ro.close();
  });
});

describe("sparse writable layer (overlaybd-create -s)", () => {
  test("layout, index from holes after reopen, discard over a lower reads zeros", async () => {
    writeFileSync(tmp.path("raw.img"), new Uint8Array(MiB).fill(7));
    await importRaw(tmp.path("raw.img"), tmp.path("base.layer"));
    await createUpper(up(), MiB, { sparse: true });
    expect(readFileSync(up().data)[0x1c]).toBe(0x13);
    expect(statSync(up().data).size).toBe(4096 + MiB);
    let img = await openStack({ lowers: [tmp.path("base.layer")], upper: up() });
    await img.pwrite(new Uint8Array(512).fill(9), 8192 + 512); // inside one 4 KiB block: read-modify-write
    await img.discard(65536, 65536);
    await img.sync();
    await img.close();
    expect(statSync(up().index).size).toBe(4096);
    img = await openStack({ lowers: [tmp.path("base.layer")], upper: up() });
    expect(img.writable!.sparse).toBe(true);
    const r = new Uint8Array(MiB);
    await img.pread(r, 0);
    const want = new Uint8Array(MiB).fill(7);
    want.fill(9, 8704, 9216);
    want.fill(0, 65536, 131072);
    expect(Buffer.compare(r, want)).toBe(0);
    // the data file stores virtual byte X at 4096 + X
    expect(readFileSync(up().data)[4096 + 8704]).toBe(9);
    await expect(img.restack(null, { data: tmp.path("n.data"), index: tmp.path("n.index") })).rejects.toMatchObject({ code: "overlaybd.unsupported" });
    await img.close();
    await expect(createUpper({ data: tmp.path("z.data"), index: tmp.path("z.index") }, 0, { sparse: true })).rejects.toMatchObject({ code: "overlaybd.bad_size" });
  });
});

describe("batched reads through io_uring", () => {
  test("preadBatchSync equals pread over plain, ZFile and upper layers", async () => {
    const { IoUring } = await import("../../../src/ffi/io_uring.ts");
    const { compressLayer } = await import("../../../src/storage/overlaybd/index.ts");
    await createUpper(up(), 4 * MiB);
    const img = await openStack({ lowers: [], upper: up() });
    const b = new Uint8Array(MiB);
    for (let k = 0; k < 4; k++) {
      for (let i = 0; i < b.length; i++) b[i] = (i * (k + 3)) & 0xff;
      await img.pwrite(b.subarray(0, MiB - k * 4096), k * 700 * 1024);
      await img.discard(k * 300 * 1024, 8192);
      await img.restack(tmp.path(`L${k}`), { data: tmp.path(`u${k}.data`), index: tmp.path(`u${k}.index`) });
    }
    await img.pwrite(new Uint8Array(5000).fill(0x77), 12345);
    await img.sync();
    await img.close();
    await compressLayer(tmp.path("L1"), tmp.path("L1.z"), { algo: "lz4" });
    const stack = await openStack({ lowers: [tmp.path("L0"), tmp.path("L1.z"), tmp.path("L2"), tmp.path("L3")], upper: { data: tmp.path("u3.data"), index: tmp.path("u3.index") } });
    const ring = new IoUring(8);
    try {
      let seed = 5;
      const rnd = () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32);
      for (let round = 0; round < 20; round++) {
        const reqs = Array.from({ length: 12 }, () => {
          const offset = Math.floor(rnd() * 4 * MiB);
          return { buf: new Uint8Array(1 + Math.floor(rnd() * 70_000)), offset };
        });
        reqs.push({ buf: new Uint8Array(512), offset: 4 * MiB });
        const sizes = stack.preadBatchSync(reqs, ring);
        for (let i = 0; i < reqs.length; i++) {
          const want = new Uint8Array(reqs[i]!.buf.length);
          const n = await stack.pread(want, reqs[i]!.offset);
          expect(sizes[i]).toBe(n);
          expect(Buffer.compare(reqs[i]!.buf.subarray(0, n), want.subarray(0, n))).toBe(0);
        }
      }
      expect(() => stack.preadBatchSync([{ buf: new Uint8Array(512), offset: 5 * MiB }], ring)).toThrow(OverlaybdError);
    } finally {
      ring.close();
      await stack.close();
    }
  });
});
