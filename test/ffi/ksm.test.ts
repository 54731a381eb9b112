/**
 * src/ffi/ksm.ts: the ksm_stat parser on the kernel's text, the host knobs read and written on a
 * directory laid out like /sys/kernel/mm/ksm, the real host's KSM directory read, and
 * PR_SET_MEMORY_MERGE in a child process (so this test process stays as it was), including that
 * the flag reaches a program that child starts (fork + execve).
 */
import { afterAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { KsmError, ksmSettingsOf, ksmWrites, parseKsmStat, readKsmHost, readKsmStat, writeKsmHost } from "../../src/ffi/ksm.ts";
import { thrown } from "../helpers/thrown.ts";

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
  expect(parseKsmStat("ksm_rmap_items 0\nksm_process_profit -4096\nnonsense\nksm_merge_any: no\n")).toEqual({ mergingPages: 0, zeroPages: 0, profitBytes: -4096, mergeAny: false, mergeable: null });
  expect(parseKsmStat("")).toEqual({ mergingPages: 0, zeroPages: 0, profitBytes: 0, mergeAny: null, mergeable: null });
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
  const err = thrown(() => writeKsmHost({ run: 1 }, empty));
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

test("the order of the writes follows the kernel's rules", () => {
  // the advisor chosen: its bounds, then the mode, never pages_to_scan; run last
  expect(ksmWrites({ useZeroPages: true, advisor: { mode: "scan-time", maxCpuPercent: 25, targetScanSecs: 60 }, pagesToScan: 999, run: 1 }, "none", false)).toEqual([
    ["use_zero_pages", "1"],
    ["advisor_max_cpu", "25"],
    ["advisor_target_scan_time", "60"],
    ["advisor_mode", "scan-time"],
    ["run", "1"],
  ]);
  // a fixed rate while the advisor runs: the advisor leaves before pages_to_scan is written
  expect(ksmWrites({ pagesToScan: 1000, run: 1 }, "scan-time", true)).toEqual([
    ["advisor_mode", "none"],
    ["pages_to_scan", "1000"],
    ["run", "1"],
  ]);
  // no advisor in the kernel, use_zero_pages already as asked: nothing but the rate and run
  expect(ksmWrites({ useZeroPages: true, pagesToScan: 1000, run: 1 }, null, true)).toEqual([
    ["pages_to_scan", "1000"],
    ["run", "1"],
  ]);
  // putting back a host whose advisor was off: mode none first, then its rate and bounds
  expect(ksmWrites({ advisor: { mode: "none", maxCpuPercent: 70, targetScanSecs: 200 }, pagesToScan: 100, run: 0 }, "scan-time", false)).toEqual([
    ["advisor_mode", "none"],
    ["pages_to_scan", "100"],
    ["advisor_max_cpu", "70"],
    ["advisor_target_scan_time", "200"],
    ["run", "0"],
  ]);
  expect(ksmWrites({}, "none", false)).toEqual([]);
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
    import { processMemoryMerge, setProcessMemoryMerge } from ${JSON.stringify(join(import.meta.dir, "../../src/ffi/ksm.ts"))};
    const before = processMemoryMerge();
    setProcessMemoryMerge(true);
    const on = processMemoryMerge();
    // a program started after the prctl (fork + execve) reads the flag of its own
    const child = Bun.spawnSync([process.execPath, "-e", "import { processMemoryMerge } from " + JSON.stringify(${JSON.stringify(join(import.meta.dir, "../../src/ffi/ksm.ts"))}) + "; console.log(processMemoryMerge())"]).stdout.toString().trim();
    setProcessMemoryMerge(false);
    console.log(JSON.stringify({ before, on, child, off: processMemoryMerge() }));
  `;
  const p = Bun.spawnSync([process.execPath, "-e", script], { stderr: "pipe" });
  expect(p.stderr.toString()).toBe("");
  const o = JSON.parse(p.stdout.toString());
  expect([o.before, o.on, o.off]).toEqual([false, true, false]);
  expect(o.child).toBe("true");
  expect(readKsmStat(process.pid)!.mergeAny).toBe(false); // this process was not touched
});
