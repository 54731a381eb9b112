import { AgentEnvError, type ErrorTable } from "../../errors.ts";

/** Every failure of the overlaybd subsystem (formats, stacks, registry). Adding a code: see src/errors.ts. */
export const OVERLAYBD_ERRORS = {
  "overlaybd.already_compressed": "the layer is already ZFile-compressed or tar-wrapped",
  "overlaybd.bad_chain": "a layer's parent is not the layer below it (details.file)",
  "overlaybd.bad_config": "an image config is not valid JSON or misses fields (details.file)",
  "overlaybd.bad_credentials": "the registry credentials file cannot be read (details.file)",
  "overlaybd.bad_flags": "a ZFile header lacks required flags (details.file)",
  "overlaybd.bad_header": "an LSMT/ZFile header field is invalid (details.file, offset)",
  "overlaybd.bad_index": "an LSMT index entry overlaps or is out of order (details.file, offset)",
  "overlaybd.bad_jump_table": "a ZFile jump table does not fit the file (details.file)",
  "overlaybd.bad_magic": "not an LSMT/ZFile header or trailer (details.file, offset)",
  "overlaybd.bad_option": "an unknown option value, e.g. compression algorithm",
  "overlaybd.bad_order": "a segment was appended before the previous end",
  "overlaybd.bad_range": "an I/O with a bad offset or length (details.offset, length)",
  "overlaybd.bad_size": "a virtual size that is not a non-negative multiple of 512",
  "overlaybd.bad_tag": "an LSMT user tag longer than its field",
  "overlaybd.bad_tar": "a tar wrapper is malformed (details.file, offset)",
  "overlaybd.bad_uuid": "a string that is not a UUID",
  "overlaybd.cache_thrash": "a block cache evicted a block before it was used (cache too small)",
  "overlaybd.closed": "a layer writer was used after it finished",
  "overlaybd.crc_mismatch": "a ZFile jump table CRC does not match (details.file)",
  "overlaybd.decompress_failed": "a compressed block does not inflate to its size (details.file, offset)",
  "overlaybd.digest_mismatch": "a ZFile header digest does not match (details.file)",
  "overlaybd.discard_failed": "punching a hole in a layer file failed (details.file)",
  "overlaybd.no_remote": "a lower is remote but no registry backend was given (details.url)",
  "overlaybd.not_sync": "a synchronous read of an image with an asynchronous (remote) layer",
  "overlaybd.open_failed": "a layer file cannot be opened (details.file)",
  "overlaybd.out_of_range": "a read past the virtual size (details.offset)",
  "overlaybd.read_only": "a write to a read-only image",
  "overlaybd.registry_auth": "the registry asks for credentials none were given for",
  "overlaybd.registry_http": "a registry request failed (details.url, status)",
  "overlaybd.registry_size": "a registry blob has another size than expected (details.url)",
  "overlaybd.too_many_layers": "a stack above the layer limit",
  "overlaybd.truncated": "a short read: the file ends before the data it describes (details.file, offset)",
  "overlaybd.unaligned": "data not a multiple of 512 bytes",
  "overlaybd.unsupported": "an operation this layer kind cannot do",
  "overlaybd.lz4_input_too_large": "an LZ4 input above the format's limit (details.length)",
  "overlaybd.lz4_output_too_small": "an LZ4 output buffer below the bound (details.length)",
  "overlaybd.lz4_corrupt": "an LZ4 block is corrupt (details.offset)",
} as const satisfies ErrorTable;
/** An OverlaybdError code. */
export type OverlaybdErrorCode = keyof typeof OVERLAYBD_ERRORS;

/**
 * The one error type of the overlaybd subsystem. `code` is stable; `details` names the file and
 * the byte offset at fault whenever one exists.
 */
export class OverlaybdError extends AgentEnvError<OverlaybdErrorCode> {}

/** Shorthand used across the module: throw a typed error with file and offset details. */
export function fail(code: OverlaybdErrorCode extends `overlaybd.${infer S}` ? S : never, message: string, details: Record<string, unknown> = {}): never {
  const where = details.file !== undefined ? ` (${details.file}${details.offset !== undefined ? ` @${details.offset}` : ""})` : "";
  throw new OverlaybdError(`overlaybd.${code}`, message + where, details);
}
