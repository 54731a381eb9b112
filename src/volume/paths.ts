/**
 * Volume-relative paths of the content API: parsing that keeps every operation inside its volume.
 */
import { VolumeError } from "./errors.ts";

/**
 * Canonical volume-relative path: "/" plus the non-empty segments of `p` ("", "/" and "." are the
 * root; "a/b", "/a//b/" are "/a/b").
 * @throws VolumeError `volume.bad_path` for a ".." segment, a NUL or a control character
 */
export function volumePath(p: string): string {
  if (/[\u0000-\u001f]/.test(p)) throw new VolumeError("volume.bad_path", `path ${JSON.stringify(p)} contains a control character`, { path: p });
  const parts = p.split("/").filter((s) => s !== "" && s !== ".");
  if (parts.includes("..")) throw new VolumeError("volume.bad_path", `path ${JSON.stringify(p)} may not contain ".."`, { path: p });
  return "/" + parts.join("/");
}
