/**
 * The node's guest-side tools against a real envd (run on this host instead of in a VM, which
 * changes nothing for them: envd executes the same shell scripts and serves the same /files):
 * runInGuest (Connect streaming from the node), and GuestVolumeFiles — every content API
 * operation on a "mounted volume" directory, its errors, and that symlinks never lead outside.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { GuestVolumeFiles, parseFindEntries } from "../../src/sandbox/guest-volume-files.ts";
import { execInGuest } from "../../src/sandbox/guest-exec.ts";
import { code, expectNoEscape, stream } from "../volume/escape.ts";
import { initEnvd, startEnvdChild, type EnvdChild } from "../envd/harness.ts";

const TOKEN = "guest-files-token-0123456789";
let envd: EnvdChild;
const dir = mkdtempSync("/tmp/gvf-");
const mount = join(dir, "mnt");
const outside = join(dir, "outside");
let files: GuestVolumeFiles;

beforeAll(async () => {
  mkdirSync(mount);
  mkdirSync(outside);
  writeFileSync(join(outside, "secret"), "guest secret");
  envd = await startEnvdChild();
  expect((await initEnvd(envd.url, { accessToken: TOKEN, defaultUser: "root" })).status).toBe(204);
  files = new GuestVolumeFiles(envd.url, TOKEN, mount, { uid: 1000, gid: 1000, fileMode: 0o644, dirMode: 0o755 }, 8, 20_000);
});
afterAll(async () => {
  await envd?.stop();
  rmSync(dir, { recursive: true, force: true });
});


test("execInGuest: exit code, stdout and stderr apart (UTF-8 split across events), a refused token", async () => {
  const r = await execInGuest(envd.url, TOKEN, "/bin/sh", ["-c", "printf 'é%.0s' $(seq 1 30000); echo; echo err >&2; exit 7"], 20_000, 1 << 20);
  expect(r.exitCode).toBe(7);
  expect(r.stdout).toBe("é".repeat(30000) + "\n");
  expect(r.stderr).toBe("err\n");
  const cut = await execInGuest(envd.url, TOKEN, "/bin/sh", ["-c", "seq 1 100000"], 20_000, 100);
  expect(cut.stdout).toBe(Array.from({ length: 40 }, (_, i) => `${i + 1}\n`).join("").slice(0, 100));
  const killed = await execInGuest(envd.url, TOKEN, "/bin/sh", ["-c", "kill -9 $$"], 20_000);
  expect(killed.exitCode).toBe(-1);
  await expect(execInGuest(envd.url, "wrong", "true", [], 5000)).rejects.toMatchObject({ code: "orchestrator.envd_failed" });
});

test("find -printf output parses into volume-relative entries", () => {
  const out = ["f", "644", "1000", "1000", "5", "1700000000.5", "1700000001", "1700000002", `${mount}//a b.txt`, ""].join("\0") + "\0" + ["l", "777", "0", "0", "3", "1", "1", "1", `${mount}/ln`, "../x"].join("\0") + "\0";
  expect(parseFindEntries(out, mount)).toEqual([
    { name: "a b.txt", path: "/a b.txt", type: "file", size: 5, mode: 0o644, uid: 1000, gid: 1000, atime: 1700000000500, mtime: 1700000001000, ctime: 1700000002000 },
    { name: "ln", path: "/ln", type: "symlink", size: 3, mode: 0o777, uid: 0, gid: 0, atime: 1000, mtime: 1000, ctime: 1000, target: "../x" },
  ]);
});

test("every operation through envd: make, write (streamed, replaced), read, stat, list, metadata, remove", async () => {
  expect(await files.makeDir("/data", {})).toMatchObject({ name: "data", path: "/data", type: "directory", mode: 0o755, uid: 1000, gid: 1000 });
  expect(await code(files.makeDir("/data", {}))).toBe("volume.exists");
  expect((await files.makeDir("/data", { force: true, mode: 0o700 })).mode).toBe(0o700);
  expect(await code(files.makeDir("/p/q", {}))).toBe("volume.path_not_found");
  expect((await files.makeDir("/p/q", { force: true })).path).toBe("/p/q");

  const big = new Uint8Array(3 << 20).map((_, i) => (i * 31) & 0xff);
  expect(await files.writeFile("/data/big.bin", stream(big), {})).toMatchObject({ type: "file", size: big.length, uid: 1000, gid: 1000, mode: 0o644 });
  const r = await files.readFile("/data/big.bin");
  expect(r.size).toBe(big.length);
  expect(Buffer.compare(Buffer.from(await new Response(r.stream).arrayBuffer()), Buffer.from(big))).toBe(0);
  expect(await files.writeFile("/data/big.bin", stream("small"), { mode: 0o600, uid: 0, gid: 0 })).toMatchObject({ size: 5, mode: 0o600, uid: 0, gid: 0 });
  expect(readFileSync(join(mount, "data/big.bin"), "utf8")).toBe("small");
  expect(await code(files.writeFile("/nodir/x", stream("x"), {}))).toBe("volume.path_not_found");
  expect((await files.writeFile("/nodir/x", null, { force: true })).size).toBe(0);
  expect(await code(files.writeFile("/data", stream("x"), {}))).toBe("volume.is_a_directory");
  expect(await code(files.readFile("/data"))).toBe("volume.is_a_directory");
  expect(await code(files.readFile("/none"))).toBe("volume.path_not_found");

  expect((await files.stat("/")).type).toBe("directory");
  expect(await files.stat("/data/big.bin")).toMatchObject({ name: "big.bin", path: "/data/big.bin", size: 5 });
  expect(await code(files.stat("/none"))).toBe("volume.path_not_found");
  expect((await files.list("/", 1)).map((e) => e.path)).toEqual(["/data", "/nodir", "/p"]);
  expect((await files.list("/", 5)).map((e) => e.path)).toEqual(["/data", "/data/big.bin", "/nodir", "/nodir/x", "/p", "/p/q"]);
  expect(await code(files.list("/data/big.bin", 1))).toBe("volume.not_a_directory");
  for (let i = 0; i < 9; i++) writeFileSync(join(mount, "p", `f${i}`), "");
  expect(await code(files.list("/p", 1))).toBe("volume.too_many_entries");

  expect(await files.setMetadata("/data/big.bin", { mode: 0o640, uid: 1000 })).toMatchObject({ mode: 0o640, uid: 1000, gid: 0 });
  expect(await files.setMetadata("/data/big.bin", { gid: 1000 })).toMatchObject({ uid: 1000, gid: 1000 });
  await files.remove("/p");
  expect(await code(files.stat("/p/q"))).toBe("volume.path_not_found");
  expect(await code(files.remove("/"))).toBe("volume.bad_path");
  expect(await code(files.remove("/p"))).toBe("volume.path_not_found");
  // no upload leftovers beside the files
  expect((await files.list("/", 1)).some((e) => e.name.startsWith(".aenv-upload"))).toBe(false);
});

test("symlinks in the volume never lead the node outside it", async () => {
  await expectNoEscape(files, mount, outside, "guest secret");
});
