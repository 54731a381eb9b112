import { expect, test } from "bun:test";
import { asError, errorCode, errorMessage } from "../../src/util/error.ts";

test("errorMessage reads Errors, strings, objects and values without JSON", () => {
  expect(errorMessage(new TypeError("bad type"))).toBe("bad type");
  expect(errorMessage("plain")).toBe("plain");
  expect(errorMessage({ a: 1 })).toBe('{"a":1}');
  expect(errorMessage(undefined)).toBe("undefined");
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  expect(errorMessage(cyclic)).toBe("[object Object]");
});

test("asError keeps an Error and wraps anything else with it as cause", () => {
  const e = new RangeError("r");
  expect(asError(e)).toBe(e);
  const wrapped = asError(42);
  expect(wrapped).toBeInstanceOf(Error);
  expect(wrapped.message).toBe("42");
  expect(wrapped.cause).toBe(42);
});

test("errorCode reads string codes only", () => {
  expect(errorCode(Object.assign(new Error("x"), { code: "ENOENT" }))).toBe("ENOENT");
  expect(errorCode({ code: 5 })).toBeUndefined();
  expect(errorCode(null)).toBeUndefined();
  expect(errorCode("ENOENT")).toBeUndefined();
});
