/**
 * Host facts the QEMU driver needs: which accelerator can run an ordinary guest, and the TSC
 * frequency hint for microvm under TCG. Facts: docs/vm-on-this-machine.md §3 (kvm_pvm cannot
 * run non-PVM guests; microvm/TCG needs tsc_early_khz or it may hang calibrating the TSC).
 */
import { accessSync, constants, existsSync, readFileSync } from "node:fs";

/** "kvm" when /dev/kvm is usable and is not kvm_pvm, else "tcg". */
export function detectAccel(sys = "/sys", dev = "/dev"): "kvm" | "tcg" {
  if (existsSync(`${sys}/module/kvm_pvm`)) return "tcg";
  try {
    accessSync(`${dev}/kvm`, constants.R_OK | constants.W_OK);
    return "kvm";
  } catch {
    return "tcg";
  }
}

/** Host TSC in kHz from the first "cpu MHz" line of /proc/cpuinfo (e.g. 2596134), or null. */
export function hostTscKhz(cpuinfo = "/proc/cpuinfo"): number | null {
  try {
    const m = /^cpu MHz\s*:\s*([\d.]+)/m.exec(readFileSync(cpuinfo, "utf8"));
    return m ? Math.round(Number(m[1]) * 1000) : null;
  } catch {
    return null;
  }
}
