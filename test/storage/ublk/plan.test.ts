/**
 * Direct plans (src/storage/ublk/plan.ts) against the real overlaybd stack they describe: reading
 * every piece a plan yields with pread (and zero filling the rest) must give exactly the bytes
 * `LayeredImage.pread` gives, adjacent extents of one file coalesce into one read, and whatever
 * the queue threads cannot read themselves (an upper's data, a ZFile layer) is diverted.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { readSync } from "node:fs";
import { compressLayer, createUpper, importRaw, openStack } from "../../../src/storage/overlaybd/index.ts";
import {
  firstExtentAfter, isDiverted, markDiverted, newDivertMap, packExtents, planExtentRead, rawPlan, stackPlan, type ExtentPlan, type ReadPiece,
} from "../../../src/storage/ublk/plan.ts";
import { twoLayerTemplate } from "../daemon/fixtures/template.ts";
import { rng, scratch } from "../overlaybd/helpers.ts";

const MiB = 1024 * 1024;
const s = scratch();
afterAll(() => s.cleanup());

/** Read [offset, offset+length) through a plan: pieces by pread, the rest zeros. */
function readByPlan(p: ExtentPlan, offset: number, length: number): { bytes: Uint8Array; pieces: ReadPiece[] } {
  const out = new Uint8Array(length).fill(0xee);
  const pieces: ReadPiece[] = [];
  planExtentRead(p, offset, length, pieces, (b, n) => out.fill(0, b, b + n));
  for (const pc of pieces) {
    const n = readSync(p.files[pc.file]!.fd, out, pc.bufOffset, pc.length, pc.fileOffset);
    expect(n).toBe(pc.length);
  }
  return { bytes: out, pieces };
}

