/**
 * The tools drive: a read-only ext4 image the node attaches to every VM as its first disk. It
 * carries the guest init, envd (the compiled agentenv), the glibc they run on, a static busybox
 * and a few host programs (ss, curl), so a sandbox's root filesystem needs none of them: Debian,
 * Alpine, busybox-only, distroless or empty roots all boot to envd. Served as a plain host file
 * (not through the per-sandbox disk export), shared by every VM of the node.
 *
 * Use: `buildTools` (or `agentenv tools build`) once; `resolveTools(home)` for the current image;
 * `toolsBoot(image.path, rootDisk, templateArgs)` for a VM's drives and kernel arguments.
 */
export { KEEP_TMP_ARG, keptBootArgs, ROOTFS_DEVICE, ROOTFS_DRIVE_ID, TOOLS_DRIVE_ID, TOOLS_INTERPRETER, TOOLS_MOUNT, probeCommand, toolsBoot, type ToolsBoot } from "./boot.ts";
export { agentenvSource, buildTools, compileEnv, jscEnvLines, resolveTools, TOOLS_IMAGE, toolsInitScript, type ToolsBuildOptions, type ToolsImage } from "./build.ts";
export { readInterpreter, setInterpreter } from "./elf.ts";
export { TOOLS_ERRORS, ToolsError, type ToolsErrorCode } from "./errors.ts";
