/**
 * Extended attributes through libc via bun:ffi: lsetxattr/lgetxattr/llistxattr/lremovexattr
 * (never following symlinks). Sources: xattr(7), setxattr(2), listxattr(2).
 */
import { ptr } from "bun:ffi";
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errno, libc } from "./libc.ts";

/** Thrown when an xattr call fails; `details.errno` holds the C errno. */
export class XattrError extends AgentEnvError<FfiCodes<"xattr">> {}

// asm-generic/errno-base.h, errno.h
export const ENOENT = 2;
export const ERANGE = 34;
export const ENODATA = 61;
export const ENOTSUP = 95;

/** Largest value this module reads, bytes (XATTR_SIZE_MAX in include/uapi/linux/limits.h). */
const XATTR_SIZE_MAX = 65536;
/** Largest name list this module reads, bytes (XATTR_LIST_MAX). */
const XATTR_LIST_MAX = 65536;



function cstr(s: string): Buffer {
  return Buffer.from(`${s}\0`);
}

function fail(op: string, path: string, name?: string): never {
  const e = errno();
  const code = e === ENOTSUP ? "xattr.unsupported" : e === ENOENT ? "xattr.not_found" : "xattr.failed";
  throw new XattrError(code, `${op}(${path}${name ? `, ${name}` : ""}) failed`, { errno: e, path, name });
}

/**
 * Names of all extended attributes of `path`.
 * @throws XattrError `xattr.unsupported`, `xattr.not_found`, `xattr.failed`.
 */
export function listXattrs(path: string): string[] {
  const p = cstr(path);
  const buf = Buffer.alloc(XATTR_LIST_MAX);
  const n = Number(libc().llistxattr(ptr(p), ptr(buf), buf.length));
  if (n < 0) fail("llistxattr", path);
  return buf
    .subarray(0, n)
    .toString("utf8")
    .split("\0")
    .filter((s) => s.length > 0);
}

/**
 * Value of one attribute as UTF-8, or undefined when it is not set.
 * @throws XattrError as listXattrs.
 */
export function getXattr(path: string, name: string): string | undefined {
  const buf = Buffer.alloc(XATTR_SIZE_MAX);
  const n = Number(libc().lgetxattr(ptr(cstr(path)), ptr(cstr(name)), ptr(buf), buf.length));
  if (n < 0) {
    if (errno() === ENODATA) return undefined;
    fail("lgetxattr", path, name);
  }
  return buf.subarray(0, n).toString("utf8");
}

/**
 * Set one attribute (create or replace).
 * @throws XattrError as listXattrs.
 */
export function setXattr(path: string, name: string, value: string): void {
  const v = Buffer.from(value, "utf8");
  // ptr() of an empty buffer is invalid; pass a 1-byte buffer with size 0
  const data = v.length ? v : Buffer.alloc(1);
  if (libc().lsetxattr(ptr(cstr(path)), ptr(cstr(name)), ptr(data), v.length, 0) !== 0) fail("lsetxattr", path, name);
}

/** Remove one attribute; a missing one is not an error. */
export function removeXattr(path: string, name: string): void {
  if (libc().lremovexattr(ptr(cstr(path)), ptr(cstr(name))) !== 0 && errno() !== ENODATA) fail("lremovexattr", path, name);
}
