// The queue thread's guard against requests past the device end (src/storage/ublk/queue.ts
// `rangeCheck`, which `runQueue` applies to every descriptor before serving it). The kernel's
// block layer clips requests at the capacity it was given, so the guest VM test cannot reach this
// guard; here it is driven with the descriptor values directly.
import { describe, expect, test } from "bun:test";
import { UBLK_IO_OP } from "../../../src/ffi/ublk.ts";
import { rangeCheck } from "../../../src/storage/ublk/queue.ts";

const MiB = 1024 * 1024;
const SIZE = 32 * MiB;
const EIO = 5;

describe("rangeCheck: requests past the device end", () => {
  test("requests inside the device pass, up to its last byte", () => {
    for (const op of [UBLK_IO_OP.READ, UBLK_IO_OP.WRITE, UBLK_IO_OP.DISCARD, UBLK_IO_OP.WRITE_ZEROES]) {
      expect(rangeCheck(op, 0, 4096, SIZE)).toBe(0);
      expect(rangeCheck(op, SIZE - 512, 512, SIZE)).toBe(0); // the last sector
      expect(rangeCheck(op, 0, SIZE, SIZE)).toBe(0); // the whole device
      expect(rangeCheck(op, SIZE, 0, SIZE)).toBe(0); // empty, at the end
    }
  });

  test("a request reaching one sector past the end, starting past it, or far beyond it, is an I/O error", () => {
    for (const op of [UBLK_IO_OP.READ, UBLK_IO_OP.WRITE, UBLK_IO_OP.DISCARD, UBLK_IO_OP.WRITE_ZEROES]) {
      expect(rangeCheck(op, SIZE - 512, 1024, SIZE)).toBe(-EIO); // straddles the end by one sector
      expect(rangeCheck(op, SIZE, 512, SIZE)).toBe(-EIO); // starts at the end
      expect(rangeCheck(op, SIZE + 4096, 4096, SIZE)).toBe(-EIO);
      // start_sector is a u64: a huge value (above 2^32 sectors) is still caught
      expect(rangeCheck(op, 2 ** 32 * 512, 512, SIZE)).toBe(-EIO);
      expect(rangeCheck(op, 0, SIZE + 512, SIZE)).toBe(-EIO);
    }
  });

  test("a FLUSH carries no range and always passes; a device of size 0 refuses every ranged request", () => {
    expect(rangeCheck(UBLK_IO_OP.FLUSH, 0, 0, SIZE)).toBe(0);
    expect(rangeCheck(UBLK_IO_OP.FLUSH, SIZE + 4096, 4096, SIZE)).toBe(0);
    expect(rangeCheck(UBLK_IO_OP.READ, 0, 512, 0)).toBe(-EIO);
    expect(rangeCheck(UBLK_IO_OP.FLUSH, 0, 0, 0)).toBe(0);
  });
});
