/**
 * The content API's host-side file operations (HostFiles) on a plain directory: every operation,
 * its errors, and that no path or symlink leads outside the volume. No mount needed here; the
 * same class runs on the ext4 host mount in test/api/volumes.test.ts.
 */
import { afterAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HostFiles, volumePath } from "../../src/volume/index.ts";
import { code, expectNoEscape, stream } from "./escape.ts";

const root = mkdtempSync(join(tmpdir(), "volfiles-"));
const outside = mkdtempSync(join(tmpdir(), "volfiles-out-"));
writeFileSync(join(outside, "secret"), "host secret");
afterAll(() => {
  rmSync(root, { recursive: true, force: true });
  rmSync(outside, { recursive: true, force: true });
});
const files = new HostFiles(root, false, { uid: 1000, gid: 1001, fileMode: 0o644, dirMode: 0o755 }, 10);

test("volume paths are canonical and never go above the root", () => {
  expect(volumePath("")).toBe("/");
  expect(volumePath("/")).toBe("/");
  expect(volumePath("a//b/./c/")).toBe("/a/b/c");
  expect(() => volumePath("/a/../../etc")).toThrow(expect.objectContaining({ code: "volume.bad_path" }));
  expect(() => volumePath("a\nb")).toThrow(expect.objectContaining({ code: "volume.bad_path" }));
});

test("make, write, read, stat, list, chmod/chown, remove", async () => {
  const d = await files.makeDir("/data", {});
  expect(d).toMatchObject({ name: "data", path: "/data", type: "directory", mode: 0o755, uid: 1000, gid: 1001 });
  expect(await code(files.makeDir("/data", {}))).toBe("volume.exists");
  expect((await files.makeDir("/data", { force: true })).path).toBe("/data");
  expect(await code(files.makeDir("/x/y/z", {}))).toBe("volume.path_not_found");
  expect((await files.makeDir("/x/y/z", { force: true, mode: 0o700 })).mode).toBe(0o700);

  const w = await files.writeFile("/data/a.txt", stream("hello volume"), {});
  expect(w).toMatchObject({ name: "a.txt", path: "/data/a.txt", type: "file", size: 12, mode: 0o644, uid: 1000, gid: 1001 });
  expect(readFileSync(join(root, "data/a.txt"), "utf8")).toBe("hello volume");
  // replace keeps nothing of the old file (a marker written just before it orders its mtime)
  writeFileSync(join(outside, "before-v2"), "");
  expect((await files.writeFile("/data/a.txt", stream("v2"), { mode: 0o600, uid: 0, gid: 0 }))).toMatchObject({ size: 2, mode: 0o600, uid: 0, gid: 0 });
  const r = await files.readFile("/data/a.txt");
  expect(r.size).toBe(2);
  expect(await new Response(r.stream).text()).toBe("v2");
  expect(await code(files.writeFile("/nodir/a.txt", stream("x"), {}))).toBe("volume.path_not_found");
  expect((await files.writeFile("/nodir/a.txt", null, { force: true })).size).toBe(0);
  expect(await code(files.writeFile("/data", stream("x"), {}))).toBe("volume.is_a_directory");
  expect(await code(files.readFile("/data"))).toBe("volume.is_a_directory");
  expect(await code(files.readFile("/data/none"))).toBe("volume.path_not_found");

  const st = await files.stat("/data/a.txt");
  writeFileSync(join(outside, "after-stat"), "");
  // the file's own mtime (ms), set by the replace: not before the marker, not after the next one
  expect(st.mtime).toBe(statSync(join(root, "data/a.txt")).mtimeMs);
  expect(st.mtime).toBeGreaterThanOrEqual(statSync(join(outside, "before-v2")).mtimeMs);
  expect(st.mtime).toBeLessThanOrEqual(statSync(join(outside, "after-stat")).mtimeMs);
  expect((await files.stat("/")).type).toBe("directory");
  expect(await code(files.stat("/nope"))).toBe("volume.path_not_found");
  expect((await files.list("/", 1)).map((e) => e.path)).toEqual(["/data", "/nodir", "/x"]);
  expect((await files.list("/", 3)).map((e) => e.path)).toEqual(["/data", "/data/a.txt", "/nodir", "/nodir/a.txt", "/x", "/x/y", "/x/y/z"]);
  expect(await code(files.list("/data/a.txt", 1))).toBe("volume.not_a_directory");
  for (let i = 0; i < 10; i++) writeFileSync(join(root, "data", `f${i}`), "");
  expect(await code(files.list("/data", 1))).toBe("volume.too_many_entries");

  expect(await files.setMetadata("/data/a.txt", { mode: 0o640 })).toMatchObject({ mode: 0o640, uid: 0, gid: 0 });
  expect(await files.setMetadata("/data/a.txt", { gid: 7 })).toMatchObject({ mode: 0o640, uid: 0, gid: 7 });
  await files.remove("/x");
  expect(await code(files.stat("/x/y"))).toBe("volume.path_not_found");
  expect(await code(files.remove("/"))).toBe("volume.bad_path");
  expect(await code(files.remove("/x"))).toBe("volume.path_not_found");
});

test("symlinks never lead outside: reading, writing, listing and making through them are refused", async () => {
  await expectNoEscape(files, root, outside, "host secret");
});

test("a read-only HostFiles refuses every change", async () => {
  mkdirSync(join(root, "ro"));
  const ro = new HostFiles(root, true, { uid: 0, gid: 0, fileMode: 0o644, dirMode: 0o755 }, 100);
  expect((await ro.stat("/ro")).type).toBe("directory");
  for (const p of [ro.makeDir("/ro/a", {}), ro.writeFile("/ro/a", null, {}), ro.remove("/ro"), ro.setMetadata("/ro", { mode: 0o700 })]) {
    expect(await code(p)).toBe("volume.read_only");
  }
});
