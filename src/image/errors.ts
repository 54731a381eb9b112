import { AgentEnvError, type ErrorTable } from "../errors.ts";

/** OCI image pull and conversion failures. Adding a code: see src/errors.ts. */
export const IMAGE_ERRORS = {
  "image.bad_reference": "an image reference outside Docker's grammar (details.ref)",
  "image.not_found": "the registry has no such repository, tag or digest (details.ref)",
  "image.no_platform": "a manifest list without a linux/amd64 entry (details.platforms)",
  "image.bad_manifest": "a manifest or image config that is not JSON of the shape the image spec gives (details.ref, what, field)",
  "image.auth": "the registry refused the credentials or wants some (details.registry)",
  "image.tls": "the registry needs TLS the node cannot verify (add its CA with [image] ca_path), or speaks plain HTTP while not in [image] insecure_registries",
  "image.unreachable": "the registry cannot be reached (details.registry)",
  "image.digest_mismatch": "a blob's or manifest's bytes do not match its digest, or a mirror served another manifest than the pinned digest (details.ref, expected, actual, endpoint)",
  "image.bad_config": "an [image] setting cannot be used: a mirror endpoint, ca_path or auth_file (details.key, path)",
  "image.pull_failed": "skopeo failed otherwise, or the pull was cancelled (details.stderr)",
  "image.timeout": "a registry request or a tool run took longer than its bound (details.timeoutMs; [template_build] manifest_timeout_ms, tool_timeout_ms)",
  "image.unpack_failed": "umoci could not unpack the layers (details.ref)",
  "image.convert_failed": "making the ext4 root filesystem failed (details.ref)",
  "image.tool_missing": "skopeo, umoci or mkfs.ext4 is not installed (details.cmd)",
  "image.bad_rootfs": "the image holds a directory, device, FIFO or link loop where the node adds a file (details.path)",
} as const satisfies ErrorTable;
/** An ImageError code. */
export type ImageErrorCode = keyof typeof IMAGE_ERRORS;

/** A failure of this subsystem: one of `IMAGE_ERRORS` as `code`, the offending values in `details`. */
export class ImageError extends AgentEnvError<ImageErrorCode> {}
