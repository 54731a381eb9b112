import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LocalFile } from "../../../src/storage/overlaybd/backend.ts";
import { rawCrc32c } from "../../../src/storage/overlaybd/crc32c.ts";
import {
  decodeHeaderTrailer, decodeSegment, encodeHeaderTrailer, encodeSegments, HT_SIZE, HTFlag, INVALID_SEGMENT, type Segment,
} from "../../../src/storage/overlaybd/format.ts";
import { lz4Bound, lz4Compress, lz4Decompress } from "../../../src/storage/overlaybd/lz4.ts";
import { insertSegment, lookup, mergeNeighbours, overlay } from "../../../src/storage/overlaybd/segments.ts";
import { isTarHeader, openTarMember, tarNumber, tarPrefix } from "../../../src/storage/overlaybd/tar.ts";
import { decodeZHeader, encodeZHeader, ZFlag } from "../../../src/storage/overlaybd/zfile.ts";
import { OverlaybdError } from "../../../src/storage/overlaybd/errors.ts";
import { HELLO, hex, rng } from "./helpers.ts";

const seg = (offset: number, length: number, moffset: number, tag = 0, zeroed = false): Segment => ({ offset, length, moffset, zeroed, tag });
const triples = (segs: Segment[]) => segs.map((s) => [s.offset, s.length, s.moffset, s.tag]);

describe("CRC-32C raw (overlaybd-format.md 3.4)", () => {
  test("vectors", () => {
    const d = new TextEncoder().encode("123456789");
    expect(rawCrc32c(d, 0)).toBe(0x58e3fa20);
    expect(rawCrc32c(d, 100007)).toBe(0x3c9bd4e0);
  });
});

describe("LSMT header/trailer", () => {
  // section 6.1: committed file header, 64 MiB, null uuids
  const header61 = hex(`
    4c 53 4d 54 00 01 02 00 65 7e 63 d2 94 44 08 4c a2 d2 c8 ec 4f cf ae 8a 86 01 00 00 07 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 04 00 00 00 00 30 30 30 30 30 30 30 30
    2d 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 30 30 30 30 30 30 30 30 00 30 30 30
    30 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 2d 30 30 30 30 30 30 30 30 30 30 30
    30 00 00 00 01 01 00 00 00 00 00 00 00 00 00 00`);
  test("encodes the section 6.1 header byte for byte", () => {
    const b = encodeHeaderTrailer({ flags: 7, virtualSize: 64 << 20 });
    expect(b.length).toBe(HT_SIZE);
    expect(Array.from(b.subarray(0, header61.length))).toEqual(Array.from(header61));
    expect(b.subarray(header61.length).every((x) => x === 0)).toBe(true);
  });
  test("round trips fields incl. user tag and upper-cased uuid", () => {
    const b = encodeHeaderTrailer({ flags: 6, indexOffset: 8192, indexSize: 256, virtualSize: 1 << 30, uuid: "01bb4fce-3eb1-b56b-05ad-f99504dafd31", userTag: "hello" });
    const h = decodeHeaderTrailer(b, "x", 0);
    expect(h).toMatchObject({ flags: 6, indexOffset: 8192, indexSize: 256, virtualSize: 1 << 30, uuid: "01BB4FCE-3EB1-B56B-05AD-F99504DAFD31", userTag: "hello", version: 1, subVersion: 1 });
    expect(b[0x86]).toBe("h".charCodeAt(0));
  });
  test("rejects wrong magic with file and offset", () => {
    const b = encodeHeaderTrailer({ flags: 7 });
    b[3] = 0;
    try {
      decodeHeaderTrailer(b, "f.layer", 4096);
      throw new Error("no throw");
    } catch (e) {
      expect(e).toBeInstanceOf(OverlaybdError);
      expect((e as OverlaybdError).code).toBe("overlaybd.bad_magic");
      expect((e as OverlaybdError).details).toMatchObject({ file: "f.layer", offset: 4096 });
    }
  });
  test("rejects a malformed uuid", () => {
    expect(() => encodeHeaderTrailer({ flags: 7, uuid: "nope" })).toThrow(OverlaybdError);
  });
});

