/**
 * Image pulls against Debian's docker-registry on 127.0.0.1 with images this test makes: a gzip
 * layer, then a zstd layer holding a whiteout and an opaque directory; pulled with skopeo,
 * unpacked with umoci, made an ext4 overlaybd layer whose files (read back with debugfs) show
 * the whiteouts applied, owners kept and the guest bits added; the second pull fetches only the
 * manifest. A manifest list whose arm64 entry (listed first) is another image resolves to the
 * linux/amd64 one. Unknown tags, a registry that wants
 * credentials, and a blob whose bytes do not match its digest fail with typed errors and leave
 * nothing in the cache.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { chownSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createHash } from "node:crypto";
import { GUEST_BITS_KEY, plainRegistrySettings, pullImage, type PullOptions } from "../../src/image/index.ts";
import { openStack } from "../../src/storage/overlaybd/index.ts";
import { pushImage, pushIndex, registryBlobPath, startRegistry, type TestRegistry } from "./registry.ts";
import { waitFor } from "../helpers/wait.ts";

let reg: TestRegistry;
let authReg: TestRegistry;
let tokenReg: TestRegistry;
let work: string;
let pushed: { digest: string; compressedBytes: number; dir: string };
let arm: { digest: string; compressedBytes: number; dir: string };
const creds = { username: "alice", password: "s3cret" };

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), "aenv-pull-"));
  reg = await startRegistry();
  authReg = await startRegistry({ auth: creds });
  tokenReg = await startRegistry({ auth: creds, token: true });
  // layer 1 (gzip): files, a directory with two files, a file owned by 1234:1234, a symlink
  const l1 = join(work, "l1");
  mkdirSync(join(l1, "etc"), { recursive: true });
  mkdirSync(join(l1, "data/old"), { recursive: true });
  mkdirSync(join(l1, "bin"), { recursive: true });
  writeFileSync(join(l1, "etc/hello"), "hello from layer 1\n");
  writeFileSync(join(l1, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n");
  writeFileSync(join(l1, "etc/gone"), "deleted by layer 2\n");
  writeFileSync(join(l1, "data/old/a"), "a\n");
  writeFileSync(join(l1, "data/owned"), "owned\n");
  chownSync(join(l1, "data/owned"), 1234, 1234);
  symlinkSync("/etc/hello", join(l1, "bin/hello-link"));
  writeFileSync(join(l1, "bin/sh"), "not a real shell\n", { mode: 0o755 });
  // layer 2 (zstd): whiteout of /etc/gone, /data/old made opaque with new content
  const l2 = join(work, "l2");
  mkdirSync(join(l2, "etc"), { recursive: true });
  mkdirSync(join(l2, "data/old"), { recursive: true });
  writeFileSync(join(l2, "etc/.wh.gone"), "");
  writeFileSync(join(l2, "data/old/.wh..wh..opq"), "");
  writeFileSync(join(l2, "data/old/b"), "b from layer 2\n");
  pushed = await pushImage(reg.host, "test/tiny:v1", [{ dir: l1, compression: "gzip" }, { dir: l2, compression: "zstd" }], { Env: ["PATH=/usr/bin:/bin", "GREETING=hi"], WorkingDir: "/data" });
  // an arm64 image of its own (another file, another size) for the manifest list's arm64 entry
  const la = join(work, "la");
  mkdirSync(join(la, "etc"), { recursive: true });
  writeFileSync(join(la, "etc/hello"), "hello from the arm64 image\n");
  writeFileSync(join(la, "etc/arch"), "arm64\n" + "a".repeat(50_000));
  arm = await pushImage(reg.host, "test/arm-only:v1", [{ dir: la, compression: "gzip" }], { architecture: "arm64" });
  await pushIndex(reg.host, "test/multi:v1", pushed.dir, arm.dir);
  for (const r of [authReg, tokenReg]) rmSync((await pushImage(r.host, "private/tiny:v1", [{ dir: l1, compression: "gzip" }], {}, creds)).dir, { recursive: true, force: true });
}, 60_000);

afterAll(async () => {
  await reg?.stop();
  await authReg?.stop();
  await tokenReg?.stop();
  rmSync(work, { recursive: true, force: true });
  if (pushed) rmSync(pushed.dir, { recursive: true, force: true });
  if (arm) rmSync(arm.dir, { recursive: true, force: true });
});

function opts(home: string, ref: string, extra: Partial<PullOptions> = {}): PullOptions {
  return {
    homePath: home,
    ref,
    registries: plainRegistrySettings(),
    headroomMiB: 16,
    minDiskMiB: 32,
    toolTimeoutMs: 120_000,
    manifestTimeoutMs: 30_000,
    ...extra,
  };
}

/** Write the layer's data into a sparse raw file, for debugfs. */
async function toRaw(layer: string, out: string): Promise<void> {
  const img = await openStack({ lowers: [layer] });
  try {
    const f = Bun.file(out).writer();
    await f.end();
    const fd = require("node:fs").openSync(out, "r+");
    require("node:fs").ftruncateSync(fd, img.size);
    for (const [a, b] of img.dataRanges(0, img.size)) {
      const buf = new Uint8Array(b - a);
      await img.pread(buf, a);
      require("node:fs").writeSync(fd, buf, 0, buf.length, a);
    }
    require("node:fs").closeSync(fd);
  } finally {
    await img.close();
  }
}

