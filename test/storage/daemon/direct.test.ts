// The FUSE export's direct reads of overlaybd stacks (reader threads pread local layer files,
// blocks written through the image go to the main thread): the plan built from a stack, and
// byte-exactness through the disk daemon while writes, pre-existing upper
// data and reads of every kind interleave.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, constants as fsc, mkdirSync, mkdtempSync, openSync, readSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import { compressLayer, createUpper, LocalFile, openStack } from "../../../src/storage/overlaybd/index.ts";
import { layeredDirectPlan } from "../../../src/storage/daemon/direct.ts";
import { upperPaths, type DiskService } from "../../../src/storage/daemon/index.ts";
import { startService, stopService } from "./fixtures/service.ts";
import { twoLayerTemplate } from "./fixtures/template.ts";

const MiB = 1 << 20;
const SIZE = 8 * MiB;
const O_DIRECT = 0o40000;
let root: string;
let svc: DiskService;
let lowers: string[];
let template: Uint8Array;

beforeAll(async () => {
  root = mkdtempSync("/tmp/aenv-direct-test-");
  ({ lowers, expected: template } = await twoLayerTemplate(root, "t", SIZE, 7));
  svc = await startService(root);
}, 60_000);

afterAll(async () => {
  await stopService(svc, root);
  rmSync(root, { recursive: true, force: true });
});

describe("direct reads of overlaybd stacks", () => {
  test("plan: lower extents are the layer files' bytes, upper segments are diverted, sorted and disjoint", async () => {
    const up = { data: join(root, "p.data"), index: join(root, "p.index") };
    await createUpper(up, SIZE);
    const img = await openStack({ lowers, upper: up });
    try {
      await img.pwrite(new Uint8Array(1000).fill(9), MiB + 100);
      const plan = layeredDirectPlan(img)!;
      expect(plan.zeroFill).toBe(true);
      expect(plan.writeFd).toBeUndefined();
      const fds = img.lowers.map((l) => (l.lsmt as LocalFile).fd);
      let prevEnd = 0;
      let covered = 0;
      for (const e of plan.extents) {
        expect(e.offset).toBeGreaterThanOrEqual(prevEnd);
        expect(fds).toContain(e.fd);
        prevEnd = e.offset + e.length;
        covered += e.length;
        const got = new Uint8Array(e.length);
        expect(readSync(e.fd, got, 0, e.length, e.fileOffset)).toBe(e.length);
        expect(Buffer.compare(got, template.subarray(e.offset, e.offset + e.length))).toBe(0);
      }
      // everything but the 1 MiB hole is in some extent
      expect(covered).toBe(SIZE - MiB);
      // the write covered sectors [MiB, MiB + 1536): read-modify-written whole sectors
      expect(plan.diverted).toEqual([[MiB, MiB + 1536]]);
    } finally {
      await img.close();
    }
  });

  test("plan: nothing to read directly from a ZFile-compressed stack", async () => {
    const z = join(root, "layer0.zfile");
    await compressLayer(lowers[0]!, z);
    const img = await openStack({ lowers: [z] });
    try {
      expect(layeredDirectPlan(img)).toBeNull();
    } finally {
      await img.close();
    }
  });

  test("served stack: pre-existing upper data, then interleaved writes and O_DIRECT reads stay byte-exact", async () => {
    const sandboxDir = join(root, "sb1");
    const up = upperPaths(sandboxDir);
    mkdirSync(join(sandboxDir, "upper"), { recursive: true });
    await createUpper(up, SIZE);
    const ref = template.slice();
    {
      // a restarted sandbox: its upper already holds writes when the export starts
      const img = await openStack({ lowers, upper: up });
      const w = new Uint8Array(3 * 4096 + 123).fill(0xc3);
      await img.pwrite(w, 3 * MiB - 4096 - 50);
      ref.set(w, 3 * MiB - 4096 - 50);
      await img.close();
    }
    const d = await svc.rootDisk({ id: "direct1", lowers, sandboxDir });
    const rd = openSync(d.path, fsc.O_RDONLY | O_DIRECT);
    const wd = openSync(d.path, fsc.O_RDWR);
    const buf = Buffer.alloc(2 * MiB); // page-aligned (large allocation) for O_DIRECT
    const readBack = (off: number, len: number) => {
      expect(readSync(rd, buf, 0, len, off)).toBe(len);
      if (Buffer.compare(buf.subarray(0, len), ref.subarray(off, off + len)) !== 0) {
        let i = 0;
        while (buf[i] === ref[off + i]) i++;
        throw new Error(`mismatch at ${off + i}: got ${buf[i]}, want ${ref[off + i]}`);
      }
    };
    try {
      // whole disk in 1 MiB reads, and reads straddling the hole, the layer-1 range and the upper data
      for (let off = 0; off < SIZE; off += MiB) readBack(off, MiB);
      for (const off of [5 * MiB - 4096, 6 * MiB - 8192, 3 * MiB - 8192, 4 * MiB - 4096, 3 * MiB - 4096 - 4096]) readBack(off, 3 * 4096);
      // seeded random writes (unaligned through a buffered fd, whole blocks through O_DIRECT),
      // each followed by reads across and around it
      let seed = 20261129;
      const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) >>> 0) % n);
      const wbuf = Buffer.alloc(MiB);
      const dd = openSync(d.path, fsc.O_RDWR | O_DIRECT);
      try {
        for (let k = 0; k < 60; k++) {
          const aligned = k % 2 === 0;
          const off = aligned ? rnd(SIZE / 4096 - 64) * 4096 : rnd(SIZE - 70_000);
          const len = aligned ? (1 + rnd(32)) * 4096 : 1 + rnd(69_000);
          wbuf.fill((k * 37 + 11) & 255, 0, len);
          expect(writeSync(aligned ? dd : wd, wbuf, 0, len, off)).toBe(len);
          ref.fill((k * 37 + 11) & 255, off, off + len);
          const a = Math.max(0, Math.floor(off / 4096) * 4096 - 8192);
          const b = Math.min(SIZE, Math.ceil((off + len) / 4096) * 4096 + 8192);
          readBack(a, b - a);
          const r = rnd(SIZE / 4096 - 1) * 4096;
          readBack(r, 4096);
        }
      } finally {
        closeSync(dd);
      }
      for (let off = 0; off < SIZE; off += MiB) readBack(off, MiB);
    } finally {
      closeSync(rd);
      closeSync(wd);
      await d.close();
    }
    // and the upper holds what was read: reopen the stack without FUSE
    const img = await openStack({ lowers, upper: up });
    try {
      const all = new Uint8Array(SIZE);
      expect(await img.pread(all, 0)).toBe(SIZE);
      expect(Buffer.compare(all, ref)).toBe(0);
    } finally {
      await img.close();
    }
  }, 120_000);
});
