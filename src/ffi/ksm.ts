/**
 * Kernel samepage merging (KSM): the kernel's ksmd thread scans anonymous pages that are marked
 * mergeable and maps pages of equal content, in any process, to one write-protected copy; a write
 * to such a page gets a private copy again (Documentation/admin-guide/mm/ksm.rst).
 * - A mapping becomes mergeable by madvise(MADV_MERGEABLE) (QEMU does it for guest RAM with
 *   `-machine mem-merge=on`) or, for every anonymous mapping of a process, by
 *   prctl(PR_SET_MEMORY_MERGE, 1) (Linux >= 6.4, include/uapi/linux/prctl.h: 67; 68 reads it).
 *   The process flag is inherited by children on fork and, since Linux 6.7 ("mm/ksm: support
 *   fork/exec for prctl"), kept across execve (test/ffi/ksm.test.ts checks it on this host).
 * - ksmd runs only while /sys/kernel/mm/ksm/run is 1; it scans `pages_to_scan` pages every
 *   `sleep_millisecs` ms. `use_zero_pages` 1 maps empty pages to the kernel's zero page.
 * - The scan advisor (kernels with /sys/kernel/mm/ksm/advisor_mode; this host's 6.18 has it): with
 *   "scan-time" the kernel sets pages_to_scan itself, between advisor_min_pages_to_scan (500) and
 *   advisor_max_pages_to_scan, so that a full pass takes `advisor_target_scan_time` seconds, with
 *   ksmd steered towards at most `advisor_max_cpu` percent of a core; pages_to_scan then refuses
 *   writes (EINVAL, seen here), and going back to "none" resets it to 100.
 * - Counters: /sys/kernel/mm/ksm/{pages_shared, pages_sharing, general_profit, full_scans, ...}
 *   (host; pages_sharing does not count ksm_zero_pages), /proc/<pid>/ksm_stat (per process:
 *   ksm_merging_pages, which does not count ksm_zero_pages either; ksm_merge_any and
 *   ksm_mergeable only on newer kernels).
 * All of it needs root to change; reading the host counters does not.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errno, libc } from "./libc.ts";

/** prctl(2) option that sets the process-wide merge flag (include/uapi/linux/prctl.h). */
export const PR_SET_MEMORY_MERGE = 67;
/** prctl(2) option that reads it (1 set, 0 not). */
export const PR_GET_MEMORY_MERGE = 68;
/** Where the host's KSM knobs and counters live. */
export const KSM_SYSFS = "/sys/kernel/mm/ksm";

/** A failed KSM call: `details.call` names it (prctl, or the sysfs file written), with errno or the cause. */
export class KsmError extends AgentEnvError<FfiCodes<"ksm">> {
  constructor(call: string, detail: { errno?: number; path?: string; cause?: string }) {
    super("ksm.failed", `${call} failed: ${detail.errno !== undefined ? `errno ${detail.errno}` : (detail.cause ?? "")}`, { call, ...detail });
  }
}

/**
 * Mark every anonymous mapping of this process, and of every process it starts from now on,
 * mergeable (`on`), or undo it (`false`: the kernel unmerges the process's merged pages first).
 * @throws KsmError `ksm.failed` (EINVAL on kernels without PR_SET_MEMORY_MERGE or without
 *   CONFIG_KSM, EINTR when interrupted; the kernel checks no capability).
 */
export function setProcessMemoryMerge(on: boolean): void {
  if (libc().prctl(PR_SET_MEMORY_MERGE, on ? 1 : 0, 0, 0, 0) !== 0) throw new KsmError("prctl(PR_SET_MEMORY_MERGE)", { errno: errno() });
}

/**
 * Whether this process's anonymous memory is mergeable as a whole (PR_GET_MEMORY_MERGE).
 * @throws KsmError `ksm.failed` (EINVAL on kernels without it).
 */
export function processMemoryMerge(): boolean {
  const r = libc().prctl(PR_GET_MEMORY_MERGE, 0, 0, 0, 0);
  if (r < 0) throw new KsmError("prctl(PR_GET_MEMORY_MERGE)", { errno: errno() });
  return r === 1;
}

