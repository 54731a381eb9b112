/**
 * src/vmm/ksm.ts: `[vm] ksm` at node start, on a directory laid out like /sys/kernel/mm/ksm: what
 * each mode writes, the refusal without KSM, the warning for "guest" under Firecracker, "all" in a
 * child process (it marks the calling process), and the /metrics gauges.
 */
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { applyKsm, ksmGauges, VmmError } from "../../src/vmm/index.ts";
import { kernelVersion } from "../../src/vmm/ksm.ts";
import { thrown } from "../helpers/thrown.ts";

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A directory laid out like /sys/kernel/mm/ksm; `advisor`: with the scan advisor (Linux >= 6.9). */
function fakeSysfs(advisor = true): string {
  const d = mkdtempSync("/tmp/aenv-ksm-");
  dirs.push(d);
  const all = { run: 0, pages_to_scan: 100, sleep_millisecs: 20, use_zero_pages: 0, pages_shared: 10, pages_sharing: 250, ksm_zero_pages: 4, full_scans: 3, general_profit: 983040, advisor_max_cpu: 70, advisor_target_scan_time: 200 };
  for (const [k, v] of Object.entries(all)) writeFileSync(join(d, k), `${v}\n`);
  if (advisor) writeFileSync(join(d, "advisor_mode"), "[none] scan-time\n");
  return d;
}
const read = (d: string, f: string) => readFileSync(join(d, f), "utf8").trim();

test('"off" changes nothing on the host, even where it has no KSM, and warns when ksmd still runs', () => {
  const d = fakeSysfs();
  expect(applyKsm({ mode: "off", scanSecs: 0, maxCpuPercent: 25, pagesToScan: 1000, driver: "qemu" }, d)).toEqual({ mode: "off", before: null, after: null, processMerge: false });
  expect([read(d, "run"), read(d, "pages_to_scan"), read(d, "use_zero_pages")]).toEqual(["0", "100", "0"]);
  expect(applyKsm({ mode: "off", scanSecs: 0, maxCpuPercent: 25, pagesToScan: 0, driver: "qemu" }, "/nonexistent/ksm")).toEqual({ mode: "off", before: null, after: null, processMerge: false });
  // an earlier node (or the operator) left ksmd running: the VMMs it marked stay merged
  writeFileSync(join(d, "run"), "1\n");
  const r = applyKsm({ mode: "off", scanSecs: 0, maxCpuPercent: 25, pagesToScan: 0, driver: "qemu" }, d);
  expect(r.warning).toContain("echo 2 > /sys/kernel/mm/ksm/run");
  expect(read(d, "run")).toBe("1");
});

test('"guest" starts ksmd with zero pages and the configured rate, and reports before and after', () => {
  const d = fakeSysfs();
  const r = applyKsm({ mode: "guest", scanSecs: 0, maxCpuPercent: 25, pagesToScan: 1000, driver: "qemu" }, d);
  expect([read(d, "run"), read(d, "pages_to_scan"), read(d, "use_zero_pages"), read(d, "sleep_millisecs")]).toEqual(["1", "1000", "1", "20"]);
  expect([r.before!.run, r.after!.run, r.after!.pagesToScan, r.processMerge, r.warning]).toEqual([0, 1, 1000, false, undefined]);
  // 0 leaves the host's rate
  const d2 = fakeSysfs();
  applyKsm({ mode: "guest", scanSecs: 0, maxCpuPercent: 25, pagesToScan: 0, driver: "qemu" }, d2);
  expect([read(d2, "run"), read(d2, "pages_to_scan")]).toEqual(["1", "100"]);
});

test("with the advisor, ksmd keeps a full pass to scan_secs under max_cpu_percent; without one, the fixed rate applies", () => {
  const d = fakeSysfs();
  const r = applyKsm({ mode: "guest", scanSecs: 60, maxCpuPercent: 25, pagesToScan: 1000, driver: "qemu" }, d);
  expect([read(d, "advisor_mode"), read(d, "advisor_target_scan_time"), read(d, "advisor_max_cpu"), read(d, "pages_to_scan"), read(d, "run")]).toEqual(["scan-time", "60", "25", "100", "1"]);
  expect(r.after!.advisorMode).toBe("scan-time");
  const old = fakeSysfs(false);
  const r2 = applyKsm({ mode: "guest", scanSecs: 60, maxCpuPercent: 25, pagesToScan: 1000, driver: "qemu" }, old);
  expect([r2.after!.advisorMode, read(old, "pages_to_scan"), read(old, "run")]).toEqual([null, "1000", "1"]);
});