describe("SegmentMapping", () => {
  test("section 6 entry and the padding entry", () => {
    const b = encodeSegments([seg(2048, 8, 8)], 2);
    expect(Array.from(b.subarray(0, 16))).toEqual(Array.from(hex("00 08 00 00 00 00 20 00 08 00 00 00 00 00 00 00")));
    expect(Array.from(b.subarray(16))).toEqual(Array.from(hex("ff ff ff ff ff ff 03 00 00 00 00 00 00 00 00 00")));
    expect(decodeSegment(new DataView(b.buffer), 1)).toEqual(INVALID_SEGMENT);
  });
  test("maximum field values and flags round trip", () => {
    const s = seg(2 ** 50 - 2, 16383, 2 ** 53 - 1, 255, true);
    const b = encodeSegments([s]);
    expect(decodeSegment(new DataView(b.buffer), 0)).toEqual(s);
    expect(b[15]).toBe(255);
    expect(b[14]! & 0x80).toBe(0x80);
  });
});

describe("index vectors from overlaybd lsmt/test/test.cpp (overlaybd-format.md 7.3)", () => {
  const idx = [seg(0, 10, 0), seg(10, 10, 50), seg(100, 10, 20)];
  test("lookup", () => {
    expect(triples(lookup(idx, 5, 10))).toEqual([[5, 5, 5, 0], [10, 5, 50, 0]]);
    expect(triples(lookup(idx, 16, 10))).toEqual([[16, 4, 56, 0]]);
    expect(lookup(idx, 26, 10)).toEqual([]);
    expect(triples(lookup(idx, 6, 100))).toEqual([[6, 4, 6, 0], [10, 10, 50, 0], [100, 6, 20, 0]]);
  });
  test("insert", () => {
    const segs: Segment[] = [];
    for (const [o, l, m] of [[0, 20, 0], [10, 15, 50], [30, 100, 20], [5, 10, 3], [40, 10, 123], [200, 10, 2133], [150, 100, 21]]) insertSegment(segs, seg(o!, l!, m!));
    expect(triples(segs)).toEqual([[0, 5, 0, 0], [5, 10, 3, 0], [15, 10, 55, 0], [30, 10, 20, 0], [40, 10, 123, 0], [50, 80, 40, 0], [150, 100, 21, 0]]);
  });
  test("merge rule", () => {
    expect(triples(mergeNeighbours([seg(5, 5, 0), seg(10, 10, 5), seg(20, 10, 15, 1), seg(100, 10, 20)]))).toEqual([[5, 15, 0, 0], [20, 10, 15, 1], [100, 10, 20, 0]]);
    // the strict 16383 cap
    expect(mergeNeighbours([seg(0, 16320, 8), seg(16320, 64, 16328)]).length).toBe(2);
    expect(mergeNeighbours([seg(0, 16318, 8), seg(16318, 64, 16326)]).length).toBe(1);
  });
  test("overlay keeps upper zeroed entries and fills gaps from lower", () => {
    const up = [seg(10, 5, 100, 1), seg(30, 10, 200, 1, true)];
    const low = [seg(0, 50, 8)];
    expect(overlay(up, low).map((s) => [s.offset, s.length, s.moffset, s.tag, s.zeroed])).toEqual([
      [0, 10, 8, 0, false], [10, 5, 100, 1, false], [15, 15, 23, 0, false], [30, 10, 200, 1, true], [40, 10, 48, 0, false],
    ]);
  });
  test("random inserts equal a sector map", () => {
    const r = rng(7);
    const segs: Segment[] = [];
    const map = new Map<number, number>();
    for (let k = 0; k < 2000; k++) {
      const o = Math.floor(r() * 500), l = 1 + Math.floor(r() * 40), m = 8 + k * 64;
      insertSegment(segs, seg(o, l, m));
      for (let i = 0; i < l; i++) map.set(o + i, m + i);
    }
    for (let i = 1; i < segs.length; i++) expect(segs[i - 1]!.offset + segs[i - 1]!.length).toBeLessThanOrEqual(segs[i]!.offset);
    let covered = 0;
    for (const s of segs) for (let i = 0; i < s.length; i++, covered++) expect(map.get(s.offset + i)).toBe(s.moffset + i);
    expect(covered).toBe(map.size);
  });
});

