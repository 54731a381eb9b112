/**
 * Container images as template bases: parse references, pull from an OCI / Docker v2 registry
 * (or its mirrors, `[image]`) with Debian's skopeo, unpack with umoci, and make one bootable
 * overlaybd layer, cached by manifest digest (see pull.ts for the format choice).
 */
export { ImageError } from "./errors.ts";
export { canonicalRegistry, DOCKER_HUB_ALIASES, formatImageRef, isLoopbackRegistry, parseImageRef, type ImageRef } from "./reference.ts";
export { authFor, normalizeAuthKey, readAuthFile, redact, secretsOf, writeContainersAuth, type AuthEntries, type RegistryAuth } from "./auth.ts";
export { caFiles, endpointsFor, isInsecureHost, parseMirror, plainRegistrySettings, registrySettings, type Endpoint, type RegistrySettings } from "./settings.ts";
export { classifySkopeo, srcFlags } from "./skopeo.ts";
export { fetchImage, pullContext, type FetchRequest, type Fetched } from "./fetch.ts";
export { blobCandidates, registryAccess } from "./blob-access.ts";
export { GUEST_BITS_KEY, installGuestBits, pullImage, reapPullLeftovers, imageRecordLayer, type ImageRunConfig, type PulledImage, type PullOptions } from "./pull.ts";
export { runTool, type ToolOptions, type ToolOutcome } from "./tool.ts";