/** The host's KSM knobs and counters (pages are 4 KiB; `generalProfitBytes` is the kernel's estimate of bytes saved, net of its own metadata). */
export interface KsmHostState {
  /** 0 stopped, 1 running, 2 stopped and every merged page unmerged. */
  run: number;
  pagesToScan: number;
  sleepMs: number;
  useZeroPages: boolean;
  /** The scan advisor: "none" or "scan-time"; null on kernels without one. */
  advisorMode: "none" | "scan-time" | null;
  /** Its bounds: ksmd's CPU, % of one core, and the time of a full pass, s (NaN without an advisor). */
  advisorMaxCpu: number;
  advisorTargetScanSecs: number;
  /** Pages in use as the one shared copy. */
  pagesShared: number;
  /** Page mappings that point at a shared copy instead of a page of their own (the saving, in pages). */
  pagesSharing: number;
  /** Empty pages mapped to the kernel's zero page (use_zero_pages). */
  zeroPages: number;
  fullScans: number;
  generalProfitBytes: number;
}

function readNumber(dir: string, name: string): number {
  try {
    return Number(readFileSync(`${dir}/${name}`, "utf8").trim());
  } catch {
    return NaN;
  }
}

/** The selected advisor mode of `advisor_mode` ("[none] scan-time": the bracketed one; a file holding one plain word: that word), null without the file. */
function readAdvisorMode(dir: string): KsmHostState["advisorMode"] {
  try {
    const text = readFileSync(`${dir}/advisor_mode`, "utf8");
    const chosen = /\[([a-z-]+)\]/.exec(text)?.[1] ?? text.trim();
    return chosen === "scan-time" ? "scan-time" : "none";
  } catch {
    return null;
  }
}

/** The host's KSM state, or null when this kernel has no KSM (no `dir`). Absent counters read NaN. `dir`: for tests. */
export function readKsmHost(dir = KSM_SYSFS): KsmHostState | null {
  const run = readNumber(dir, "run");
  if (Number.isNaN(run)) return null;
  return {
    run,
    pagesToScan: readNumber(dir, "pages_to_scan"),
    sleepMs: readNumber(dir, "sleep_millisecs"),
    useZeroPages: readNumber(dir, "use_zero_pages") === 1,
    advisorMode: readAdvisorMode(dir),
    advisorMaxCpu: readNumber(dir, "advisor_max_cpu"),
    advisorTargetScanSecs: readNumber(dir, "advisor_target_scan_time"),
    pagesShared: readNumber(dir, "pages_shared"),
    pagesSharing: readNumber(dir, "pages_sharing"),
    zeroPages: readNumber(dir, "ksm_zero_pages"),
    fullScans: readNumber(dir, "full_scans"),
    generalProfitBytes: readNumber(dir, "general_profit"),
  };
}

/** The knobs `writeKsmHost` sets; an absent one is left as it is. */
export interface KsmHostSettings {
  run?: 0 | 1;
  /** The advisor: "scan-time", or "none" (then pagesToScan applies), and its two bounds (written whatever the mode). */
  advisor?: { mode: "none" | "scan-time"; maxCpuPercent?: number; targetScanSecs?: number };
  pagesToScan?: number;
  sleepMs?: number;
  useZeroPages?: boolean;
}

/**
 * The sysfs writes, in order, that apply `s` to a host whose advisor is in `currentMode` and
 * whose use_zero_pages is `currentZeroPages`: [file name, value]. The order follows the kernel's
 * rules: pages_to_scan refuses writes while the advisor is "scan-time", so the advisor leaves
 * first when a fixed rate is asked and is chosen last (after its bounds) when it is; `run` comes
 * last, so ksmd starts at the rate asked for. pages_to_scan is not written when the advisor is chosen.
 */
