/**
 * How a VM boots through the tools drive: the drive is the kernel's root (first virtio-blk device,
 * /dev/vda, read-only) and runs `/init` from it; the sandbox's own root filesystem is the second
 * device (/dev/vdb), which init mounts and pivots into, keeping the tools drive at `/.aenv`.
 * Both VMM drivers name drives in the order given with the root drive first (QEMU: command-line
 * order; Firecracker: PUT order), so the order here fixes the device names.
 */
import type { DriveSpec } from "../vmm/types.ts";

/** Where the tools drive appears in the guest (its programs in `/.aenv/bin`, libraries in `/.aenv/lib`). */
export const TOOLS_MOUNT = "/.aenv";
/** The glibc loader on the tools drive, as a guest path (the envd binary's PT_INTERP). */
export const TOOLS_INTERPRETER = `${TOOLS_MOUNT}/lib/ld.so`;
/** Device of the sandbox's root filesystem when booted through the tools drive. */
export const ROOTFS_DEVICE = "/dev/vdb";
/** Drive id of the tools drive (VMM device ids; snapshots restore with the same ids). */
export const TOOLS_DRIVE_ID = "tools";
/** Drive id of the sandbox's root filesystem. */
export const ROOTFS_DRIVE_ID = "root";

/**
 * Kernel argument of the boots inside a template build (build steps, the template's snapshot
 * boot): the guest init leaves /tmp as the disk has it, where a sandbox's boot empties it as
 * Debian does (src/tools/init.sh). For `init mount-root` the same is environment AENV_TMP=keep.
 */
export const KEEP_TMP_ARG = "aenv.tmp=keep";

/** A VM's drives and kernel arguments for booting `rootDisk` through the tools drive. */
export interface ToolsBoot {
  /** Tools drive (root, read-only) first, then the sandbox's root disk. */
  drives: DriveSpec[];
  /** Kernel arguments: the tools drive as root, its init, and where the sandbox's root is. */
  bootArgs: string;
}

/** Template arguments the tools drive replaces (a template's own root device and init). */
const REPLACED = /^(root|rootfstype|rootflags|init)=|^(ro|rw)$/;

/** The words of a template's kernel arguments `args` that a boot through the tools drive keeps (not its root device or init). */
export function keptBootArgs(args: string): string[] {
  return args.split(/\s+/).filter((a) => a && !REPLACED.test(a));
}

/**
 * Drives and kernel arguments for booting `rootDisk` (the sandbox's root filesystem, ext4) through
 * the tools drive image `toolsImage`. `extraArgs` (a template's boot arguments) are kept except
 * the root device and init they may name, which the tools drive replaces. With `rootReadOnly`
 * the disk is attached read-only and the init mounts it so (it must then hold `/.aenv` already).
 */
export function toolsBoot(toolsImage: string, rootDisk: string, extraArgs = "", o: { rootReadOnly?: boolean } = {}): ToolsBoot {
  const extra = keptBootArgs(extraArgs);
  return {
    drives: [
      { id: TOOLS_DRIVE_ID, path: toolsImage, readOnly: true, isRoot: true },
      { id: ROOTFS_DRIVE_ID, path: rootDisk, readOnly: o.rootReadOnly ?? false, isRoot: false },
    ],
    bootArgs: ["root=/dev/vda", "ro", "rootfstype=ext4", "init=/init", `aenv.root=${ROOTFS_DEVICE}`, "aenv.rootfstype=ext4", ...extra].join(" "),
  };
}

/**
 * The envd process (cmd, args) of a template ready probe running `script`: the tools drive's
 * busybox shell with the drive's programs first on PATH (then the PATH the process was given), so
 * a probe's shell and programs (`ss`, `curl`, `grep`) come from what the node brings, never from
 * the image's own userland (an image may have none of them, or broken ones).
 */
export function probeCommand(script: string): { cmd: string; args: string[] } {
  return { cmd: `${TOOLS_MOUNT}/bin/sh`, args: ["-c", `PATH=${TOOLS_MOUNT}/bin\${PATH:+:$PATH}; export PATH\n${script}`] };
}