describe("extent plans", () => {
  test("packExtents merges neighbours contiguous in the device and in one file, nothing else", () => {
    const e = packExtents([
      [0, 4096, 0, 8192],
      [4096, 4096, 0, 12288], // continues both: merged
      [8192, 4096, 1, 16384], // other file
      [12288, 4096, 1, 0], // same file, not contiguous in it
      [20480, 4096, 1, 4096], // gap in the device
    ]);
    expect([...e]).toEqual([0, 8192, 0, 8192, 8192, 4096, 1, 16384, 12288, 4096, 1, 0, 20480, 4096, 1, 4096]);
    expect(firstExtentAfter(e, 0)).toBe(0);
    expect(firstExtentAfter(e, 8191)).toBe(0);
    expect(firstExtentAfter(e, 8192)).toBe(1);
    expect(firstExtentAfter(e, 16384)).toBe(3);
    expect(firstExtentAfter(e, 1 << 30)).toBe(4);
  });

  test("planExtentRead: holes before, between and after extents are zero ranges, in order", () => {
    const p: ExtentPlan = { kind: "extents", size: 40960, files: [], extents: packExtents([[4096, 4096, 0, 100], [12288, 8192, 1, 0]]), writeFile: -1, diverted: [] };
    const pieces: ReadPiece[] = [];
    const zeros: Array<[number, number]> = [];
    planExtentRead(p, 2048, 24576, pieces, (b, n) => zeros.push([b, n]));
    expect(zeros).toEqual([[0, 2048], [6144, 4096], [18432, 6144]]);
    expect(pieces).toEqual([
      { file: 0, fileOffset: 100, bufOffset: 2048, length: 4096 },
      { file: 1, fileOffset: 0, bufOffset: 10240, length: 8192 },
    ]);
  });

  test("a two-layer stack with an upper: the plan reads what the image reads; the upper's data is diverted", async () => {
    const size = 8 * MiB;
    const { lowers, expected } = await twoLayerTemplate(s.dir, "t1", size);
    const upper = { data: s.path("u.data"), index: s.path("u.index") };
    await createUpper(upper, 0);
    const img = await openStack({ lowers, upper });
    try {
      const w = new Uint8Array(8192).fill(0x77);
      await img.pwrite(w, 1 * MiB + 512);
      const plan = stackPlan(img)!;
      expect(plan.files.map((f) => f.name)).toEqual(lowers);
      expect(plan.writeFile).toBe(-1);
      // the upper's one write is the only diverted range
      expect(plan.diverted).toEqual([[1 * MiB + 512, 1 * MiB + 512 + 8192]]);
      // extents never overlap and stay sorted
      for (let i = 4; i < plan.extents.length; i += 4) expect(plan.extents[i]!).toBeGreaterThanOrEqual(plan.extents[i - 4]! + plan.extents[i - 3]!);
      // 1 MiB at 3 MiB comes from layer1 in one piece (coalesced), the 5 MiB hole is zeros
      const mid = readByPlan(plan, 3 * MiB, MiB);
      expect(mid.pieces.length).toBe(1);
      expect(mid.pieces[0]!.file).toBe(1);
      expect(Buffer.compare(mid.bytes, expected.subarray(3 * MiB, 4 * MiB))).toBe(0);
      const hole = readByPlan(plan, 5 * MiB, MiB);
      expect(hole.pieces).toEqual([]);
      expect(hole.bytes.every((b) => b === 0)).toBe(true);
      // random ranges outside the diverted one match the image byte for byte
      const r = rng(7);
      for (let i = 0; i < 200; i++) {
        const off = Math.floor(r() * (size / 512 - 64)) * 512, len = (1 + Math.floor(r() * 63)) * 512;
        if (off < plan.diverted[0]![1] && off + len > plan.diverted[0]![0]) continue;
        const want = new Uint8Array(len);
        await img.pread(want, off);
        expect(Buffer.compare(readByPlan(plan, off, len).bytes, want)).toBe(0);
      }
    } finally {
      await img.close();
    }
  });

  test("a ZFile-compressed layer is diverted, not planned; a stack of only ZFile layers has no plan", async () => {
    const raw = new Uint8Array(2 * MiB);
    for (let i = 0; i < raw.length; i += 4) new DataView(raw.buffer).setUint32(i, i ^ 0x5a5a5a5a, true);
    await Bun.write(s.path("z.raw"), raw);
    await importRaw(s.path("z.raw"), s.path("z.layer"));
    await compressLayer(s.path("z.layer"), s.path("z.zfile"));
    const only = await openStack({ lowers: [s.path("z.zfile")] });
    try {
      expect(stackPlan(only)).toBeNull();
    } finally {
      await only.close();
    }
    const { lowers } = await twoLayerTemplate(s.dir, "t2", 8 * MiB, 3);
    const mixed = await openStack({ lowers: [...lowers, s.path("z.zfile")] });
    try {
      const plan = stackPlan(mixed)!;
      // the ZFile layer on top covers [0, 2 MiB): diverted; nothing below it is planned there
      expect(plan.diverted[0]![0]).toBe(0);
      expect(plan.diverted.reduce((n, [a, b]) => n + b - a, 0)).toBe(2 * MiB);
      expect(firstExtentAfter(plan.extents, 0)).toBe(0);
      expect(plan.extents[0]!).toBeGreaterThanOrEqual(2 * MiB);
    } finally {
      await mixed.close();
    }
  });

  test("rawPlan is the identity map, written directly unless read-only", () => {
    expect(rawPlan({ fd: 9, name: "r" }, 65536, false)).toEqual({ kind: "extents", size: 65536, files: [{ fd: 9, name: "r" }], extents: Float64Array.of(0, 65536, 0, 0), writeFile: 0, diverted: [] });
    expect(rawPlan({ fd: 9, name: "r" }, 65536, true).writeFile).toBe(-1);
  });

  test("divert map: a mark covers every 4 KiB block the range touches, and only those", () => {
    const m = newDivertMap(1 << 20);
    expect(isDiverted(m, 0, 1 << 20)).toBe(false);
    markDiverted(m, 4096 * 3 + 100, 5000); // blocks 3 and 4
    expect(isDiverted(m, 4096 * 3, 512)).toBe(true);
    expect(isDiverted(m, 4096 * 4 + 4000, 96)).toBe(true);
    expect(isDiverted(m, 4096 * 2, 4096)).toBe(false);
    expect(isDiverted(m, 4096 * 5, 4096)).toBe(false);
    markDiverted(m, 4096 * 31, 4096 * 2); // across an Int32 word boundary
    expect(isDiverted(m, 4096 * 32, 512)).toBe(true);
    expect(isDiverted(m, 4096 * 33, 512)).toBe(false);
  });
});
