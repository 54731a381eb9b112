/**
 * src/ffi/ksm.ts: the ksm_stat parser on the kernel's text, the host knobs read and written on a
 * directory laid out like /sys/kernel/mm/ksm, the real host's KSM directory read, and
 * PR_SET_MEMORY_MERGE in a child process (so this test process stays as it was), including that
 * the flag reaches a program that child starts (fork + execve).
 */
import { afterAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { KsmError, ksmSettingsOf, parseKsmStat, readKsmHost, readKsmStat, writeKsmHost } from "../../src/ffi/ksm.ts";

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A directory with the files of /sys/kernel/mm/ksm that ffi/ksm.ts reads and writes. */
function fakeSysfs(values: Record<string, number> = {}): string {
  const d = mkdtempSync("/tmp/aenv-ksm-");
  dirs.push(d);
  const all = { run: 0, pages_to_scan: 100, sleep_millisecs: 20, use_zero_pages: 0, pages_shared: 7, pages_sharing: 40, ksm_zero_pages: 3, full_scans: 12, general_profit: 151552, advisor_max_cpu: 70, advisor_target_scan_time: 200, ...values };
  for (const [k, v] of Object.entries(all)) writeFileSync(join(d, k), `${v}\n`);
  writeFileSync(join(d, "advisor_mode"), "[none] scan-time\n");
  return d;
}

test("ksm_stat: the kernel's lines (name value, and name: yes/no) become numbers and flags", () => {
  const text = "ksm_rmap_items 812\nksm_zero_pages 5\nksm_merging_pages 300\nksm_process_profit 1163264\nksm_merge_any: yes\nksm_mergeable: yes\n";
  expect(parseKsmStat(text)).toEqual({ mergingPages: 300, zeroPages: 5, profitBytes: 1163264, mergeAny: true, mergeable: true });
  // an older kernel's shorter file, garbage and a negative profit
  expect(parseKsmStat("ksm_rmap_items 0\nksm_process_profit -4096\nnonsense\n")).toEqual({ mergingPages: 0, zeroPages: 0, profitBytes: -4096, mergeAny: false, mergeable: false });
  expect(parseKsmStat("")).toEqual({ mergingPages: 0, zeroPages: 0, profitBytes: 0, mergeAny: false, mergeable: false });
});

test("this process's ksm_stat is read; a process that does not exist reads null", () => {
  const own = readKsmStat(process.pid);
  expect(own).not.toBeNull();
  expect(own!.mergeAny).toBe(false);
  expect(readKsmStat(2 ** 22 + 1)).toBeNull();
});

test("the host's knobs and counters are read; a directory without them reads null", () => {
  const d = fakeSysfs();
  expect(readKsmHost(d)).toEqual({
    run: 0,
    pagesToScan: 100,
    sleepMs: 20,
    useZeroPages: false,
    advisorMode: "none",
    advisorMaxCpu: 70,
    advisorTargetScanSecs: 200,
    pagesShared: 7,
    pagesSharing: 40,
    zeroPages: 3,
    fullScans: 12,
    generalProfitBytes: 151552,
  });
  writeFileSync(join(d, "advisor_mode"), "none [scan-time]\n");
  expect(readKsmHost(d)!.advisorMode).toBe("scan-time");
  rmSync(join(d, "advisor_mode"));
  expect(readKsmHost(d)!.advisorMode).toBeNull(); // a kernel without the advisor
  expect(readKsmHost("/nonexistent/ksm")).toBeNull();
  // this host's kernel (6.18) has KSM and its scan advisor
  const real = readKsmHost();
  expect(real).not.toBeNull();
  expect([0, 1, 2]).toContain(real!.run);
  expect(real!.pagesToScan).toBeGreaterThan(0);
  expect(real!.advisorMode === "none" || real!.advisorMode === "scan-time").toBe(true);
});

test("writing knobs changes exactly the ones given; a missing file is ksm.failed naming it", () => {
  const d = fakeSysfs();
  writeKsmHost({ useZeroPages: true, pagesToScan: 1000, run: 1 }, d);
  const after = readKsmHost(d)!;
  expect([after.run, after.pagesToScan, after.useZeroPages, after.sleepMs]).toEqual([1, 1000, true, 20]);
  writeKsmHost({}, d);
  expect(readFileSync(join(d, "run"), "utf8")).toBe("1\n");
  const empty = mkdtempSync("/tmp/aenv-ksm-");
  dirs.push(empty);
  mkdirSync(join(empty, "run")); // a directory where the file should be: the write fails
  let err: unknown;
  try {
    writeKsmHost({ run: 1 }, empty);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(KsmError);
  expect((err as KsmError).code).toBe("ksm.failed");
  expect((err as KsmError).details).toMatchObject({ call: "write run", path: join(empty, "run") });
});

test("the advisor: scan-time writes its bounds before the mode and never pages_to_scan; none comes first when a fixed rate is asked", () => {
  const d = fakeSysfs();
  writeKsmHost({ advisor: { mode: "scan-time", maxCpuPercent: 25, targetScanSecs: 60 }, pagesToScan: 999, run: 1 }, d);
  const a = readKsmHost(d)!;
  expect([a.advisorMode, a.advisorMaxCpu, a.advisorTargetScanSecs, a.pagesToScan, a.run]).toEqual(["scan-time", 25, 60, 100, 1]);
  writeKsmHost({ pagesToScan: 1000 }, d); // a fixed rate while the advisor runs: the advisor goes first
  const b = readKsmHost(d)!;
  expect([b.advisorMode, b.pagesToScan]).toEqual(["none", 1000]);
});

test("ksmSettingsOf gives back what was read: knobs, rate and advisor", () => {
  const d = fakeSysfs({ run: 1, pages_to_scan: 300, use_zero_pages: 1 });
  const before = readKsmHost(d)!;
  writeKsmHost({ advisor: { mode: "scan-time", maxCpuPercent: 40, targetScanSecs: 10 }, useZeroPages: false, run: 0 }, d);
  writeKsmHost(ksmSettingsOf(before), d);
  expect(readKsmHost(d)).toEqual(before);
  const d2 = fakeSysfs();
  writeFileSync(join(d2, "advisor_mode"), "none [scan-time]\n");
  const before2 = readKsmHost(d2)!;
  writeKsmHost({ advisor: { mode: "none" }, pagesToScan: 5 }, d2);
  writeKsmHost(ksmSettingsOf(before2), d2);
  expect(readKsmHost(d2)!.advisorMode).toBe("scan-time");
  expect(readKsmHost(d2)!.advisorMaxCpu).toBe(70);
});

test("PR_SET_MEMORY_MERGE marks a process mergeable, reaches the program it then starts, and can be undone", async () => {
  const script = `
    import { processMemoryMerge, setProcessMemoryMerge, readKsmStat } from ${JSON.stringify(join(import.meta.dir, "../../src/ffi/ksm.ts"))};
    const before = processMemoryMerge();
    setProcessMemoryMerge(true);
    const on = processMemoryMerge();
    const child = Bun.spawnSync(["cat", "/proc/self/ksm_stat"]).stdout.toString();
    const self = readKsmStat(process.pid);
    setProcessMemoryMerge(false);
    console.log(JSON.stringify({ before, on, child, self, off: processMemoryMerge() }));
  `;
  const p = Bun.spawnSync([process.execPath, "-e", script], { stderr: "pipe" });
  expect(p.stderr.toString()).toBe("");
  const o = JSON.parse(p.stdout.toString());
  expect([o.before, o.on, o.off]).toEqual([false, true, false]);
  expect(o.self.mergeAny).toBe(true);
  expect(parseKsmStat(o.child).mergeAny).toBe(true); // cat, started after the prctl (fork + execve)
  expect(readKsmStat(process.pid)!.mergeAny).toBe(false); // this process was not touched
});
