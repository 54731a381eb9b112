/**
 * src/ffi/random.ts: RNDADDENTROPY + RNDRESEEDCRNG on the host's /dev/urandom (the tests run as
 * root, as envd does in a guest), the struct layout, and the exact errno of inputs that must fail.
 */
import { expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { encodeRandPoolInfo, MAX_ENTROPY_BYTES, RandomError, reseedKernelRandom, RNDADDENTROPY, RNDRESEEDCRNG } from "../../src/ffi/random.ts";
import { thrown } from "../helpers/thrown.ts";

test("ioctl numbers are _IOW('R', 3, int[2]) and _IO('R', 7)", () => {
  // _IOC(dir, type, nr, size) = dir << 30 | size << 16 | type << 8 | nr
  expect(RNDADDENTROPY).toBe((1 << 30) | (8 << 16) | (0x52 << 8) | 3);
  expect(RNDRESEEDCRNG).toBe((0x52 << 8) | 7);
});

test("struct rand_pool_info: entropy bits, byte count, then the bytes", () => {
  const b = encodeRandPoolInfo(new Uint8Array([1, 2, 3, 4, 5]));
  expect(b.length).toBe(13);
  const v = new DataView(b.buffer);
  expect([v.getInt32(0, true), v.getInt32(4, true)]).toEqual([40, 5]);
  expect([...b.subarray(8)]).toEqual([1, 2, 3, 4, 5]);
});

test("the host's generator takes 64 credited bytes and reseeds", () => {
  expect(process.getuid?.()).toBe(0);
  reseedKernelRandom(randomBytes(64));
  // and once more: a reseed right after a reseed is fine
  reseedKernelRandom(randomBytes(MAX_ENTROPY_BYTES));
});

test("a file that is not a random device: ENOTTY from RNDADDENTROPY; a missing one: ENOENT from open", () => {
  const e = thrown(() => reseedKernelRandom(randomBytes(32), "/dev/null"));
  expect(e).toBeInstanceOf(RandomError);
  expect((e as RandomError).details).toEqual({ call: "RNDADDENTROPY", errno: 25 });
  const m = thrown(() => reseedKernelRandom(randomBytes(32), "/nonexistent-random"));
  expect((m as RandomError).details).toEqual({ call: "open", errno: 2 });
});

test("empty and oversized buffers are refused before any call", () => {
  expect(thrown(() => reseedKernelRandom(new Uint8Array(0)))).toBeInstanceOf(RangeError);
  expect(thrown(() => reseedKernelRandom(new Uint8Array(MAX_ENTROPY_BYTES + 1)))).toBeInstanceOf(RangeError);
});
