/**
 * LZ4 block format (no frame), our own codec. The compressor follows the reference "fast"
 * compressor for inputs under 64 KiB (lz4 1.8.3 LZ4_compress_default: 16-bit position table of
 * 2^13 entries, hash (x * 2654435761) >>> 19, acceleration 1, skip trigger 6, MFLIMIT 12,
 * LASTLITERALS 5), so ZFile blocks come out byte-identical to overlaybd's.
 * Block format: lz4/doc/lz4_Block_format.md.
 */
import { OverlaybdError } from "./errors.ts";

const MINMATCH = 4, MFLIMIT = 12, LASTLITERALS = 5, ML_MASK = 15, RUN_MASK = 15, SKIP_TRIGGER = 6;
const HASH_LOG = 13;
/** Largest input the 16-bit-table compressor accepts (lz4's LZ4_64Klimit). */
export const LZ4_MAX_INPUT = 65536 + MFLIMIT - 1;

/** Worst-case compressed size for `n` input bytes (LZ4_compressBound). */
export function lz4Bound(n: number): number {
  return n + Math.floor(n / 255) + 16;
}

/** A compressor's position table (2^13 16-bit entries); a caller compressing many blocks allocates one and passes it to each call. */
export function lz4Table(): Uint16Array {
  return new Uint16Array(1 << HASH_LOG);
}

function read32(b: Uint8Array, i: number): number {
  return (b[i]! | (b[i + 1]! << 8) | (b[i + 2]! << 16) | (b[i + 3]! << 24)) >>> 0;
}
function hashAt(b: Uint8Array, i: number): number {
  return Math.imul(read32(b, i), 2654435761 | 0) >>> (32 - HASH_LOG);
}

/**
 * Compress `src` (at most LZ4_MAX_INPUT bytes) into `dst` (at least lz4Bound(src.length) bytes).
 * @param table scratch position table from `lz4Table()` (cleared here; its contents carry nothing
 *   between calls), reused by a caller compressing many blocks; default: a new one
 * @returns the compressed length in bytes
 * @throws OverlaybdError `overlaybd.lz4_input_too_large` / `overlaybd.lz4_output_too_small`;
 *   `overlaybd.bad_option` for a table not from `lz4Table()`
 */
export function lz4Compress(src: Uint8Array, dst: Uint8Array, table: Uint16Array = lz4Table()): number {
  const n = src.length;
  if (n > LZ4_MAX_INPUT) throw new OverlaybdError("overlaybd.lz4_input_too_large", `LZ4 input of ${n} bytes exceeds ${LZ4_MAX_INPUT}`, { length: n });
  if (dst.length < lz4Bound(n)) throw new OverlaybdError("overlaybd.lz4_output_too_small", `LZ4 output buffer of ${dst.length} bytes is below the bound ${lz4Bound(n)}`, { length: dst.length });
  if (table.length !== 1 << HASH_LOG) throw new OverlaybdError("overlaybd.bad_option", `LZ4 position table of ${table.length} entries, not ${1 << HASH_LOG} (lz4Table())`, { length: table.length });
  table.fill(0);
  let op = 0, anchor = 0, ip = 0;
  const mflimitPlusOne = n - MFLIMIT + 1, matchlimit = n - LASTLITERALS;
  if (n >= MFLIMIT + 1) {
    table[hashAt(src, 0)] = 0;
    ip = 1;
    let forwardH = hashAt(src, ip);
    outer: for (;;) {
      let match: number;
      {
        let forwardIp = ip, step = 1, searchMatchNb = 1 << SKIP_TRIGGER;
        do {
          const h = forwardH;
          ip = forwardIp;
          forwardIp += step;
          step = searchMatchNb++ >> SKIP_TRIGGER;
          if (forwardIp > mflimitPlusOne) break outer;
          match = table[h]!;
          forwardH = hashAt(src, forwardIp);
          table[h] = ip;
        } while (read32(src, match) !== read32(src, ip));
      }
      while (ip > anchor && match > 0 && src[ip - 1] === src[match - 1]) {
        ip--;
        match--;
      }
      let token = op++;
      {
        const lit = ip - anchor;
        if (lit >= RUN_MASK) {
          dst[token] = RUN_MASK << 4;
          let len = lit - RUN_MASK;
          for (; len >= 255; len -= 255) dst[op++] = 255;
          dst[op++] = len;
        } else dst[token] = lit << 4;
        dst.set(src.subarray(anchor, ip), op);
        op += lit;
      }
      for (;;) {
        const dist = ip - match;
        dst[op++] = dist & 0xff;
        dst[op++] = dist >>> 8;
        let a = ip + MINMATCH, b = match + MINMATCH;
        while (a < matchlimit && src[a] === src[b]) {
          a++;
          b++;
        }
        let mc = a - (ip + MINMATCH);
        ip = a;
        if (mc >= ML_MASK) {
          dst[token]! += ML_MASK;
          mc -= ML_MASK;
          for (; mc >= 255; mc -= 255) dst[op++] = 255;
          dst[op++] = mc;
        } else dst[token]! += mc;
        anchor = ip;
        if (ip >= mflimitPlusOne) break outer;
        table[hashAt(src, ip - 2)] = ip - 2;
        const h = hashAt(src, ip);
        match = table[h]!;
        table[h] = ip;
        if (read32(src, match) === read32(src, ip)) {
          token = op++;
          dst[token] = 0;
          continue;
        }
        ip++;
        forwardH = hashAt(src, ip);
        break;
      }
    }
  }
  const last = n - anchor;
  if (last >= RUN_MASK) {
    dst[op++] = RUN_MASK << 4;
    let acc = last - RUN_MASK;
    for (; acc >= 255; acc -= 255) dst[op++] = 255;
    dst[op++] = acc;
  } else dst[op++] = last << 4;
  dst.set(src.subarray(anchor, n), op);
  return op + last;
}

