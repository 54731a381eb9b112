/**
 * Golden tests against the blobs made by the original overlaybd tools
 * (../shared/overlaybd-fixtures, sha256s from its README).
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { compressLayer, LocalFile, openRoLayerFile, openStack, unwrapBlob, ZFileReader } from "../../../src/storage/overlaybd/index.ts";
import { extractExt4, HELLO, scratch, sha256 } from "./helpers.ts";

const tmp = scratch();
let EXT4 = "";
beforeAll(async () => {
  EXT4 = await extractExt4(tmp.dir);
}, 60_000);
afterAll(() => tmp.cleanup());

async function hashBackend(b: { size: number; pread(buf: Uint8Array, off: number): Promise<number> }): Promise<string> {
  const h = createHash("sha256");
  const buf = new Uint8Array(4 << 20);
  for (let off = 0; off < b.size; off += buf.length) h.update(buf.subarray(0, await b.pread(buf, off)));
  return h.digest("hex");
}

describe("ext4_64 (2021 ZFile, trailer-only, junk header bytes)", () => {
  test("ZFile opens by trailer; every block CRC checks; LSMT sha256 matches", async () => {
    const f = LocalFile.open(EXT4);
    const { lsmt, wrapping } = await unwrapBlob(f);
    expect(wrapping.tar).toBe(false);
    const z = wrapping.zfile!;
    expect(z.source).toBe("trailer");
    expect(z.header).toMatchObject({ indexOffset: 4_207_947, indexSize: 132_309, rawSize: 541_937_664, blockSize: 4096, algo: 1, verify: true });
    expect(await hashBackend(lsmt)).toBe("799dbd74cbcfbd7f37611057130b20fda0e1e671280df97cc3a05d73620d5ac7");
    await f.close();
  }, 60_000);
  test("LSMT facts and virtual bytes", async () => {
    const layer = await openRoLayerFile(EXT4);
    expect(layer.header.flags).toBe(7);
    expect(layer.trailer).toMatchObject({ flags: 6, virtualSize: 68_719_476_736, indexOffset: 541_798_400, indexSize: 8448, uuid: "C02FB491-B4D4-4904-8684-A014D032AF78", parentUuid: "00000000-0000-0000-0000-000000000000" });
    expect(layer.segments.length).toBe(8323);
    let data = 0, zero = 0;
    for (const s of layer.segments) s.zeroed ? (zero += s.length) : (data += s.length);
    expect(data).toBe(1_058_192);
    expect(zero).toBe(133_159_536);
    const img = await openStack({ lowers: [layer] });
    const buf = new Uint8Array(4 << 20);
    expect(await img.pread(buf, 0)).toBe(buf.length);
    expect(sha256(buf)).toBe("3c651b5d7283c6fad4089b6ad061381fcb3bcecf57100a11cee5084131a27ad4");
    expect([buf[1080], buf[1081]]).toEqual([0x53, 0xef]);
    // the last sector of the 64 GiB disk reads (as zeros or data) and a read past it fails
    const last = new Uint8Array(512);
    expect(await img.pread(last, img.size - 512)).toBe(512);
    expect(await img.pread(last, img.size)).toBe(0);
    await expect(img.pread(last, img.size + 512)).rejects.toMatchObject({ code: "overlaybd.out_of_range" });
    await img.close();
  }, 60_000);
  test("commit of the layer reproduces the original LSMT byte for byte", async () => {
    const img = await openStack({ lowers: [EXT4] });
    const out = tmp.path("ext4.commit");
    await img.commit(out, { flatten: true, meta: { uuid: "C02FB491-B4D4-4904-8684-A014D032AF78" } });
    await img.close();
    const f = LocalFile.open(out);
    expect(await hashBackend(f)).toBe("799dbd74cbcfbd7f37611057130b20fda0e1e671280df97cc3a05d73620d5ac7");
    await f.close();
    require("node:fs").rmSync(out);
  }, 120_000);
});

describe("hello-world layer (tar + ZFile with header overwrite and digests)", () => {
  test("tar unwrap, ZFile by header, CRCs, LSMT sha256", async () => {
    const f = LocalFile.open(HELLO);
    const { lsmt, wrapping } = await unwrapBlob(f);
    expect(wrapping.tar).toBe(true);
    const z = wrapping.zfile as ZFileReader;
    expect(z.source).toBe("header");
    expect(z.header).toMatchObject({ flags: 0x1b, digest: 0x0f1f3445, indexOffset: 569_127, indexSize: 17_463, indexCrc: 0x6dba55b0, rawSize: 71_528_448 });
    expect(await z.verifyAll()).toBe(17_463);
    expect(await hashBackend(lsmt)).toBe("39195424aa10572fe002262190877b4306a66be9c62c8f1594141b01dc79c2ea");
    await f.close();
  }, 60_000);
  test("virtual bytes [0,4 MiB) and [0,8 MiB)", async () => {
    const img = await openStack({ lowers: [HELLO] });
    expect(img.size).toBe(68_719_476_736);
    const layer = img.lowers[0]!;
    expect(layer.trailer).toMatchObject({ indexOffset: 71_512_064, indexSize: 768, uuid: "01BB4FCE-3EB1-B56B-05AD-F99504DAFD31" });
    expect(layer.segments.length).toBe(515);
    const buf = new Uint8Array(8 << 20);
    await img.pread(buf, 0);
    expect(sha256(buf.subarray(0, 4 << 20))).toBe("1ba9757892e20ff13d4dc47e72694349129a92f41f20b65010a4082f3261466c");
    expect(sha256(buf)).toBe("6747a26dcb4c5000cbda3c13f8ca26b0132048eb2df88fef59504e304f2938ed");
    // unaligned reads agree with the aligned ones
    const odd = new Uint8Array(10_001);
    await img.pread(odd, 1_234_567);
    expect(Buffer.compare(odd, buf.subarray(1_234_567, 1_234_567 + 10_001))).toBe(0);
    await img.close();
  }, 60_000);
  test("commit + LZ4 ZFile + tar reproduces the convertor's blob byte for byte", async () => {
    const img = await openStack({ lowers: [HELLO] });
    const lsmt = tmp.path("hello.commit");
    await img.commit(lsmt, { flatten: true, meta: { uuid: "01BB4FCE-3EB1-B56B-05AD-F99504DAFD31" } });
    await img.close();
    expect(sha256(readFileSync(lsmt))).toBe("39195424aa10572fe002262190877b4306a66be9c62c8f1594141b01dc79c2ea");
    const blob = tmp.path("hello.blob");
    expect(await compressLayer(lsmt, blob, { algo: "lz4", tar: true })).toBe(642_560);
    expect(sha256(readFileSync(blob))).toBe("022231c3f1af70e0cc42f0c3781eabf174cff608210585bf93fc83e16d33672d");
  }, 60_000);
  test("two-layer stack: hello-world over ext4_64 reads hello-world where it has data", async () => {
    const img = await openStack({ lowers: [EXT4, HELLO] });
    const top = await openStack({ lowers: [HELLO] });
    const a = new Uint8Array(1 << 20), b = new Uint8Array(1 << 20);
    await img.pread(a, 0);
    await top.pread(b, 0);
    expect(Buffer.compare(a, b)).toBe(0);
    await img.close();
    await top.close();
  }, 60_000);
});