const debugfs = (raw: string, req: string) => Bun.spawnSync(["debugfs", "-R", req, raw], { stdout: "pipe", stderr: "pipe" }).stdout.toString();

test("pull: gzip + zstd layers, whiteout and opaque dir applied, owners kept, guest bits added; cached by digest", async () => {
  const home = join(work, "home1");
  const lines: string[] = [];
  const p = await pullImage(opts(home, `${reg.host}/test/tiny:v1`, { onProgress: (l) => lines.push(l) }));
  expect(p.digest).toBe(pushed.digest);
  // the cache (and the builder's base) key covers how the node converts images, not only the digest
  expect(p.key).toBe(createHash("sha256").update(`${pushed.digest}\0${GUEST_BITS_KEY}`).digest("hex").slice(0, 32));
  expect(GUEST_BITS_KEY).toBe("guest-bits-v3-confined");
  expect(p.pulled).toBe(true);
  expect(p.compressedBytes).toBe(pushed.compressedBytes);
  expect(p.config.env).toEqual({ PATH: "/usr/bin:/bin", GREETING: "hi" });
  expect(p.config.workdir).toBe("/data");
  expect(p.diskBytes).toBe(32 * 1048576);
  expect(existsSync(p.layerPath)).toBe(true);
  expect(lines.some((l) => l.startsWith("pulling "))).toBe(true);
  // skopeo's own per-blob lines (stdout) are the pull's progress
  expect(lines.filter((l) => l.startsWith("Copying blob ")).length).toBe(2);
  const raw = join(work, "tiny.raw");
  await toRaw(p.layerPath, raw);
  expect(debugfs(raw, "cat /etc/hello")).toBe("hello from layer 1\n");
  expect(debugfs(raw, "ls /etc")).not.toContain("gone");
  const old = debugfs(raw, "ls /data/old");
  expect(old).toContain("b");
  expect(old).not.toMatch(/\ba\b/);
  expect(debugfs(raw, "cat /data/old/b")).toBe("b from layer 2\n");
  expect(debugfs(raw, "stat /data/owned")).toMatch(/User:\s+1234\s+Group:\s+1234/);
  expect(debugfs(raw, "stat /bin/hello-link")).toContain('Fast link dest: "/etc/hello"');
  // no init and no envd in the image: VMs boot through the tools drive, mounted at /.aenv
  expect(debugfs(raw, "stat /.aenv")).toContain("Type: directory");
  expect(debugfs(raw, "stat /usr/local/bin/agentenv")).toBe(""); // debugfs: "File not found" on stderr
  expect(debugfs(raw, "cat /etc/passwd")).toBe("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n");
  expect(debugfs(raw, "stat /home/user")).toMatch(/User:\s+1000\s+Group:\s+1000/);
  expect(debugfs(raw, "cat /bin/bash")).toContain('exec /bin/sh "$@"'); // no bash in the image
  expect(Bun.spawnSync(["e2fsck", "-fn", raw], { stdout: "pipe", stderr: "pipe" }).exitCode).toBe(0);

  // second pull: the manifest only, same layer
  const again = await pullImage(opts(home, `${reg.host}/test/tiny:v1`));
  expect(again.pulled).toBe(false);
  expect(again.layerPath).toBe(p.layerPath);
  expect(readdirSync(join(home, "images")).sort()).toEqual([p.layerPath.split("/").pop()!, p.layerPath.split("/").pop()!.replace(".layer", ".json")].sort());
  // the record dropped (cache trimmed) while builds still stack on the layer: a new pull converts
  // beside it, never over it
  const ino = statSync(p.layerPath).ino;
  rmSync(p.layerPath.replace(/\.layer$/, ".json"));
  const third = await pullImage(opts(home, `${reg.host}/test/tiny:v1`));
  expect(third.pulled).toBe(true);
  expect(third.layerPath).not.toBe(p.layerPath);
  expect(statSync(p.layerPath).ino).toBe(ino);
  expect((await pullImage(opts(home, `${reg.host}/test/tiny:v1`))).layerPath).toBe(third.layerPath);
}, 120_000);

