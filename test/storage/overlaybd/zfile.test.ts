/** ZFile writer/reader round trips: both algorithms, every block size, header-overwrite and trailer-only forms, tar. */
import { afterAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { LocalFile, MemoryBackend, openTarMember, writeZFile, ZFileReader } from "../../../src/storage/overlaybd/index.ts";
import { ZFILE_BLOCK_SIZES } from "../../../src/storage/overlaybd/zfile.ts";
import { rng, scratch } from "./helpers.ts";

const tmp = scratch();
afterAll(() => tmp.cleanup());

const r = rng(99);
const raw = new Uint8Array(300_000 + 123); // not a multiple of any block size
for (let i = 0; i < raw.length; i += 1000) {
  if (r() < 0.5) raw.fill(Math.floor(r() * 256), i, i + 1000);
  else for (let j = i; j < Math.min(i + 1000, raw.length); j++) raw[j] = Math.floor(r() * 256);
}

describe("ZFile round trips", () => {
  for (const algo of ["lz4", "zstd"] as const) {
    for (const bs of ZFILE_BLOCK_SIZES) {
      for (const overwriteHeader of [true, false]) {
        test(`${algo} ${bs / 1024} KiB ${overwriteHeader ? "header" : "trailer"}`, async () => {
          const out = tmp.path(`${algo}-${bs}-${overwriteHeader}`);
          await writeZFile(new MemoryBackend(raw), out, { algo, blockSize: bs, overwriteHeader });
          const f = LocalFile.open(out);
          const z = await ZFileReader.open(f);
          expect(z.source).toBe(overwriteHeader ? "header" : "trailer");
          expect(z.size).toBe(raw.length);
          expect(z.header).toMatchObject({ blockSize: bs, algo: algo === "lz4" ? 1 : 2, verify: true, indexSize: Math.ceil(raw.length / bs) });
          const b = new Uint8Array(raw.length);
          expect(await z.pread(b, 0)).toBe(raw.length);
          expect(Buffer.compare(b, raw)).toBe(0);
          for (let k = 0; k < 50; k++) {
            const off = Math.floor(r() * raw.length), len = 1 + Math.floor(r() * 20_000);
            const part = new Uint8Array(len);
            const n = await z.pread(part, off);
            expect(n).toBe(Math.min(len, raw.length - off));
            expect(Buffer.compare(part.subarray(0, n), raw.subarray(off, off + n))).toBe(0);
          }
          expect(await z.pread(new Uint8Array(10), raw.length)).toBe(0);
          await z.close();
        });
      }
    }
  }

  test("tar-wrapped output unwraps to the same ZFile", async () => {
    const out = tmp.path("wrapped");
    const size = await writeZFile(new MemoryBackend(raw), out, { algo: "lz4", tar: true });
    expect(size % 512).toBe(0);
    const f = LocalFile.open(out);
    const member = (await openTarMember(f))!;
    const z = await ZFileReader.open(member);
    const b = new Uint8Array(raw.length);
    await z.pread(b, 0);
    expect(Buffer.compare(b, raw)).toBe(0);
    // same bytes as the unwrapped form
    await writeZFile(new MemoryBackend(raw), tmp.path("plain"), { algo: "lz4" });
    const plain = readFileSync(tmp.path("plain"));
    expect(Buffer.compare(readFileSync(out).subarray(1536, 1536 + plain.length), plain)).toBe(0);
    await z.close();
  });

  test("bad options are typed errors and leave no file", async () => {
    await expect(writeZFile(new MemoryBackend(raw), tmp.path("x1"), { blockSize: 1000 })).rejects.toMatchObject({ code: "overlaybd.bad_option" });
    await expect(writeZFile(new MemoryBackend(raw), tmp.path("x2"), { algo: "gzip" as "lz4" })).rejects.toMatchObject({ code: "overlaybd.bad_option" });
    await expect(writeZFile(new MemoryBackend(raw), tmp.path("plain"), {})).rejects.toMatchObject({ code: "overlaybd.open_failed" });
    expect(require("node:fs").existsSync(tmp.path("x1"))).toBe(false);
  });
});
