/**
 * The symlink-escape checks every `VolumeFiles` implementation must pass (host mount and guest
 * envd alike): a volume at `root` holds links to `outside/`, whose `secret` file says `secret`.
 */
import { expect } from "bun:test";
import { lstatSync, readFileSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { VolumeError, type VolumeFiles } from "../../src/volume/index.ts";

/** The error code a promise rejects with ("ok" when it resolves). */
export const code = async (p: Promise<unknown>) => p.then(() => "ok", (e) => (e instanceof VolumeError ? e.code : `other: ${e}`));
/** A body stream of `s`. */
export const stream = (s: string | Uint8Array) => new Response(s).body!;

/** Links in the volume never lead an operation outside it; the links themselves are entries. */
export async function expectNoEscape(files: VolumeFiles, root: string, outside: string, secret: string): Promise<void> {
  symlinkSync(outside, join(root, "out"));
  symlinkSync(join(outside, "secret"), join(root, "secret-link"));
  const attempts: [string, () => Promise<unknown>][] = [
    ["read through a dir link", () => files.readFile("/out/secret")],
    ["read a file link", () => files.readFile("/secret-link")],
    ["write through a dir link", () => files.writeFile("/out/new", stream("x"), {})],
    ["mkdir through a dir link", () => files.makeDir("/out/d", {})],
    ["mkdir -p through a dir link", () => files.makeDir("/out/d/e", { force: true })],
    ["stat through a dir link", () => files.stat("/out/secret")],
    ["remove through a dir link", () => files.remove("/out/secret")],
    ["dotdot", () => files.stat("/../outside/secret")],
  ];
  for (const [what, attempt] of attempts) expect([what, await code(attempt())]).toEqual([what, "volume.bad_path"]);
  // the link itself is an entry of the volume: stat shows it, chmod skips it, a write replaces it
  expect(await files.stat("/secret-link")).toMatchObject({ type: "symlink", target: join(outside, "secret") });
  await files.setMetadata("/secret-link", { mode: 0o600 });
  expect(lstatSync(join(outside, "secret")).mode & 0o777).not.toBe(0o600);
  await files.writeFile("/secret-link", stream("mine"), {});
  expect(readFileSync(join(outside, "secret"), "utf8")).toBe(secret);
  expect(lstatSync(join(root, "secret-link")).isFile()).toBe(true);
  await files.remove("/out");
  expect(readFileSync(join(outside, "secret"), "utf8")).toBe(secret);
}