test("a manifest list resolves to its linux/amd64 image, not the arm64 entry listed before it", async () => {
  expect(arm.compressedBytes).not.toBe(pushed.compressedBytes);
  const p = await pullImage(opts(join(work, "home2"), `${reg.host}/test/multi:v1`));
  expect(p.pulled).toBe(true);
  expect(p.digest).not.toBe(pushed.digest); // the list's own digest is the cache key
  expect(p.digest).not.toBe(arm.digest);
  expect(p.compressedBytes).toBe(pushed.compressedBytes);
  // the files are the amd64 image's: its config (env, workdir) and its layers, whiteouts applied
  expect(p.config.env).toEqual({ PATH: "/usr/bin:/bin", GREETING: "hi" });
  const raw = join(work, "multi.raw");
  await toRaw(p.layerPath, raw);
  expect(debugfs(raw, "cat /etc/hello")).toBe("hello from layer 1\n");
  expect(debugfs(raw, "stat /etc/arch")).toBe(""); // only the arm64 image has it
  expect(debugfs(raw, "cat /data/old/b")).toBe("b from layer 2\n");
}, 120_000);

test("basic auth: refused without credentials (image.auth), pulled with them", async () => {
  const home = join(work, "home3");
  await expect(pullImage(opts(home, `${authReg.host}/private/tiny:v1`))).rejects.toMatchObject({ code: "image.auth" });
  const p = await pullImage(opts(home, `${authReg.host}/private/tiny:v1`, { credentials: creds }));
  expect(p.pulled).toBe(true);
}, 120_000);

test("token auth: refused without credentials (image.auth), pulled with a token fetched with them", async () => {
  const home = join(work, "home6");
  await expect(pullImage(opts(home, `${tokenReg.host}/private/tiny:v1`))).rejects.toMatchObject({ code: "image.auth" });
  const before = tokenReg.tokenRequests;
  const p = await pullImage(opts(home, `${tokenReg.host}/private/tiny:v1`, { credentials: creds }));
  expect(p.pulled).toBe(true);
  expect(tokenReg.tokenRequests).toBeGreaterThan(before);
  await expect(pullImage(opts(join(work, "home7"), `${tokenReg.host}/private/tiny:v1`, { credentials: { username: "alice", password: "wrong" } }))).rejects.toMatchObject({ code: "image.auth" });
}, 120_000);

test("unknown tag and repository: image.not_found; nothing left in the cache", async () => {
  const home = join(work, "home4");
  await expect(pullImage(opts(home, `${reg.host}/test/tiny:nope`))).rejects.toMatchObject({ code: "image.not_found" });
  await expect(pullImage(opts(home, `${reg.host}/no/such:v1`))).rejects.toMatchObject({ code: "image.not_found" });
  expect(readdirSync(join(home, "images"))).toEqual([]);
}, 60_000);