function corrupt(why: string, at: number): never {
  throw new OverlaybdError("overlaybd.lz4_corrupt", `LZ4 block is corrupt: ${why} at input byte ${at}`, { offset: at });
}

/**
 * Decompress one LZ4 block `src` into `dst`.
 * @returns bytes written to `dst`
 * @throws OverlaybdError `overlaybd.lz4_corrupt` on any malformed sequence or overflow
 */
export function lz4Decompress(src: Uint8Array, dst: Uint8Array): number {
  let ip = 0, op = 0;
  const iend = src.length, oend = dst.length;
  while (ip < iend) {
    const token = src[ip++]!;
    let lit = token >>> 4;
    if (lit === 15) {
      let b: number;
      do {
        if (ip >= iend) corrupt("literal length runs past the end", ip);
        b = src[ip++]!;
        lit += b;
      } while (b === 255);
    }
    if (ip + lit > iend) corrupt("literals run past the end", ip);
    if (op + lit > oend) corrupt("output overflow", ip);
    if (lit < 32) for (let k = 0; k < lit; k++) dst[op++] = src[ip++]!;
    else {
      dst.set(src.subarray(ip, ip + lit), op);
      ip += lit;
      op += lit;
    }
    if (ip === iend) break;
    if (ip + 2 > iend) corrupt("truncated offset", ip);
    const dist = src[ip]! | (src[ip + 1]! << 8);
    ip += 2;
    if (dist === 0 || dist > op) corrupt(`bad match offset ${dist}`, ip - 2);
    let ml = token & 15;
    if (ml === 15) {
      let b: number;
      do {
        if (ip >= iend) corrupt("match length runs past the end", ip);
        b = src[ip++]!;
        ml += b;
      } while (b === 255);
    }
    ml += MINMATCH;
    if (op + ml > oend) corrupt("output overflow", ip);
    let m = op - dist;
    if (ml >= 64 && dist >= ml) {
      dst.copyWithin(op, m, m + ml);
      op += ml;
    } else if (dist === 1 && ml >= 16) {
      dst.fill(dst[m]!, op, op + ml); // run of one byte, common in zero-filled pages
      op += ml;
    } else for (let k = 0; k < ml; k++) dst[op++] = dst[m++]!;
  }
  return op;
}
