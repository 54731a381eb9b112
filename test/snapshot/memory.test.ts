/**
 * Memory layers and shared images without VMs: the first layer of a RAM image imported sparse
 * (zero pages not stored), a diff of changed pages on top (a zeroed page hides the page below,
 * unchanged pages fall through), a full file compared with its parent; and the refcounted table
 * of shared images (one open per key, closed when the last lease goes, failures not cached).
 */
import { afterAll, describe, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SharedImages, writeMemoryLayer, type ServedImage } from "../../src/snapshot/index.ts";
import { importChangedRanges, openStack } from "../../src/storage/overlaybd/index.ts";

const dir = mkdtempSync(join(tmpdir(), "snapmem-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const P = 4096;
const SIZE = 64 * P;

/** A sparse RAM file: pages listed get their fill byte, the rest is a hole. */
function ramFile(name: string, pages: Record<number, number>): string {
  const p = join(dir, name);
  const fd = openSync(p, "w");
  writeSync(fd, new Uint8Array(1), 0, 1, SIZE - 1); // size
  writeSync(fd, new Uint8Array(1), 0, 1, SIZE - 1);
  for (const [pg, fill] of Object.entries(pages)) writeSync(fd, new Uint8Array(P).fill(fill), 0, P, Number(pg) * P);
  closeSync(fd);
  return p;
}

async function readImage(layers: string[]): Promise<Uint8Array> {
  await using img = await openStack({ lowers: layers });
  const b = new Uint8Array(SIZE);
  await img.pread(b, 0);
  return b;
}

const pageOf = (b: Uint8Array, pg: number) => b[pg * P]!;

describe("memory layers", () => {
  test("a booted VM's RAM file: only non-zero pages stored; a diff of changed pages on top", async () => {
    const base = join(dir, "base.layer");
    const r0 = await writeMemoryLayer({ kind: "file", path: ramFile("ram0", { 1: 0x11, 2: 0, 7: 0x77 }), overParent: false }, base, { size: SIZE, parentLayers: [] });
    expect(r0.changedBytes).toBe(2 * P); // page 2 holds zeros: not data
    // changed since the restore: page 1 rewritten, page 7 zeroed, page 9 new
    const cur: Record<number, number> = { 1: 0x12, 7: 0, 9: 0x99 };
    const diff = join(dir, "diff.layer");
    const r1 = await writeMemoryLayer(
      { kind: "changed", ranges: [[1 * P, 2 * P], [7 * P, 8 * P], [9 * P, 10 * P]], read: (buf, off) => buf.fill(cur[off / P] ?? 0xff) },
      diff,
      { size: SIZE, parentLayers: [base] },
    );
    expect(r1.changedBytes).toBe(3 * P);
    const img = await readImage([base, diff]);
    expect([1, 2, 3, 7, 9].map((pg) => pageOf(img, pg))).toEqual([0x12, 0, 0, 0, 0x99]);
    // the diff alone stores 2 data pages (page 7 is a zeroed entry)
    await using d = await openStack({ lowers: [diff] });
    const segs = d.roIndex.map((s) => ({ at: (s.offset * 512) / P, pages: (s.length * 512) / P, zeroed: s.zeroed }));
    expect(segs).toEqual([
      { at: 1, pages: 1, zeroed: false },
      { at: 7, pages: 1, zeroed: true },
      { at: 9, pages: 1, zeroed: false },
    ]);
  });

  test("a whole RAM file over a parent keeps only differing pages", async () => {
    const base = join(dir, "base2.layer");
    await writeMemoryLayer({ kind: "file", path: ramFile("ram1", { 3: 0x33, 4: 0x44 }), overParent: false }, base, { size: SIZE, parentLayers: [] });
    const top = join(dir, "top2.layer");
    const r = await writeMemoryLayer({ kind: "file", path: ramFile("ram2", { 3: 0x33, 5: 0x55 }), overParent: true }, top, { size: SIZE, parentLayers: [base] });
    expect(r.changedBytes).toBe(2 * P); // page 4 zeroed over the parent, page 5 new; page 3 equal
    const img = await readImage([base, top]);
    expect([3, 4, 5].map((pg) => pageOf(img, pg))).toEqual([0x33, 0, 0x55]);
  });

  test("importChangedRanges refuses bad ranges and leaves no file behind", async () => {
    const out = join(dir, "bad.layer");
    const read = () => {};
    for (const ranges of [[[P, 0]], [[0, 2 * P], [P, 3 * P]], [[100, P]], [[0, SIZE + P]]] as [number, number][][]) {
      await expect(importChangedRanges(read, ranges, out, { virtualSize: SIZE })).rejects.toMatchObject({ code: "overlaybd.bad_option" });
    }
    await expect(importChangedRanges(() => { throw new Error("reader died"); }, [[0, P]], out, { virtualSize: SIZE })).rejects.toThrow("reader died");
    expect(await Bun.file(out).exists()).toBe(false);
  });
});

describe("shared images", () => {
  function fakeExporter() {
    const log: string[] = [];
    let fail = false;
    return {
      log,
      failNext: () => (fail = true),
      exporter: {
        async open(key: string, layers: string[]): Promise<ServedImage> {
          await Bun.sleep(5);
          if (fail) {
            fail = false;
            throw new Error("export failed");
          }
          log.push(`open ${key} ${layers.join(",")}`);
          let done!: () => void;
          const exited = new Promise<void>((r) => (done = r));
          return { path: `/served/${key}`, exited, close: async () => { log.push(`close ${key}`); done(); } };
        },
      },
    };
  }

  test("one open per key for concurrent and later users; closed when the last lease goes", async () => {
    const f = fakeExporter();
    const t = new SharedImages(f.exporter);
    const [a, b] = await Promise.all([t.acquire("k1", ["l0", "l1"]), t.acquire("k1", ["l0", "l1"])]);
    const c = await t.acquire("k1", ["l0", "l1"]);
    expect([a.path, b.path, c.path]).toEqual(["/served/k1", "/served/k1", "/served/k1"]);
    expect(t.stats("k1")).toEqual({ opens: 1, refs: 3 });
    await a.release();
    await a.release(); // idempotent
    await b.release();
    expect(f.log).toEqual(["open k1 l0,l1"]);
    await c.release();
    expect(f.log).toEqual(["open k1 l0,l1", "close k1"]);
    expect(t.stats("k1")).toEqual({ opens: 1, refs: 0 });
    // a new user opens it again
    const d = await t.acquire("k1", ["l0", "l1"]);
    expect(t.stats("k1")).toEqual({ opens: 2, refs: 1 });
    await d.release();
    expect(t.keys()).toEqual([]);
  });

  test("warm images: the table's own lease keeps up to warmMax images open after their last user, least recently kept released first", async () => {
    const f = fakeExporter();
    const t = new SharedImages(f.exporter, { warmMax: 2 });
    const a = await t.acquire("a", ["la"]);
    expect(await t.keepWarm("a", ["la"])).toBe(true);
    expect(t.stats("a")).toEqual({ opens: 1, refs: 2 });
    await a.release();
    // the last VM is gone: still open, and the next user finds it open
    expect(f.log).toEqual(["open a la"]);
    const a2 = await t.acquire("a", ["la"]);
    expect(t.stats("a")).toEqual({ opens: 1, refs: 2 });
    await a2.release();
    // keeping one nobody holds opens it; keeping one twice takes one lease
    expect(await t.keepWarm("b", ["lb"])).toBe(true);
    expect(await t.keepWarm("b", ["lb"])).toBe(true);
    expect(t.stats("b")).toEqual({ opens: 1, refs: 1 });
    expect(t.warmKeys()).toEqual(["a", "b"]);
    // "a" kept again: most recent; a third image releases the least recent ("b")
    await t.keepWarm("a", ["la"]);
    await t.keepWarm("c", ["lc"]);
    expect(t.warmKeys()).toEqual(["a", "c"]);
    await t.settled(); // the release runs in the background
    expect(f.log).toEqual(["open a la", "open b lb", "open c lc", "close b"]);
    expect(t.keys().sort()).toEqual(["a", "c"]);
    // cooled while a VM maps it: closed only when that VM goes
    const c = await t.acquire("c", ["lc"]);
    t.cool("c");
    t.cool("c"); // nothing more to release
    await t.settled();
    expect(t.stats("c")).toEqual({ opens: 1, refs: 1 });
    expect(f.log.filter((l) => l === "close c")).toEqual([]);
    await c.release();
    expect(f.log.at(-1)).toBe("close c");
    expect(t.warmKeys()).toEqual(["a"]);
    await t.closeAll();
    expect(f.log.at(-1)).toBe("close a");
    expect([t.keys(), t.warmKeys()]).toEqual([[], []]);
  });

  test("warmMax 0: nothing is kept; an image closes with its last user", async () => {
    const f = fakeExporter();
    const t = new SharedImages(f.exporter, { warmMax: 0 });
    const a = await t.acquire("a", ["la"]);
    expect(await t.keepWarm("a", ["la"])).toBe(false);
    await a.release();
    expect(f.log).toEqual(["open a la", "close a"]);
    expect(t.warmKeys()).toEqual([]);
  });

  test("a failed open is not cached: the next acquire tries again", async () => {
    const f = fakeExporter();
    const t = new SharedImages(f.exporter);
    f.failNext();
    await expect(t.acquire("k2", ["x"])).rejects.toThrow("export failed");
    expect(t.keys()).toEqual([]);
    const l = await t.acquire("k2", ["x"]);
    expect(l.path).toBe("/served/k2");
    await l.release();
  });
});