test("a blob whose bytes do not match its digest: image.digest_mismatch, nothing cached", async () => {
  const l = join(work, "lc");
  mkdirSync(l, { recursive: true });
  writeFileSync(join(l, "file"), "x".repeat(100_000));
  const img = await pushImage(reg.host, "test/corrupt:v1", [{ dir: l, compression: "gzip" }]);
  const m = JSON.parse(require("node:fs").readFileSync(join(img.dir, "manifest.json"), "utf8")) as { layers: { digest: string }[] };
  const blob = registryBlobPath(reg, m.layers[0]!.digest);
  const bytes = new Uint8Array(await Bun.file(blob).arrayBuffer());
  bytes[bytes.length - 20] ^= 0xff; // same size, different bytes
  writeFileSync(blob, bytes);
  rmSync(img.dir, { recursive: true, force: true });
  const home = join(work, "home5");
  await expect(pullImage(opts(home, `${reg.host}/test/corrupt:v1`))).rejects.toMatchObject({ code: "image.digest_mismatch" });
  expect(readdirSync(join(home, "images"))).toEqual([]);
}, 60_000);

test("an image whose links point at host paths (etc, bin, home) pulls without touching the host: the bits go inside the image", async () => {
  const victim = join(work, "victim");
  mkdirSync(join(victim, "etc"), { recursive: true });
  mkdirSync(join(victim, "bin"), { recursive: true });
  writeFileSync(join(victim, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n");
  writeFileSync(join(victim, "etc/resolv.conf"), "nameserver 192.0.2.1\n");
  const l = join(work, "evil");
  mkdirSync(l, { recursive: true });
  symlinkSync(join(victim, "etc"), join(l, "etc"));
  symlinkSync(join(victim, "bin"), join(l, "bin"));
  symlinkSync(victim, join(l, "home"));
  const img = await pushImage(reg.host, "test/evil:v1", [{ dir: l, compression: "gzip" }]);
  rmSync(img.dir, { recursive: true, force: true });
  const listing = () => Bun.spawnSync(["sh", "-c", `cd ${victim} && find . -printf '%p %m %u:%g %s\\n' | sort && cat etc/passwd etc/resolv.conf`], { stdout: "pipe" }).stdout.toString();
  const before = listing();
  const p = await pullImage(opts(join(work, "home8"), `${reg.host}/test/evil:v1`));
  expect(listing()).toBe(before);
  const raw = join(work, "evil.raw");
  await toRaw(p.layerPath, raw);
  expect(debugfs(raw, "stat /etc")).toContain(`Fast link dest: "${join(victim, "etc")}"`);
  // the guest follows /etc -> <victim>/etc inside its own root: the account is there
  expect(debugfs(raw, `cat ${join(victim, "etc/passwd")}`)).toBe("user:x:1000:1000::/home/user:/bin/bash\n");
  expect(debugfs(raw, `stat ${join(victim, "bin/sh")}`)).toContain('Fast link dest: "/.aenv/bin/busybox"');
  expect(debugfs(raw, `stat ${join(victim, "user")}`)).toMatch(/User:\s+1000\s+Group:\s+1000/);
}, 120_000);

test("a registry that accepts and never answers: image.timeout after manifest_timeout_ms; the credentials were never on skopeo's command line", async () => {
  const silent = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const home = join(work, "home9");
  try {
    const secret = "hunter2-never-in-argv";
    const pull = pullImage(opts(home, `127.0.0.1:${silent.port}/test/hang:v1`, { credentials: { username: "bob", password: secret }, manifestTimeoutMs: 3000 }));
    const outcome = pull.then(
      () => null,
      (e) => e,
    );
    // the running skopeo: its arguments name an auth file (0600, in the pull's private dir), not the password
    const cmdline = await waitFor("the running skopeo", () => {
      const pid = Bun.spawnSync(["pgrep", "-f", `skopeo inspect .*127.0.0.1:${silent.port}/`], { stdout: "pipe" }).stdout.toString().trim().split("\n")[0];
      return pid && require("node:fs").readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ");
    });
    expect(cmdline).toContain("--authfile ");
    expect(cmdline).not.toContain(secret);
    const authFile = /--authfile (\S+)/.exec(cmdline)![1]!;
    expect(require("node:fs").statSync(authFile).mode & 0o777).toBe(0o600);
    const e = await outcome;
    expect(e).toMatchObject({ code: "image.timeout", details: { timeoutMs: 3000 } });
    expect((e as Error).message).toContain(`asking registry 127.0.0.1:${silent.port} for the manifest`);
    // nothing left: no work dir, no auth file
    expect(readdirSync(join(home, "images"))).toEqual([]);
    expect(existsSync(authFile)).toBe(false);
  } finally {
    silent.stop(true);
  }
}, 60_000);
