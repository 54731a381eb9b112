/**
 * Seeded input generation for fuzz tests of untrusted-input parsers: a deterministic PRNG
 * (mulberry32) and helpers for random, truncated and mutated byte strings. A fixed seed makes a
 * failure reproducible: the failing case's index and bytes are in the assertion message.
 */

/** Deterministic PRNG (mulberry32): floats in [0, 1); the same seed gives the same sequence (fuzz tests, and bench/chaos replaying a run with --seed). */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A fuzz-input source over one seed. */
export class Fuzz {
  readonly next: () => number;
  constructor(seed: number) {
    this.next = rng(seed);
  }
  /** An integer in [lo, hi]. */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }
  /** One element of `xs`. */
  pick<T>(xs: readonly T[]): T {
    return xs[this.int(0, xs.length - 1)]!;
  }
  /** `n` random bytes. */
  bytes(n: number): Uint8Array {
    const b = new Uint8Array(n);
    for (let i = 0; i < n; i++) b[i] = this.int(0, 255);
    return b;
  }
  /** A prefix of `b` strictly shorter than it (possibly empty). */
  truncate(b: Uint8Array): Uint8Array {
    return b.subarray(0, this.int(0, Math.max(0, b.length - 1)));
  }
  /** A copy of `b` with 1..4 random edits (bit flip, byte set, byte dropped, bytes inserted). */
  mutate(b: Uint8Array): Uint8Array {
    let out = Uint8Array.from(b);
    for (let k = this.int(1, 4); k > 0; k--) {
      const at = this.int(0, Math.max(0, out.length - 1));
      switch (this.int(0, 3)) {
        case 0:
          if (out.length) out[at] = out[at]! ^ (1 << this.int(0, 7));
          break;
        case 1:
          if (out.length) out[at] = this.pick([0, 0xff, 0xc0, 0x3f, 0x2d, 0x0d, 0x0a, this.int(0, 255)]);
          break;
        case 2:
          out = Uint8Array.from([...out.subarray(0, at), ...out.subarray(at + 1)]);
          break;
        default:
          out = Uint8Array.from([...out.subarray(0, at), ...this.bytes(this.int(1, 8)), ...out.subarray(at)]);
      }
    }
    return out;
  }
}

/** Hex of at most 96 bytes of `b`, for a failure message. */
export function show(b: Uint8Array): string {
  return Buffer.from(b.subarray(0, 96)).toString("hex") + (b.length > 96 ? `… (${b.length} bytes)` : "");
}