describe("LZ4 block codec", () => {
  test("zero page vector (overlaybd-format.md 3.4)", () => {
    const dst = new Uint8Array(lz4Bound(4096));
    const n = lz4Compress(new Uint8Array(4096), dst);
    expect(Array.from(dst.subarray(0, n))).toEqual(Array.from(hex("1f 00 01 00" + " ff".repeat(15) + " f6 50 00 00 00 00 00")));
    expect(rawCrc32c(dst.subarray(0, n), 100007)).toBe(0xb4911724);
  });
  test("0xCC page vector (section 6.3)", () => {
    const dst = new Uint8Array(lz4Bound(4096));
    const n = lz4Compress(new Uint8Array(4096).fill(0xcc), dst);
    expect(Array.from(dst.subarray(0, n))).toEqual(Array.from(hex("1f cc 01 00" + " ff".repeat(15) + " f6 50 cc cc cc cc cc")));
  });
  test("round trips random and mixed data of many sizes", () => {
    const r = rng(3);
    for (const size of [0, 1, 12, 13, 100, 4096, 65536]) {
      const src = new Uint8Array(size);
      for (let i = 0; i < size; i++) src[i] = r() < 0.5 ? 0x41 + (i % 7) : Math.floor(r() * 256);
      const c = new Uint8Array(lz4Bound(size));
      const n = lz4Compress(src, c);
      const out = new Uint8Array(size);
      expect(lz4Decompress(c.subarray(0, n), out)).toBe(size);
      expect(Buffer.compare(out, src)).toBe(0);
    }
  });
  test("corrupt input is a typed error, never an overrun", () => {
    expect(() => lz4Decompress(Uint8Array.of(0x1f, 0x00, 0x10, 0x00), new Uint8Array(4096))).toThrow(OverlaybdError);
    expect(() => lz4Decompress(Uint8Array.of(0xf0), new Uint8Array(10))).toThrow(OverlaybdError);
    expect(() => lz4Decompress(Uint8Array.of(0x50, 1, 2, 3, 4, 5), new Uint8Array(3))).toThrow(OverlaybdError);
  });
});

describe("ZFile header", () => {
  test("section 6.3 final header byte for byte", () => {
    const want = hex(`
      5a 46 69 6c 65 00 01 00 74 75 6a 69 2e 79 79 66 40 41 6c 69 62 61 62 61 60 00 00 00 41 73 d9 44
      1b 00 00 00 00 00 00 00 2f 03 00 00 00 00 00 00 04 00 00 00 00 00 00 00 00 40 00 00 00 00 00 00
      7f 79 8a 70 00 00 00 00 00 10 00 00 01 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00`);
    const b = encodeZHeader({ flags: ZFlag.HEADER | ZFlag.DATA | ZFlag.OVERWRITE | ZFlag.DIGEST, indexOffset: 815, indexSize: 4, rawSize: 16384, indexCrc: 0x708a797f, blockSize: 4096, algo: 1, level: 0, dictSize: 0, verify: true });
    expect(Array.from(b.subarray(0, 96))).toEqual(Array.from(want));
    const t = encodeZHeader({ flags: ZFlag.DATA | ZFlag.SEALED | ZFlag.DIGEST, indexOffset: 815, indexSize: 4, rawSize: 16384, indexCrc: 0x708a797f, blockSize: 4096, algo: 1, level: 0, dictSize: 0, verify: true });
    expect(Array.from(t.subarray(28, 36))).toEqual(Array.from(hex("65 a6 19 b4 16 00 00 00")));
    expect(decodeZHeader(b, "x", 0)).toMatchObject({ indexOffset: 815, indexSize: 4, rawSize: 16384, verify: true, algo: 1 });
  });
});

