/**
 * Confined edits of an unpacked image root (src/image/rootfs.ts) and the guest bits a pull adds
 * through them: an image's absolute and relative links that point out of the tree, link loops,
 * device nodes where a file belongs — none of them makes the node read, write, chmod or delete a
 * host file; links inside the tree resolve as the guest sees them (merged /usr).
 */
import { afterAll, beforeEach, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { installGuestBits } from "../../src/image/index.ts";
import { RootTree } from "../../src/image/rootfs.ts";

const work = mkdtempSync(join(tmpdir(), "aenv-rootfs-"));
let root: string;
let victim: string;
let n = 0;

afterAll(() => rmSync(work, { recursive: true, force: true }));

beforeEach(() => {
  n++;
  root = join(work, `root${n}`);
  victim = join(work, `victim${n}`);
  mkdirSync(root);
  // what a host has and an image must never change
  mkdirSync(join(victim, "etc/sudoers.d"), { recursive: true });
  mkdirSync(join(victim, "usr/lib"), { recursive: true });
  mkdirSync(join(victim, "bin"), { recursive: true });
  mkdirSync(join(victim, "home"), { recursive: true });
  writeFileSync(join(victim, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n");
  writeFileSync(join(victim, "etc/group"), "root:x:0:\n");
  writeFileSync(join(victim, "etc/shadow"), "root:*:19000:0:99999:7:::\n", { mode: 0o640 });
  writeFileSync(join(victim, "etc/resolv.conf"), "nameserver 192.0.2.1\n");
  writeFileSync(join(victim, "usr/lib/libimportant.so"), "ELF");
});

/** Every entry under `dir` with its type, mode, owner and content (links: their target). */
function snapshot(dir: string): string {
  const out: string[] = [];
  const walk = (p: string) => {
    const st = lstatSync(p);
    const what = st.isSymbolicLink() ? `-> ${readlinkSync(p)}` : st.isFile() ? createHash("sha256").update(readFileSync(p)).digest("hex") : st.isDirectory() ? "dir" : "other";
    out.push(`${relative(dir, p) || "."} ${st.mode.toString(8)} ${st.uid}:${st.gid} ${what}`);
    if (st.isDirectory()) for (const e of readdirSync(p).sort()) walk(join(p, e));
  };
  walk(dir);
  return out.join("\n");
}

test("absolute links out of the image (etc, bin, home, .aenv) resolve inside it: the host's files are untouched", () => {
  symlinkSync(join(victim, "etc"), join(root, "etc"));
  symlinkSync(join(victim, "bin"), join(root, "bin"));
  symlinkSync(victim, join(root, "home"));
  symlinkSync(join(victim, "usr"), join(root, ".aenv"));
  const before = snapshot(victim);
  installGuestBits(root);
  expect(snapshot(victim)).toBe(before);
  // the guest follows /etc -> <victim>/etc inside its own root: that is where the files went
  const inner = join(root, victim);
  expect(readFileSync(join(inner, "etc/passwd"), "utf8")).toBe("user:x:1000:1000::/home/user:/bin/bash\n");
  expect(readFileSync(join(inner, "etc/group"), "utf8")).toBe("user:x:1000:\n");
  expect(readlinkSync(join(inner, "bin/sh"))).toBe("/.aenv/bin/busybox");
  expect(lstatSync(join(inner, "user")).uid).toBe(1000); // home -> <victim>
  expect(lstatSync(join(inner, "usr")).isDirectory()).toBe(true); // /.aenv's mount point
  expect(lstatSync(join(root, "etc")).isSymbolicLink()).toBe(true); // the image's links stay
});

test("relative links climbing out with .. stop at the image's top", () => {
  const up = "../".repeat(20);
  symlinkSync(`${up}${victim.slice(1)}/etc`, join(root, "etc"));
  mkdirSync(join(root, "home"));
  symlinkSync(`${up}${victim.slice(1)}`, join(root, "home/user")); // chown target
  const before = snapshot(victim);
  installGuestBits(root);
  expect(snapshot(victim)).toBe(before);
  expect(readFileSync(join(root, victim, "etc/passwd"), "utf8")).toContain("user:x:1000:1000:");
  // /home/user is already there (a link the guest cannot follow): left as it is, nothing chowned
  expect(lstatSync(join(root, "home/user")).isSymbolicLink()).toBe(true);
});

test("a link at the file itself (etc/passwd -> host file) is followed inside the tree, never written through", () => {
  mkdirSync(join(root, "etc"));
  symlinkSync(join(victim, "etc/passwd"), join(root, "etc/passwd"));
  symlinkSync(join(victim, "etc/shadow"), join(root, "etc/shadow"));
  mkdirSync(join(root, victim, "etc"), { recursive: true });
  writeFileSync(join(root, victim, "etc/passwd"), "root:x:0:0::/root:/bin/sh"); // the guest's view of it
  writeFileSync(join(root, victim, "etc/shadow"), "root:*:1::::::\n", { mode: 0o600 });
  const before = snapshot(victim);
  installGuestBits(root);
  expect(snapshot(victim)).toBe(before);
  expect(readFileSync(join(root, victim, "etc/passwd"), "utf8")).toBe("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n");
  expect(readFileSync(join(root, victim, "etc/shadow"), "utf8")).toBe("root:*:1::::::\nuser:*:19000:0:99999:7:::\n");
  expect(lstatSync(join(root, victim, "etc/shadow")).mode & 0o7777).toBe(0o600); // mode kept
});

test("a device node where /etc/passwd belongs and a link loop are refused (image.bad_rootfs), nothing read or written", () => {
  mkdirSync(join(root, "etc"));
  // char 1:3 is /dev/null: harmless here, but the same could name a host disk
  expect(Bun.spawnSync(["mknod", join(root, "etc/passwd"), "c", "1", "3"]).exitCode).toBe(0);
  expect(() => installGuestBits(root)).toThrow(expect.objectContaining({ code: "image.bad_rootfs", details: { path: "etc/passwd" } }));
  expect(lstatSync(join(root, "etc/passwd")).isCharacterDevice()).toBe(true);

  const loop = join(work, `loop${n}`);
  mkdirSync(loop);
  symlinkSync("etc2", join(loop, "etc"));
  symlinkSync("/etc", join(loop, "etc2"));
  expect(() => installGuestBits(loop)).toThrow(expect.objectContaining({ code: "image.bad_rootfs" }));
});

test("merged /usr (bin -> usr/bin) is honoured: an existing /usr/bin/sh counts, bash goes beside it", () => {
  mkdirSync(join(root, "usr/bin"), { recursive: true });
  symlinkSync("usr/bin", join(root, "bin"));
  writeFileSync(join(root, "usr/bin/sh"), "#!shell", { mode: 0o755 });
  mkdirSync(join(root, "etc/sudoers.d"), { recursive: true });
  writeFileSync(join(root, "etc/passwd"), "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n");
  installGuestBits(root);
  expect(readFileSync(join(root, "usr/bin/sh"), "utf8")).toBe("#!shell");
  expect(readFileSync(join(root, "usr/bin/bash"), "utf8")).toContain('exec /bin/sh "$@"');
  expect(lstatSync(join(root, "usr/bin/bash")).mode & 0o777).toBe(0o755);
  // user exists already: passwd and sudoers untouched
  expect(readFileSync(join(root, "etc/passwd"), "utf8")).toBe("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n");
  expect(readdirSync(join(root, "etc/sudoers.d"))).toEqual([]);
  const home = lstatSync(join(root, "home/user"));
  expect([home.isDirectory(), home.uid, home.gid, home.mode & 0o777]).toEqual([true, 1000, 1000, 0o755]);
  expect(readFileSync(join(root, "etc/hosts"), "utf8")).toContain("127.0.0.1\tlocalhost");
  // no temporary files left beside what was written
  expect(readdirSync(join(root, "etc")).filter((f) => f.includes(".tmp"))).toEqual([]);
});

test("RootTree.resolve: absolute and relative links, .. at the top, a final link kept or followed", () => {
  mkdirSync(join(root, "a/b"), { recursive: true });
  symlinkSync("/a/b", join(root, "abs"));
  symlinkSync("a/../a/b", join(root, "rel"));
  symlinkSync("/nowhere/file", join(root, "dangling"));
  const t = new RootTree(root);
  expect(t.resolve("/abs/x")).toBe(join(root, "a/b/x"));
  expect(t.resolve("rel/../../../../a")).toBe(join(root, "a"));
  expect(t.resolve("abs", false)).toBe(join(root, "abs"));
  expect(t.resolve("dangling")).toBe(join(root, "nowhere/file"));
  expect(t.kind("abs")).toBe("link");
  expect(t.kind("a/b")).toBe("dir");
  expect(t.kind("nowhere")).toBe("none");
  // a write through a dangling link into a directory the image lacks is refused, not made outside
  expect(() => t.writeText("dangling", "x")).toThrow(expect.objectContaining({ code: "image.bad_rootfs" }));
});