export function ksmWrites(s: KsmHostSettings, currentMode: KsmHostState["advisorMode"], currentZeroPages: boolean): [string, string][] {
  const w: [string, string][] = [];
  if (s.useZeroPages !== undefined && s.useZeroPages !== currentZeroPages) w.push(["use_zero_pages", s.useZeroPages ? "1" : "0"]);
  const leaveAdvisor = s.advisor?.mode === "none" || (s.pagesToScan !== undefined && s.advisor === undefined && currentMode === "scan-time");
  if (leaveAdvisor) w.push(["advisor_mode", "none"]);
  if (s.pagesToScan !== undefined && s.advisor?.mode !== "scan-time") w.push(["pages_to_scan", String(s.pagesToScan)]);
  if (s.advisor?.maxCpuPercent !== undefined) w.push(["advisor_max_cpu", String(s.advisor.maxCpuPercent)]);
  if (s.advisor?.targetScanSecs !== undefined) w.push(["advisor_target_scan_time", String(s.advisor.targetScanSecs)]);
  if (s.advisor?.mode === "scan-time") w.push(["advisor_mode", "scan-time"]);
  if (s.sleepMs !== undefined) w.push(["sleep_millisecs", String(s.sleepMs)]);
  if (s.run !== undefined) w.push(["run", String(s.run)]);
  return w;
}

/**
 * Write the given KSM knobs (`dir`: for tests), in `ksmWrites`' order.
 * @throws KsmError `ksm.failed` naming the file (no KSM in this kernel, not root, a value the kernel refuses).
 */
export function writeKsmHost(s: KsmHostSettings, dir = KSM_SYSFS): void {
  for (const [name, value] of ksmWrites(s, readAdvisorMode(dir), readNumber(dir, "use_zero_pages") === 1)) {
    const path = `${dir}/${name}`;
    try {
      writeFileSync(path, `${value}\n`);
    } catch (e) {
      throw new KsmError(`write ${name}`, { path, cause: e instanceof Error ? e.message : String(e) });
    }
  }
}

/** The settings that put the host's knobs back to `s` (what `readKsmHost` read before a change). */
export function ksmSettingsOf(s: KsmHostState): KsmHostSettings {
  return {
    run: s.run === 1 ? 1 : 0,
    useZeroPages: s.useZeroPages,
    pagesToScan: s.pagesToScan,
    ...(s.advisorMode === null ? {} : { advisor: { mode: s.advisorMode, maxCpuPercent: s.advisorMaxCpu, targetScanSecs: s.advisorTargetScanSecs } }),
  };
}

/** One process's /proc/<pid>/ksm_stat: pages it maps from merged copies, and whether all its memory is mergeable. */
export interface KsmProcessStat {
  /** Its pages that map a merged copy (not counting `zeroPages`). */
  mergingPages: number;
  /** Its empty pages mapped to the kernel's zero page. */
  zeroPages: number;
  /** The kernel's estimate of what merging saved for it, bytes (may be negative). */
  profitBytes: number;
  /** PR_SET_MEMORY_MERGE is on for it; null on kernels whose ksm_stat lacks the line. */
  mergeAny: boolean | null;
  /** It has at least one mergeable mapping; null likewise. */
  mergeable: boolean | null;
}

/** Parse the text of /proc/<pid>/ksm_stat (`name value` lines; numbers a kernel lacks read 0, flags null). */
export function parseKsmStat(text: string): KsmProcessStat {
  const f = new Map<string, string>();
  for (const line of text.split("\n")) {
    const m = /^(\w+):?\s+(\S+)/.exec(line.trim());
    if (m) f.set(m[1]!, m[2]!);
  }
  const num = (k: string) => (f.has(k) ? Number(f.get(k)) || 0 : 0);
  return {
    mergingPages: num("ksm_merging_pages"),
    zeroPages: num("ksm_zero_pages"),
    profitBytes: num("ksm_process_profit"),
    mergeAny: f.has("ksm_merge_any") ? f.get("ksm_merge_any") === "yes" : null,
    mergeable: f.has("ksm_mergeable") ? f.get("ksm_mergeable") === "yes" : null,
  };
}

/** /proc/<pid>/ksm_stat of a live process, or null when it is gone (or the kernel has none). */
export function readKsmStat(pid: number): KsmProcessStat | null {
  try {
    return parseKsmStat(readFileSync(`/proc/${pid}/ksm_stat`, "utf8"));
  } catch {
    return null;
  }
}
