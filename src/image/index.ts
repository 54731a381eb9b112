/**
 * Container images as template bases: parse references, pull from an OCI / Docker v2 registry
 * with Debian's skopeo, unpack with umoci, and make one bootable overlaybd layer, cached by
 * manifest digest (see pull.ts for the format choice).
 */
export { ImageError } from "./errors.ts";
export { formatImageRef, isLoopbackRegistry, parseImageRef, type ImageRef } from "./reference.ts";
export { classifySkopeo, GUEST_BITS_KEY, installGuestBits, pullImage, srcFlags, reapPullLeftovers, writeAuthFile, imageRecordLayer, type ImageRunConfig, type PulledImage, type PullOptions } from "./pull.ts";
export { runTool, type ToolOptions, type ToolOutcome } from "./tool.ts";