test('"guest" under Firecracker warns that nothing is marked', () => {
  const r = applyKsm({ mode: "guest", scanSecs: 0, maxCpuPercent: 25, pagesToScan: 0, driver: "firecracker" }, fakeSysfs());
  expect(r.warning).toContain('use "all"');
});

test('merging asked for on a kernel without KSM, or "all" before Linux 6.7, is vmm.ksm_unavailable and changes nothing', () => {
  const err = thrown(() => applyKsm({ mode: "all", scanSecs: 0, maxCpuPercent: 25, pagesToScan: 1000, driver: "qemu" }, "/nonexistent/ksm"));
  expect(err).toBeInstanceOf(VmmError);
  expect((err as VmmError).code).toBe("vmm.ksm_unavailable");
  const d = fakeSysfs();
  const old = thrown(() => applyKsm({ mode: "all", scanSecs: 60, maxCpuPercent: 25, pagesToScan: 1000, driver: "qemu" }, d, "6.6.30-amd64"));
  expect((old as VmmError).code).toBe("vmm.ksm_unavailable");
  expect((old as VmmError).message).toContain("6.6.30-amd64");
  expect([read(d, "run"), read(d, "advisor_mode"), read(d, "use_zero_pages")]).toEqual(["0", "[none] scan-time", "0"]);
  // "guest" needs no prctl: fine on that kernel
  expect(applyKsm({ mode: "guest", scanSecs: 60, maxCpuPercent: 25, pagesToScan: 1000, driver: "qemu" }, d, "6.6.30-amd64").processMerge).toBe(false);
});

test("kernel versions are read from the release string", () => {
  expect(kernelVersion("6.18.44-fc-v1272")).toEqual([6, 18]);
  expect(kernelVersion("5.10.0-28-amd64")).toEqual([5, 10]);
  expect(kernelVersion("garbage")).toEqual([0, 0]);
});

test('"all" also marks the node process, and what it starts afterwards, mergeable', () => {
  const d = fakeSysfs();
  const script = `
    import { applyKsm } from ${JSON.stringify(join(import.meta.dir, "../../src/vmm/index.ts"))};
    import { processMemoryMerge } from ${JSON.stringify(join(import.meta.dir, "../../src/ffi/ksm.ts"))};
    const r = applyKsm({ mode: "all", scanSecs: 0, maxCpuPercent: 25, pagesToScan: 500, driver: "qemu" }, ${JSON.stringify(d)});
    const child = Bun.spawnSync([process.execPath, "-e", "import { processMemoryMerge } from " + JSON.stringify(${JSON.stringify(join(import.meta.dir, "../../src/ffi/ksm.ts"))}) + "; console.log(processMemoryMerge())"]).stdout.toString().trim();
    console.log(JSON.stringify({ processMerge: r.processMerge, self: processMemoryMerge(), child: child === "true" }));
  `;
  const p = Bun.spawnSync([process.execPath, "-e", script], { stderr: "pipe" });
  expect(p.stderr.toString()).toBe("");
  expect(JSON.parse(p.stdout.toString())).toEqual({ processMerge: true, self: true, child: true });
  expect([read(d, "run"), read(d, "pages_to_scan")]).toEqual(["1", "500"]);
});

test("the /metrics gauges carry the host's counters; none without KSM", () => {
  const g = ksmGauges(fakeSysfs());
  expect(Object.fromEntries(Object.entries(g).map(([k, v]) => [k, v.value]))).toEqual({
    agentenv_host_ksm_running: 0,
    agentenv_host_ksm_pages_sharing: 250,
    agentenv_host_ksm_zero_pages: 4,
    agentenv_host_ksm_profit_bytes: 983040,
  });
  expect(ksmGauges("/nonexistent/ksm")).toEqual({});
});
