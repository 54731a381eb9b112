/**
 * `[vm] ksm` applied at node start (docs/density.md): kernel samepage merging keeps one copy of
 * the equal pages that sandboxes restored from one snapshot hold (their guests' writes, QEMU's
 * heap), which is most of what lets one host hold 400 idle sandboxes under TCG.
 * - "off": nothing is changed on the host; QEMU gets `mem-merge=off` (qemuOptions).
 * - "guest": QEMU marks guest RAM mergeable (`mem-merge=on`); Firecracker marks nothing.
 * - "all": also PR_SET_MEMORY_MERGE on the node process, inherited by everything it starts
 *   from then on (VMMs, the disk daemon): all their anonymous memory is mergeable. Needs Linux
 *   >= 6.7, where the flag is kept across execve.
 * Both "guest" and "all" start the host's ksmd (run = 1, use_zero_pages = 1) at a rate the
 * kernel's scan advisor keeps to a full pass every `scanSecs` with ksmd steered under
 * `maxCpuPercent` of a core (its cost then follows the number of sandboxes, from the advisor's
 * floor of 500 pages per wakeup), or, with `scanSecs` 0 or a kernel without the advisor, at a
 * fixed `pagesToScan` per wakeup.
 * VMMs and the disk daemon adopted at start keep what the node that started them gave them: a
 * change of mode reaches the VMMs started from then on (docs/density.md).
 */
import { release } from "node:os";
import { type KsmHostSettings, type KsmHostState, readKsmHost, setProcessMemoryMerge, writeKsmHost } from "../ffi/ksm.ts";
import { VmmError } from "./errors.ts";

/** What `applyKsm` needs: the mode, ksmd's rate and the VMM driver's name. */
export interface KsmSetup {
  mode: "off" | "guest" | "all";
  /** Target time of a full pass, s, for the scan advisor; 0: the fixed rate below. */
  scanSecs: number;
  /** The advisor's bound on ksmd's CPU, % of one core. */
  maxCpuPercent: number;
  /** Fixed pages per wakeup without the advisor; 0 leaves the host's. */
  pagesToScan: number;
  /** The node's VMM driver (Firecracker marks no memory itself: "guest" merges nothing there). */
  driver: "qemu" | "firecracker";
}

/** What `applyKsm` did, for the start-up log. */
export interface KsmApplied {
  mode: KsmSetup["mode"];
  /** The host's KSM state before and after (null for "off", which reads nothing but `run`). */
  before: KsmHostState | null;
  after: KsmHostState | null;
  /** The node process, and what it starts from now on, has all its anonymous memory mergeable. */
  processMerge: boolean;
  /** Something the operator should know: "guest" under Firecracker, or ksmd left running under "off". */
  warning?: string;
}

/** `[major, minor]` of a kernel release string such as "6.18.44-fc" ([0, 0] when unreadable). */
export function kernelVersion(rel = release()): [number, number] {
  const m = /^(\d+)\.(\d+)/.exec(rel);
  return m ? [Number(m[1]), Number(m[2])] : [0, 0];
}

/**
 * Apply `[vm] ksm`: for "all", make this process's memory and its future children's mergeable
 * (first: a refusal then changes nothing on the host), then start ksmd at the configured rate.
 * Call before any VMM or the disk daemon is spawned. `sysfsDir`: the KSM directory (tests);
 * `kernelRelease`: the running kernel's release (tests).
 * @throws VmmError `vmm.ksm_unavailable` when merging is asked for and the kernel has no KSM, or
 *   "all" on a kernel before 6.7; KsmError `ksm.failed` when a knob cannot be written or the
 *   prctl is refused.
 */
export function applyKsm(s: KsmSetup, sysfsDir?: string, kernelRelease?: string): KsmApplied {
  if (s.mode === "off") {
    // a previous node's ksm (or the operator's) may still run: the VMMs it marked stay merged
    const run = readKsmHost(sysfsDir)?.run;
    return {
      mode: "off",
      before: null,
      after: null,
      processMerge: false,
      ...(run === 1 ? { warning: "[vm] ksm is off for the VMMs this node starts, but the host's ksmd runs: VMMs marked before (an earlier node with ksm on) stay merged until they end; `echo 2 > /sys/kernel/mm/ksm/run` unmerges every page" } : {}),
    };
  }
  const before = readKsmHost(sysfsDir);
  if (!before) throw new VmmError("vmm.ksm_unavailable", '[vm] ksm is on but this kernel has no kernel samepage merging (/sys/kernel/mm/ksm); set [vm] ksm = "off"', { mode: s.mode });
  if (s.mode === "all") {
    const [major, minor] = kernelVersion(kernelRelease);
    if (major < 6 || (major === 6 && minor < 7)) {
      throw new VmmError("vmm.ksm_unavailable", `[vm] ksm = "all" needs Linux >= 6.7 (the merge flag kept across execve); this kernel is ${kernelRelease ?? release()}: use "guest"`, { mode: s.mode });
    }
    setProcessMemoryMerge(true);
  }
  const rate: KsmHostSettings =
    s.scanSecs > 0 && before.advisorMode !== null
      ? { advisor: { mode: "scan-time", maxCpuPercent: s.maxCpuPercent, targetScanSecs: s.scanSecs } }
      : s.pagesToScan > 0
        ? { pagesToScan: s.pagesToScan, ...(before.advisorMode === "scan-time" ? { advisor: { mode: "none" as const } } : {}) }
        : {};
  writeKsmHost({ useZeroPages: true, ...rate, run: 1 }, sysfsDir);
  const warning = s.mode === "guest" && s.driver === "firecracker" ? 'Firecracker does not mark guest memory mergeable: [vm] ksm = "guest" merges nothing; use "all"' : undefined;
  return { mode: s.mode, before, after: readKsmHost(sysfsDir), processMerge: s.mode === "all", ...(warning ? { warning } : {}) };
}

/**
 * The host's KSM counters as Prometheus gauges (name -> value and help), empty when the kernel
 * has no KSM. Pages are 4 KiB.
 */
export function ksmGauges(sysfsDir?: string): Record<string, { value: number; help: string }> {
  const h = readKsmHost(sysfsDir);
  if (!h) return {};
  return {
    agentenv_host_ksm_running: { value: h.run === 1 ? 1 : 0, help: "1 while the host's ksmd merges equal pages ([vm] ksm)." },
    agentenv_host_ksm_pages_sharing: { value: h.pagesSharing, help: "Page mappings on the host that share a merged copy instead of holding their own (4 KiB pages; empty pages are in agentenv_host_ksm_zero_pages)." },
    agentenv_host_ksm_zero_pages: { value: Number.isNaN(h.zeroPages) ? 0 : h.zeroPages, help: "Empty pages ksmd mapped to the kernel's zero page (4 KiB pages saved)." },
    agentenv_host_ksm_profit_bytes: { value: h.generalProfitBytes, help: "The kernel's estimate of bytes merging saves on the host, net of its own metadata." },
  };
}
