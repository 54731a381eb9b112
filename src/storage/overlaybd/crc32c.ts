/**
 * Raw CRC-32C for ZFile (block and jump-table checksums), through the `@node-rs/crc32` native
 * addon. Kept over a table-driven slicing-by-8 in TypeScript (the way to drop the native
 * dependency): bench/overlaybd.ts measures both on equal results, and at 4 KiB (ZFile's block
 * size) and above the addon is 2.7-3.7x faster (1954 vs 714 MiB/s at 4 KiB, 2377 vs 650 MiB/s at
 * 1 MiB; load 8.7, commit 4566831); the table wins only below 512 bytes (a header, a small jump
 * table), where either costs next to nothing.
 */
import { crc32c } from "@node-rs/crc32";

/**
 * Raw CRC-32C register update (reflected polynomial 0x82F63B78) with no initial or final
 * inversion, as ZFile uses it (overlaybd-format.md 3.4). `@node-rs/crc32` applies both
 * inversions, so they are undone around the call.
 * Vectors: rawCrc32c("123456789", 0) = 0x58E3FA20; seed 100007 gives 0x3C9BD4E0.
 * @param data bytes to checksum
 * @param seed initial register value (0 for header digest and jump table, 100007 for blocks)
 * @returns the unsigned 32-bit register after `data`
 */
export function rawCrc32c(data: Uint8Array, seed: number): number {
  return ~crc32c(data as Buffer, ~seed >>> 0) >>> 0;
}

/** Seed of the per-block CRC that follows each compressed ZFile block. */
export const ZFILE_BLOCK_CRC_SEED = 100007;
