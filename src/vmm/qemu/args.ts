/**
 * QEMU command line for one microVM: `-M microvm` with ACPI (devices found as LNRO0005
 * virtio-mmio), modern virtio-mmio (`force-legacy=false`), guest RAM in a named file, serial
 * console and QMP each on a Unix socket the driver made, virtio-blk/net/rng devices. Recipe and measurements:
 * docs/vm-on-this-machine.md §3, §7 and docs/bun-in-guest.md (`-cpu max` + virtio-rng).
 */
import { VmmError } from "../errors.ts";
import type { VmSpec } from "../types.ts";

/** Driver-level settings that are not part of a VmSpec. */
export interface QemuArgsOptions {
  accel: "kvm" | "tcg";
  /** TCG translation-block cache size in MiB (`-accel tcg,tb-size=`); 0 keeps QEMU's default. */
  tcgTbSizeMiB: number;
  /** -cpu model ("max" under TCG, "host" under KVM). */
  cpu: string;
  /** tsc_early_khz value under TCG; null adds nothing. */
  tscKhz: number | null;
  /** Guest RAM file (memory-backend-file mem-path). */
  memPath: string;
  /** share=on maps the RAM file MAP_SHARED (boot); share=off maps it privately (copy-on-write restore). */
  memShared: boolean;
  /**
   * QEMU's descriptor number of a listening Unix socket for QMP that the driver made and passed
   * to it (`-chardev socket,fd=N,server=on`): the driver connects right after spawning, with no
   * poll for QEMU to create the socket (src/ffi/unix-listen.ts).
   */
  qmpFd: number;
  /**
   * QEMU's descriptor number of a listening Unix socket for the serial console, passed like
   * `qmpFd` (`-chardev socket,fd=N,server=on,wait=on`): QEMU waits at start for the node to
   * connect (no boot line is lost), and a node that starts later connects to the same socket
   * once the previous one is gone (issue 27: the console does not depend on a pipe of the node
   * that spawned QEMU). While nobody is connected, QEMU drops console output.
   */
  consoleFd: number;
  /** Kernel command line assembled by the driver (base + net + clock + spec.bootArgs). */
  cmdline: string;
  /** Add `-incoming defer` (restore). */
  incoming: boolean;
  /**
   * Add a virtio-balloon device with free page reporting (`BALLOON_DEVICE`): the guest hands the
   * pages it frees back to QEMU, which drops them from its memory (docs/density.md).
   */
  balloon: boolean;
  /** Keep microvm's i8254 PIT (restores of snapshots whose VM had it; see `MACHINE`). */
  pit?: boolean;
  /** `mem-merge=on`: QEMU madvises guest RAM MADV_MERGEABLE for the host's KSM (docs/density.md); off otherwise. */
  memMerge: boolean;
}

/**
 * The machine: microvm with the guest RAM backend below, without the i8254 PIT. Left on, the PIT
 * runs from reset in mode 3 at 18.2 Hz whatever the guest does with it, and QEMU's main loop
 * wakes at each of its output's transitions (36 a second) for as long as the VM lives: 0.2% of a
 * core per idle VM under TCG, against 0.03% without it (docs/density.md). Linux needs no PIT
 * here: its TSC rate comes from tsc_early_khz and the local APIC timer is calibrated against it.
 * `QemuArgsOptions.pit` keeps it for restores of snapshots taken with one.
 */
export const MACHINE = "microvm,memory-backend=mem,pit=off";

/**
 * The free page reporting device. Never inflated: it only carries the guest's reports of free
 * memory. `page-poison=off`: a guest that needs its free pages' contents kept (init_on_free, page
 * poisoning) then reports nothing, because a restored VM's discarded page reads back as the memory
 * image's bytes, not as zeros.
 */
export const BALLOON_DEVICE = "virtio-balloon-device,free-page-reporting=on,page-poison=off";

// QEMU splits option values on ',' and the exec: migration URI goes through /bin/sh: keep paths plain.
const SAFE_PATH = /^\/[A-Za-z0-9._\/+@:-]*$/;
const SAFE_ID = /^[A-Za-z0-9_-]{1,64}$/;
const MAC = /^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$/;
const IFNAME = /^[A-Za-z0-9_.-]{1,15}$/;

/** @throws VmmError `vmm.bad_spec` unless `p` is absolute and free of `,`, spaces and shell metacharacters. */
export function checkPath(p: string, what: string): string {
  if (!SAFE_PATH.test(p) || p.includes("..")) throw new VmmError("vmm.bad_spec", `${what} ${JSON.stringify(p)} must be an absolute plain path`, { [what]: p });
  return p;
}

/**
 * The argv (without the binary) for `qemu-system-x86_64`.
 * @throws VmmError `vmm.bad_spec` for bad ids, paths, MACs, tap names, sizes, or a drive list
 *   without exactly one root drive.
 */
