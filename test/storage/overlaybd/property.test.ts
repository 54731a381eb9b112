/**
 * Property test: thousands of random writes, discards, reads, reopenings, restacks (commit and
 * seal), ZFile
 * compressions of lower layers and flattening commits against an in-memory reference disk,
 * with a fixed seed. Every read must equal the reference.
 */
import { afterAll, expect, test } from "bun:test";
import { compressLayer, createUpper, type LayeredImage, openStack } from "../../../src/storage/overlaybd/index.ts";
import { rng, scratch } from "./helpers.ts";

const tmp = scratch();
afterAll(() => tmp.cleanup());

for (const sparse of [false, true]) test(`random ops against a reference disk (seed 20261129, ${sparse ? "sparse" : "log"} upper)`, async () => {
  const SIZE = 4 << 20;
  const file = (n: string) => tmp.path(`${sparse ? "s" : "l"}-${n}`);
  const r = rng(20261129);
  const int = (n: number) => Math.floor(r() * n);
  const ref = new Uint8Array(SIZE);
  let gen = 0;
  const lowers: string[] = [];
  let upper = { data: file("u0.data"), index: file("u0.index") };
  await createUpper(upper, SIZE, { sparse });
  let img: LayeredImage = await openStack({ lowers, upper });
  const counts: Record<string, number> = {};
  const pick = (): [number, number] => {
    const aligned = r() < 0.7;
    let off = aligned ? int(SIZE / 512) * 512 : int(SIZE);
    let len = aligned ? (1 + int(r() < 0.9 ? 16 : 2048)) * 512 : 1 + int(70_000);
    if (off + len > SIZE) len = SIZE - off;
    if (len === 0) (off = 0), (len = 512);
    return [off, len];
  };
  const check = async (off: number, len: number) => {
    const b = new Uint8Array(len);
    expect(await img.pread(b, off)).toBe(len);
    if (Buffer.compare(b, ref.subarray(off, off + len)) !== 0) {
      let i = 0;
      while (b[i] === ref[off + i]) i++;
      throw new Error(`mismatch at virtual byte ${off + i} (got ${b[i]}, want ${ref[off + i]}) after ${JSON.stringify(counts)}`);
    }
  };
  const OPS = sparse ? 2500 : 4000;
  for (let step = 0; step < OPS; step++) {
    const x = r();
    let op: string;
    if (x < 0.45) {
      op = "write";
      const [off, len] = pick();
      const b = new Uint8Array(len);
      const v = 1 + int(255);
      for (let i = 0; i < len; i += 97) b.fill((v + i) & 0xff, i, Math.min(len, i + 97));
      await img.pwrite(b, off);
      ref.set(b, off);
    } else if (x < 0.55) {
      op = "discard";
      const [off, len] = pick();
      await img.discard(off, len);
      ref.fill(0, off, off + len);
    } else if (x < 0.93) {
      op = "read";
      const [off, len] = pick();
      await check(off, len);
    } else if (x < 0.97) {
      op = "reopen";
      await img.sync();
      await img.close();
      img = await openStack({ lowers, upper });
    } else if (x < 0.99) {
      op = "restack";
      gen++;
      const layer = file(`l${gen}.layer`);
      const next = { data: file(`u${gen}.data`), index: file(`u${gen}.index`) };
      // every third restack seals the upper in place instead of committing a copy
      lowers.push(await img.restack(gen % 3 === 0 && !sparse ? null : layer, next));
      upper = next;
      // every other new layer is swapped for its ZFile form (alternating lz4 / zstd)
      if (gen % 2 === 0) {
        await img.close();
        const z = `${layer}.z`;
        await compressLayer(lowers[lowers.length - 1]!, z, { algo: gen % 4 === 0 ? "lz4" : "zstd" });
        lowers[lowers.length - 1] = z;
        img = await openStack({ lowers, upper });
      }
    } else {
      op = "flatten";
      gen++;
      const flat = file(`flat${gen}.layer`);
      await img.commit(flat, { flatten: true });
      const f = await openStack({ lowers: [flat] });
      const b = new Uint8Array(SIZE);
      await f.pread(b, 0);
      await f.close();
      expect(Buffer.compare(b, ref)).toBe(0);
    }
    counts[op] = (counts[op] ?? 0) + 1;
  }
  await check(0, SIZE);
  await img.close();
  expect(lowers.length).toBeGreaterThan(5);
  for (const k of ["write", "discard", "read", "reopen", "restack", "flatten"]) expect(counts[k]).toBeGreaterThan(10);
}, 120_000);
