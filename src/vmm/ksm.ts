/**
 * `[vm] ksm` applied at node start (docs/density.md): kernel samepage merging keeps one copy of
 * the equal pages that sandboxes restored from one snapshot hold (their guests' writes, QEMU's
 * heap), which is most of what lets one host hold 400 idle sandboxes under TCG.
 * - "off": nothing is changed on the host; QEMU gets `mem-merge=off` (qemuOptions).
 * - "guest": QEMU marks guest RAM mergeable (`mem-merge=on`); Firecracker marks nothing.
 * - "all": also PR_SET_MEMORY_MERGE on the node process, inherited by everything it starts
 *   from then on (VMMs, the disk daemon): all their anonymous memory is mergeable.
 * Both "guest" and "all" start the host's ksmd (run = 1, use_zero_pages = 1) at a rate the
 * kernel's scan advisor keeps to a full pass every `scanSecs` with ksmd under `maxCpuPercent` of
 * a core (its cost then follows the number of sandboxes), or, with `scanSecs` 0 or a kernel
 * without the advisor, at a fixed `pagesToScan` per wakeup.
 * Adopted VMMs keep what the node that started them gave them.
 */
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
  driver: "qemu" | "firecracker";
}

/** What `applyKsm` did: the host's state before and after, whether the node's own memory (and its children's) is mergeable, and a warning for the operator. */
export interface KsmApplied {
  mode: KsmSetup["mode"];
  before: KsmHostState | null;
  after: KsmHostState | null;
  processMerge: boolean;
  warning?: string;
}

/**
 * Apply `[vm] ksm`: start ksmd at the configured rate and, for "all", make this process's memory
 * and its future children's mergeable. Call before any VMM or the disk daemon is spawned.
 * `sysfsDir`: the KSM directory (tests).
 * @throws VmmError `vmm.ksm_unavailable` when merging is asked for and the kernel has no KSM;
 *   KsmError `ksm.failed` when a knob cannot be written or prctl is refused (not root, a kernel
 *   before 6.4 for "all").
 */
export function applyKsm(s: KsmSetup, sysfsDir?: string): KsmApplied {
  if (s.mode === "off") return { mode: "off", before: null, after: null, processMerge: false };
  const before = readKsmHost(sysfsDir);
  if (!before) throw new VmmError("vmm.ksm_unavailable", "[vm] ksm is on but this kernel has no kernel samepage merging (/sys/kernel/mm/ksm); set [vm] ksm = \"off\"", { mode: s.mode });
  const rate: KsmHostSettings =
    s.scanSecs > 0 && before.advisorMode !== null
      ? { advisor: { mode: "scan-time", maxCpuPercent: s.maxCpuPercent, targetScanSecs: s.scanSecs } }
      : s.pagesToScan > 0
        ? { pagesToScan: s.pagesToScan, ...(before.advisorMode === "scan-time" ? { advisor: { mode: "none" as const } } : {}) }
        : {};
  writeKsmHost({ useZeroPages: true, ...rate, run: 1 }, sysfsDir);
  if (s.mode === "all") setProcessMemoryMerge(true);
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
    agentenv_host_ksm_pages_sharing: { value: h.pagesSharing, help: "Page mappings on the host that share a merged copy instead of holding their own (4 KiB pages saved)." },
    agentenv_host_ksm_profit_bytes: { value: h.generalProfitBytes, help: "The kernel's estimate of bytes merging saves on the host, net of its own metadata." },
  };
}