export function buildQemuArgs(spec: VmSpec, o: QemuArgsOptions): string[] {
  if (!SAFE_ID.test(spec.id)) throw new VmmError("vmm.bad_spec", `VM id ${JSON.stringify(spec.id)} must match ${SAFE_ID}`, { id: spec.id });
  if (!Number.isInteger(spec.vcpus) || spec.vcpus < 1 || spec.vcpus > 32) throw new VmmError("vmm.bad_spec", `vcpus ${spec.vcpus} not in 1..32`, { vcpus: spec.vcpus });
  if (!Number.isInteger(spec.memoryMiB) || spec.memoryMiB < 64 || spec.memoryMiB > 65536) {
    throw new VmmError("vmm.bad_spec", `memoryMiB ${spec.memoryMiB} not in 64..65536`, { memoryMiB: spec.memoryMiB });
  }
  const roots = spec.drives.filter((d) => d.isRoot);
  if (roots.length !== 1) throw new VmmError("vmm.bad_spec", `need exactly one root drive, got ${roots.length}`, { id: spec.id });
  checkPath(spec.kernelPath, "kernelPath");
  checkPath(o.memPath, "memPath");
  for (const [what, fd] of [["QMP", o.qmpFd], ["console", o.consoleFd]] as const) {
    if (!Number.isInteger(fd) || fd < 3) throw new VmmError("vmm.bad_spec", `${what} descriptor ${fd} is not a passed descriptor (>= 3)`, { [`${what.toLowerCase()}Fd`]: fd });
  }
  if (o.qmpFd === o.consoleFd) throw new VmmError("vmm.bad_spec", `QMP and console share descriptor ${o.qmpFd}`, { qmpFd: o.qmpFd, consoleFd: o.consoleFd });

  const a: string[] = [
    "-name", `aenv-${spec.id}`,
    "-M", `${o.pit ? MACHINE.replace(",pit=off", "") : MACHINE},mem-merge=${o.memMerge ? "on" : "off"}`,
    "-accel", o.accel === "tcg" && o.tcgTbSizeMiB > 0 ? `tcg,tb-size=${o.tcgTbSizeMiB}` : o.accel,
    "-cpu", o.cpu,
    "-m", `${spec.memoryMiB}M`,
    "-smp", String(spec.vcpus),
    "-object", `memory-backend-file,id=mem,size=${spec.memoryMiB}M,mem-path=${o.memPath},share=${o.memShared ? "on" : "off"}`,
    "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
    "-global", "virtio-mmio.force-legacy=false",
    "-chardev", `socket,id=qmp,fd=${o.qmpFd},server=on,wait=off`,
    "-mon", "chardev=qmp,mode=control",
    // serial console on a socket the node reads into a bounded log (../console.ts)
    "-chardev", `socket,id=con,fd=${o.consoleFd},server=on,wait=on`,
    "-serial", "chardev:con",
    "-kernel", spec.kernelPath,
    "-append", o.cmdline,
  ];
  // root drive first: with one drive per VM it is /dev/vda, which the template's root= names
  for (const d of [...roots, ...spec.drives.filter((d) => !d.isRoot)]) {
    if (!SAFE_ID.test(d.id)) throw new VmmError("vmm.bad_spec", `drive id ${JSON.stringify(d.id)} must match ${SAFE_ID}`, { driveId: d.id });
    checkPath(d.path, "drivePath");
    a.push("-drive", `id=${d.id},file=${d.path},format=raw,if=none,readonly=${d.readOnly ? "on" : "off"}`);
    if (d.serial !== undefined && !/^[A-Za-z0-9]{1,20}$/.test(d.serial)) throw new VmmError("vmm.bad_spec", `drive serial ${JSON.stringify(d.serial)} must be 1-20 of [A-Za-z0-9]`, { driveId: d.id });
    a.push("-device", `virtio-blk-device,drive=${d.id}${d.serial ? `,serial=${d.serial}` : ""}`);
  }
  a.push("-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-device,rng=rng0");
  if (spec.net) {
    if (!IFNAME.test(spec.net.tapName)) throw new VmmError("vmm.bad_spec", `tap name ${JSON.stringify(spec.net.tapName)} invalid`, { tapName: spec.net.tapName });
    if (!MAC.test(spec.net.mac)) throw new VmmError("vmm.bad_spec", `MAC ${JSON.stringify(spec.net.mac)} invalid`, { mac: spec.net.mac });
    a.push("-netdev", `tap,id=net0,ifname=${spec.net.tapName},script=no,downscript=no`);
    a.push("-device", `virtio-net-device,netdev=net0,mac=${spec.net.mac}`);
  }
  // last, so VMs without it keep every other device at the same virtio-mmio slot
  if (o.balloon) a.push("-device", BALLOON_DEVICE);
  if (o.incoming) a.push("-incoming", "defer");
  return a;
}
