/**
 * importExtents: a layer made from chosen byte ranges of a file over a parent image stores only
 * the blocks inside the ranges that differ from the parent (zeroed entries where the file is zero
 * and the parent is not); everything outside the ranges stays the parent's. Stacked on the
 * parent it reads back byte-identical to the file.
 */
import { expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { importExtents, importRaw, openStack } from "../../../src/storage/overlaybd/index.ts";
import { scratch, sha256 } from "./helpers.ts";

test("layer of changed ranges over a parent: outside the ranges is the parent's, inside equals the file", async () => {
  const tmp = scratch();
  try {
    const size = 4 << 20;
    const parentBytes = new Uint8Array(size);
    for (let i = 0; i < size; i++) parentBytes[i] = (i * 31 + 7) & 0xff; // data everywhere
    writeFileSync(tmp.path("parent.raw"), parentBytes);
    await importRaw(tmp.path("parent.raw"), tmp.path("parent.layer"));
    const next = parentBytes.slice();
    next.fill(0xab, 1 << 20, (1 << 20) + 8192); // two changed blocks
    next.fill(0, 2 << 20, (2 << 20) + 4096); // a block zeroed (a freed block overwritten)
    // a changed block OUTSIDE the ranges given: must not appear (the caller says nothing changed there)
    next.fill(0xcd, 3 << 20, (3 << 20) + 4096);
    writeFileSync(tmp.path("next.raw"), next);
    const parent = await openStack({ lowers: [tmp.path("parent.layer")] });
    const r = await importExtents(tmp.path("next.raw"), [[1 << 20, (1 << 20) + 65536], [2 << 20, (2 << 20) + 4096]], tmp.path("step.layer"), { parent, meta: { virtualSize: size } });
    await parent.close();
    const data = r.segments.filter((s) => !s.zeroed).reduce((a, s) => a + s.length * 512, 0);
    const zeroed = r.segments.filter((s) => s.zeroed).reduce((a, s) => a + s.length * 512, 0);
    expect(data).toBe(8192);
    expect(zeroed).toBe(4096);
    const img = await openStack({ lowers: [tmp.path("parent.layer"), tmp.path("step.layer")] });
    const back = new Uint8Array(size);
    await img.pread(back, 0);
    await img.close();
    const want = next.slice();
    want.set(parentBytes.subarray(3 << 20, (3 << 20) + 4096), 3 << 20);
    expect(sha256(back)).toBe(sha256(want));
  } finally {
    tmp.cleanup();
  }
});
