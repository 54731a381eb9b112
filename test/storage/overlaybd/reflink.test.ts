/**
 * Snapshot copy by reflink on a real XFS (reflink=1) filesystem: a loop-mounted image made and
 * removed by this test (needs root, mkfs.xfs from xfsprogs and loop devices).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, statSync } from "node:fs";
import { createUpper, openStack } from "../../../src/storage/overlaybd/index.ts";
import { scratch } from "./helpers.ts";

const tmp = scratch();
const mnt = tmp.path("mnt");
let mounted = false;

beforeAll(() => {
  const img = tmp.path("xfs.img");
  const sh = (cmd: string[]) => {
    const p = Bun.spawnSync(cmd);
    if (p.exitCode !== 0) throw new Error(`${cmd.join(" ")}: ${p.stderr.toString()}`);
  };
  sh(["truncate", "-s", "320M", img]);
  sh(["mkfs.xfs", "-q", "-m", "reflink=1", img]);
  mkdirSync(mnt);
  sh(["mount", "-o", "loop", img, mnt]);
  mounted = true;
}, 60_000);

afterAll(() => {
  if (mounted) Bun.spawnSync(["umount", mnt]);
  tmp.cleanup();
}, 60_000);

test("snapshotUpper reflinks on XFS; the copy is independent of later writes", async () => {
  const up = { data: `${mnt}/w.data`, index: `${mnt}/w.index` };
  await createUpper(up, 64 << 20);
  const img = await openStack({ lowers: [], upper: up });
  await img.pwrite(new Uint8Array(8 << 20).fill(0x5a), 0);
  const before = Bun.spawnSync(["df", "--output=used", "-B1", mnt]).stdout.toString().trim().split("\n")[1];
  const how = await img.snapshotUpper({ data: `${mnt}/s.data`, index: `${mnt}/s.index` });
  expect(how).toBe("reflink");
  const after = Bun.spawnSync(["df", "--output=used", "-B1", mnt]).stdout.toString().trim().split("\n")[1];
  // sharing extents: the 8 MiB of data did not get copied
  expect(Number(after) - Number(before)).toBeLessThan(1 << 20);
  expect(statSync(`${mnt}/s.data`).size).toBe(statSync(up.data).size);
  await img.pwrite(new Uint8Array(4096).fill(0x11), 0);
  await img.sync();
  await img.close();
  const snap = await openStack({ lowers: [], upper: { data: `${mnt}/s.data`, index: `${mnt}/s.index` } });
  const r = new Uint8Array(8192);
  await snap.pread(r, 0);
  expect(r.every((x) => x === 0x5a)).toBe(true);
  await snap.close();
}, 60_000);
