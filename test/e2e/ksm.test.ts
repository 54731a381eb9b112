/**
 * Kernel samepage merging through a real node (issue 32, `[vm] ksm = "all"`): the node starts the
 * host's ksmd and its own memory, the disk daemon's and every QEMU's become mergeable; equal pages
 * two sandboxes' guests wrote are merged (fixtures/ksm.ts), a write to them reaches only its
 * writer, and /metrics shows the host's counters. The host's KSM knobs are put back afterwards.
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

  const o = await w.client("ksm.ts", ["300"]);
  expect(o.memMerge).toEqual(["microvm,memory-backend=mem,pit=off,mem-merge=on", "microvm,memory-backend=mem,pit=off,mem-merge=on"]);
  for (const q of o.qemu) expect([q.mergeAny, q.mergeable]).toEqual([true, true]);
  // both guests wrote the same 4096 distinct pages: each QEMU's merged (non-empty) pages rose by
  // at least that many
  expect(o.shaA).toBe(o.expected);
  expect(o.shaB).toBe(o.expected);
  for (const m of o.merging) expect(m).toBeGreaterThanOrEqual(4096);
  // copy-on-write of a merged page: the writer sees its new bytes, its neighbour the old ones
  expect(o.newA).toMatch(/^[0-9a-f]{64}$/);
  expect(o.newA).not.toBe(o.expected);
  expect(o.afterA).toBe(o.newA);
  expect(o.afterB).toBe(o.expected);
  expect(o.ksmRunning).toBe(1);
  expect(o.ksmPagesSharing).toBeGreaterThanOrEqual(4096);
  console.log(`ksm: ${o.merging.join(" / ")} pages merged per QEMU within ${(o.mergedAfterMs / 1000).toFixed(1)} s; host pages_sharing ${o.ksmPagesSharing}`);
}, 600_000);
