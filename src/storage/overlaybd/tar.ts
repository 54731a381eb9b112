/**
 * The tar wrapper overlaybd puts around a layer blob (overlaybd-format.md 3.8): a PAX header
 * `overlaybd.pax` carrying `size=<n>`, a ustar header `overlaybd.commit` with size 0, the payload,
 * zero padding to 512 bytes and two zero blocks. Readers find the payload at 1536 (PAX) or 512.
 */
import { type Backend, SliceBackend } from "./backend.ts";
import { fail } from "./errors.ts";

const BLOCK = 512;
// ustar header field offsets (POSIX.1-1988 ustar)
const T_NAME = 0, T_MODE = 100, T_UID = 108, T_GID = 116, T_SIZE = 124, T_MTIME = 136, T_CHKSUM = 148;
const T_TYPE = 156, T_MAGIC = 257, T_VERSION = 263, T_UNAME = 265, T_GNAME = 297;
const MAGIC = "ustar\0";

function ascii(b: Uint8Array, off: number, len: number): string {
  let s = "";
  for (let i = off; i < off + len && b[i] !== 0; i++) s += String.fromCharCode(b[i]!);
  return s;
}

function checksum(h: Uint8Array): number {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= T_CHKSUM && i < T_CHKSUM + 8 ? 0x20 : h[i]!;
  return sum;
}

/**
 * A numeric header field: octal digits (NUL/space padded), or GNU base-256 when the first byte
 * has its high bit set: bit 0x40 of that byte is the sign, its low 6 bits and the following bytes
 * a big-endian number (GNU tar `from_header`; Python's `tarfile` writes 0x80 then 11 bytes).
 * GNU tar uses it for sizes of 8 GiB and more. Returns NaN for a negative or unparsable value.
 */
export function tarNumber(h: Uint8Array, off: number, len: number): number {
  const first = h[off]!;
  if (first & 0x80) {
    if (first & 0x40) return NaN;
    let n = first & 0x3f;
    for (let i = off + 1; i < off + len; i++) n = n * 256 + h[i]!;
    return n;
  }
  const text = ascii(h, off, len).trim();
  return text === "" ? 0 : /^[0-7]+$/.test(text) ? parseInt(text, 8) : NaN;
}

/**
 * True when `h` (512 bytes) is a tar header with a valid checksum: POSIX ustar (magic "ustar\0",
 * version "00") or GNU (magic "ustar " + version " \0", the 8 bytes "ustar  \0"; GNU tar's
 * default format and what GNU tar and Python's `tarfile` write for base-256 sizes).
 */
export function isTarHeader(h: Uint8Array): boolean {
  if (h.length < BLOCK) return false;
  const magic = ascii(h, T_MAGIC, 6);
  const gnu = magic === "ustar " && h[T_VERSION] === 0x20 && h[T_VERSION + 1] === 0;
  if (magic !== "ustar" && !gnu) return false;
  const stored = parseInt(ascii(h, T_CHKSUM, 8).trim(), 8);
  return Number.isFinite(stored) && stored === checksum(h);
}

/**
 * If `b` starts with a tar header (ustar or GNU), return the first member's payload as a backend (payload
 * length from the PAX `size` record, else the header's size field); otherwise return null.
 * @throws OverlaybdError `overlaybd.bad_tar` for a PAX header without a usable size or a member past the end.
 */
export async function openTarMember(b: Backend): Promise<Backend | null> {
  if (b.size < BLOCK) return null;
  const h = new Uint8Array(BLOCK);
  await b.pread(h, 0);
  if (!isTarHeader(h)) return null;
  let start = BLOCK, size = tarNumber(h, T_SIZE, 12);
  if (h[T_TYPE] === 0x78 /* x */ || h[T_TYPE] === 0x67 /* g */) {
    const recLen = size;
    const rec = new Uint8Array(Math.ceil(recLen / BLOCK) * BLOCK);
    await b.pread(rec, BLOCK);
    const text = new TextDecoder().decode(rec.subarray(0, recLen));
    const m = /(?:^|\n)\d+ size=(\d+)\n/.exec(text);
    const h2 = new Uint8Array(BLOCK);
    const h2off = BLOCK + rec.length;
    await b.pread(h2, h2off);
    if (!isTarHeader(h2)) fail("bad_tar", "PAX header is not followed by a valid ustar header", { file: b.name, offset: h2off });
    start = h2off + BLOCK;
    size = m ? Number(m[1]) : tarNumber(h2, T_SIZE, 12);
  }
  if (!Number.isSafeInteger(size) || start + size > b.size) {
    fail("bad_tar", `tar member of ${size} bytes at ${start} runs past the end (${b.size} bytes)`, { file: b.name, offset: start, size });
  }
  return new SliceBackend(b, start, size, `${b.name}#tar`);
}

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width, " ");
}

function header(name: string, type: string, fields: { mode?: number; size: number; owner?: boolean }): Uint8Array {
  const h = new Uint8Array(BLOCK);
  const put = (off: number, s: string) => {
    for (let i = 0; i < s.length; i++) h[off + i] = s.charCodeAt(i);
  };
  put(T_NAME, name);
  if (fields.mode !== undefined) put(T_MODE, octal(fields.mode, 6) + " \0");
  if (fields.owner) {
    put(T_UID, octal(0, 6) + " \0");
    put(T_GID, octal(0, 6) + " \0");
  }
  put(T_SIZE, octal(fields.size, 11) + " ");
  if (fields.owner) put(T_MTIME, octal(0, 11) + " ");
  put(T_TYPE, type);
  put(T_MAGIC, MAGIC);
  put(T_VERSION, "00");
  if (fields.owner) {
    put(T_UNAME, "root");
    put(T_GNAME, "root");
  }
  put(T_CHKSUM, octal(checksum(h), 6) + " \0");
  return h;
}

/**
 * The 1536 bytes overlaybd writes before a payload of `payloadSize` bytes: PAX header, PAX record,
 * `overlaybd.commit` header (mode 100644, root, mtime 0). Matches the convertor's output byte for byte.
 */
export function tarPrefix(payloadSize: number, mode = 0o100644): Uint8Array {
  let rec = ` size=${payloadSize}\n`;
  let len = rec.length + 1;
  while (String(len).length + rec.length !== len) len = String(len).length + rec.length;
  rec = `${len}${rec}`;
  const out = new Uint8Array(3 * BLOCK);
  out.set(header("overlaybd.pax", "x", { size: rec.length }), 0);
  for (let i = 0; i < rec.length; i++) out[BLOCK + i] = rec.charCodeAt(i);
  out.set(header("overlaybd.commit", "0", { mode, size: 0, owner: true }), 2 * BLOCK);
  return out;
}

/** Bytes that follow a payload of `payloadSize` bytes: padding to 512 and two zero blocks. */
export function tarSuffixLength(payloadSize: number): number {
  return (BLOCK - (payloadSize % BLOCK)) % BLOCK + 2 * BLOCK;
}