describe("tar wrapper", () => {
  test("prefix equals the convertor's first 1536 bytes", async () => {
    const fixture = new Uint8Array(await Bun.file(HELLO).slice(0, 1536).arrayBuffer());
    const mine = tarPrefix(639491);
    expect(isTarHeader(mine)).toBe(true);
    expect(Buffer.compare(mine, fixture)).toBe(0);
  });
  test("GNU base-256 size fields (members of 8 GiB and more) are read as GNU tar and Python's tarfile read them", async () => {
    // a plain ustar header (the wrapper's second block) whose size field is base-256
    const size = 9 * 1024 ** 3 + 5; // past the 11 octal digits' 8 GiB
    const h = tarPrefix(0).slice(1024, 1536);
    h.fill(0, 124, 136);
    h[124] = 0x80;
    let v = size;
    for (let i = 135; i > 124; i--) {
      h[i] = v % 256;
      v = Math.floor(v / 256);
    }
    h.fill(0x20, 148, 156);
    let sum = 0;
    for (const b of h) sum += b;
    h.set(new TextEncoder().encode(sum.toString(8).padStart(6, "0") + "\0 "), 148);
    expect(isTarHeader(h)).toBe(true);
    expect(tarNumber(h, 124, 12)).toBe(size);
    const dir = mkdtempSync(join(tmpdir(), "tar256-"));
    try {
      const path = join(dir, "big.tar");
      writeFileSync(path, h);
      truncateSync(path, 512 + size + 1024); // sparse: header, payload, end blocks
      const file = LocalFile.open(path);
      const m = await openTarMember(file);
      expect(m?.size).toBe(size);
      await m!.close();
      // a file too short for the size it declares is refused, not read past its end
      truncateSync(path, 512 + size - 1);
      const short = LocalFile.open(path);
      await expect(openTarMember(short)).rejects.toMatchObject({ code: "overlaybd.bad_tar" });
      await short.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    // octal, GNU's other base-256 lead bits, and what is refused
    const f = (bytes: number[]) => tarNumber(new Uint8Array(bytes), 0, bytes.length);
    expect(f([...Buffer.from("00000001750 ")])).toBe(0o1750);
    expect(f([0x81, 0, 0, 1])).toBe(256 ** 3 + 1); // the lead byte's low bits count
    expect(f([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe])).toBeNaN(); // negative
    expect(f([...Buffer.from("12x45       ")])).toBeNaN();
  });

  test("GNU-format headers as GNU tar and Python's tarfile write them (magic 'ustar  \\0') are tar: a 9 GiB member's base-256 size, and a small member's bytes", async () => {
    const dir = mkdtempSync(join(tmpdir(), "targnu-"));
    try {
      // Python's tarfile, GNU format, a member past 8 GiB: the header it writes, then a sparse payload
      const size = 9 * 1024 ** 3 + 5;
      const py = Bun.spawnSync(["python3", "-c", `import sys, tarfile; t = tarfile.TarInfo("big.bin"); t.size = ${size}; sys.stdout.buffer.write(t.tobuf(tarfile.GNU_FORMAT))`]);
      expect(py.exitCode).toBe(0);
      const h = new Uint8Array(py.stdout);
      expect(h.length).toBe(512);
      expect([Buffer.from(h.subarray(257, 265)).toString("latin1"), h[124]]).toEqual(["ustar  \0", 0x80]);
      expect(isTarHeader(h)).toBe(true);
      expect(tarNumber(h, 124, 12)).toBe(size);
      const big = join(dir, "big.tar");
      writeFileSync(big, h);
      truncateSync(big, 512 + Math.ceil(size / 512) * 512 + 1024);
      const file = LocalFile.open(big);
      const m = await openTarMember(file);
      expect(m?.size).toBe(size);
      await m!.close();

      // GNU tar's own output (--format=gnu), a member with bytes: the payload comes back exactly
      const next = rng(7);
      const payload = Uint8Array.from({ length: 3000 }, () => Math.floor(next() * 256));
      writeFileSync(join(dir, "payload"), payload);
      const tarred = join(dir, "small.tar");
      const t = Bun.spawnSync(["tar", "--format=gnu", "-cf", tarred, "-C", dir, "payload"]);
      expect(t.exitCode).toBe(0);
      const small = LocalFile.open(tarred);
      const head = new Uint8Array(512);
      await small.pread(head, 0);
      expect(Buffer.from(head.subarray(257, 265)).toString("latin1")).toBe("ustar  \0");
      const sm = await openTarMember(small);
      expect(sm?.size).toBe(3000);
      const back = new Uint8Array(3000);
      await sm!.pread(back, 0);
      expect(Buffer.from(back).equals(Buffer.from(payload))).toBe(true);
      await sm!.close();

      // magic "ustar " with a version other than GNU's " \0" is neither format
      const odd = new Uint8Array(h);
      odd[263] = 0x30;
      let sum = 0;
      for (let i = 0; i < 512; i++) sum += i >= 148 && i < 156 ? 0x20 : odd[i]!;
      odd.set(new TextEncoder().encode(sum.toString(8).padStart(6, "0") + "\0 "), 148);
      expect(isTarHeader(odd)).toBe(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a header with a bad checksum is not tar", () => {
    const p = tarPrefix(10);
    p[0] ^= 1;
    expect(isTarHeader(p)).toBe(false);
  });
});
