/**
 * Kernel samepage merging through a real node (issue 32, `[vm] ksm = "all"`): the node starts the
 * host's ksmd and its own memory, the disk daemon's and every QEMU's become mergeable; equal pages
 * two sandboxes' guests wrote are merged, which the writer's overwrite in place shows by taking
 * them private again (fixtures/ksm.ts), the write reaches only its writer, and /metrics shows
 * the host's counters. The host's KSM knobs are put back afterwards.
 */
import { afterAll, expect, test } from "bun:test";
import { ksmSettingsOf, readKsmHost, readKsmStat, writeKsmHost } from "../../src/ffi/ksm.ts";
import { diskDaemonsUnder, nodeForFile } from "./world.ts";

// read before the node starts (nodeForFile's beforeAll), put back after every test of the file
const hostBefore = readKsmHost();
afterAll(() => {
  if (hostBefore) writeKsmHost(ksmSettingsOf(hostBefore));
});
// a short pass for two sandboxes: the advisor sets ksmd's rate to fit it
const node = nodeForFile({ AENV__vm__ksm: "all", AENV__vm__ksm_scan_secs: "5", AENV__vm__ksm_max_cpu_percent: "50" });

test('with [vm] ksm = "all", equal pages of two sandboxes are merged, and a write to them reaches only its writer', async () => {
  const w = node();
  // the node started ksmd under the scan advisor and marked itself and the disk daemon it started
  const host = readKsmHost()!;
  expect([host.run, host.useZeroPages, host.advisorMode, host.advisorTargetScanSecs, host.advisorMaxCpu]).toEqual([1, true, "scan-time", 5, 50]);
  expect(readKsmStat(w.node!.pid)!.mergeAny).toBe(true);
  const daemons = diskDaemonsUnder(w.home);
  expect(daemons.length).toBe(1);
  expect(readKsmStat(daemons[0]!)!.mergeAny).toBe(true);

  const o = await w.client("ksm.ts", ["150"], 420_000);
  expect(o.memMerge).toEqual(["microvm,memory-backend=mem,pit=off,mem-merge=on", "microvm,memory-backend=mem,pit=off,mem-merge=on"]);
  for (const q of o.qemu) expect([q.mergeAny, q.mergeable]).toEqual([true, true]);
  expect(o.shaA).toBe(o.expected);
  expect(o.shaB).toBe(o.expected);
  expect(o.passesBefore).toBeGreaterThanOrEqual(3);
  // A overwrote its 4096 data pages in place: at least 3072 of them had been merged (its merged
  // pages fell by that much once ksmd passed again)
  if (o.drop < 3072) console.log(`ksm: drop too small: ${JSON.stringify({ mergedBefore: o.mergedBefore, drop: o.drop, host: o.host, qemu: o.qemu })}`);
  expect(o.dropWanted).toBe(3072);
  expect(o.drop).toBeGreaterThanOrEqual(3072);
  expect(o.mergedBefore).toBeGreaterThanOrEqual(3072);
  expect(o.sharingBefore).toBeGreaterThanOrEqual(3072);
  // copy-on-write of a merged page: the writer sees its new bytes, its neighbour the old ones
  expect(o.newA).toMatch(/^[0-9a-f]{64}$/);
  expect(o.newA).not.toBe(o.expected);
  expect(o.afterA).toBe(o.newA);
  expect(o.afterB).toBe(o.expected);
  expect(o.ksmRunning).toBe(1);
  expect(o.ksmPagesSharing).toBeGreaterThan(0);
  console.log(`ksm: ${o.drop} of A's merged pages went private when it overwrote its 4096 (${(o.dropAfterMs / 1000).toFixed(1)} s); host pages_sharing ${o.sharingBefore} before`);
}, 600_000);
