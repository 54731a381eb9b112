/** `agentenv image ...` run as a real subprocess (bun src/cli/main.ts). */
import { afterAll, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { extractExt4, HELLO, rng, scratch, sha256 } from "./helpers.ts";

const tmp = scratch();
afterAll(() => tmp.cleanup());
const MAIN = new URL("../../../src/cli/main.ts", import.meta.url).pathname;

function run(...args: string[]): { code: number; out: Buffer; err: string } {
  const p = Bun.spawnSync([process.execPath, MAIN, "image", ...args], { env: { ...process.env, AENV_LOG_LEVEL: "warn" } });
  return { code: p.exitCode ?? -1, out: p.stdout as Buffer, err: p.stderr.toString() };
}

describe("agentenv image", () => {
  test("every command has --help", () => {
    for (const c of ["info", "cat", "create", "commit", "zfile", "import-raw", "import-sparse", "stack"]) {
      const r = run(c, "--help");
      expect(r.code).toBe(0);
      expect(r.out.toString() + r.err).toContain("USAGE");
    }
  });

  test("import-raw -> zfile (zstd and lz4) -> cat equals the raw image byte for byte", () => {
    const raw = new Uint8Array(5 * 1024 * 1024);
    const r = rng(11);
    for (let i = 0; i < raw.length; i += 512) if (r() < 0.6) raw.fill(Math.floor(r() * 256), i, i + 512 - Math.floor(r() * 200));
    raw.fill(0, 1 << 20, 2 << 20);
    writeFileSync(tmp.path("disk.raw"), raw);
    const imp = run("import-raw", tmp.path("disk.raw"), tmp.path("disk.layer"));
    expect(imp.code).toBe(0);
    expect(JSON.parse(imp.out.toString()).entries).toBeGreaterThan(0);
    for (const algo of ["zstd", "lz4"]) {
      const z = run("zfile", "--algo", algo, tmp.path("disk.layer"), tmp.path(`disk.${algo}`));
      expect(z.code).toBe(0);
      const info = JSON.parse(run("info", tmp.path(`disk.${algo}`)).out.toString());
      expect(info.zfile.algo).toBe(algo === "zstd" ? 2 : 1);
      expect(info.trailer.virtualSize).toBe(raw.length);
      const c = run("cat", tmp.path(`disk.${algo}`));
      expect(c.code).toBe(0);
      expect(c.out.length).toBe(raw.length);
      expect(sha256(c.out)).toBe(sha256(raw));
    }
    const part = run("cat", tmp.path("disk.lz4"), "--offset", "1000", "--length", "70000");
    expect(Buffer.compare(part.out, Buffer.from(raw.subarray(1000, 71000)))).toBe(0);
  }, 60_000);

  test("cat through a config.v1.json; create, commit, stack", () => {
    expect(run("create", tmp.path("u.data"), tmp.path("u.index"), "--size", "0").code).toBe(0);
    const st = run("stack", tmp.path("config.v1.json"), "--lowers", HELLO, "--upper-data", tmp.path("u.data"), "--upper-index", tmp.path("u.index"));
    expect(st.code).toBe(0);
    expect(JSON.parse(st.out.toString()).size).toBe(64 * 1024 ** 3);
    const c = run("cat", tmp.path("config.v1.json"), "--length", "4MiB");
    expect(sha256(c.out)).toBe("1ba9757892e20ff13d4dc47e72694349129a92f41f20b65010a4082f3261466c");
    const cm = run("commit", tmp.path("u.data"), tmp.path("u.index"), tmp.path("u.layer"), "-m", "empty");
    expect(cm.code).toBe(0);
    const info = JSON.parse(run("info", tmp.path("u.layer")).out.toString());
    expect(info.header.userTag).toBe("empty");
    expect(info.index.entries).toBe(0);
    expect(run("create", tmp.path("s.data"), tmp.path("s.index"), "--size", "1MiB").code).toBe(0);
    expect(run("commit", "--seal", tmp.path("s.data"), tmp.path("s.index")).code).toBe(0);
    const sealed = JSON.parse(run("info", tmp.path("s.data")).out.toString());
    expect(sealed.header.flags).toBe(3);
    expect(sealed.trailer.flags).toBe(6);
    expect(sealed.trailer.indexSize).toBe(0);
    expect(run("create", "--sparse", tmp.path("sp.data"), tmp.path("sp.index"), "--size", "1MiB").code).toBe(0);
    expect(JSON.parse(run("info", tmp.path("sp.data")).out.toString()).header.flags).toBe(0x13);
  }, 30_000);

  test("fixtures through image cat: README sha256s and the ext4 magic", async () => {
    const ext4 = await extractExt4(tmp.dir);
    const cases: Array<[string, string, string]> = [
      [ext4, "4MiB", "3c651b5d7283c6fad4089b6ad061381fcb3bcecf57100a11cee5084131a27ad4"],
      [HELLO, "4MiB", "1ba9757892e20ff13d4dc47e72694349129a92f41f20b65010a4082f3261466c"],
      [HELLO, "8MiB", "6747a26dcb4c5000cbda3c13f8ca26b0132048eb2df88fef59504e304f2938ed"],
    ];
    for (const [file, length, want] of cases) {
      const r = run("cat", file, "--offset", "0", "--length", length);
      expect(r.code).toBe(0);
      expect(sha256(r.out)).toBe(want);
    }
    const magic = run("cat", ext4, "--offset", "1080", "--length", "2");
    expect(Array.from(magic.out)).toEqual([0x53, 0xef]);
    const info = JSON.parse(run("info", ext4).out.toString());
    expect(info.zfile.source).toBe("trailer");
    expect(info.index).toEqual({ entries: 8323, dataSectors: 1_058_192, zeroedSectors: 133_159_536 });
  }, 60_000);

  test("bad input: non-zero exit, one line naming the problem", () => {
    writeFileSync(tmp.path("junk"), new Uint8Array(10000).fill(1));
    const cases: Array<[string[], RegExp]> = [
      [["cat"], /missing FILE/],
      [["cat", tmp.path("nope")], /no such file/],
      [["cat", tmp.path("junk")], /magic mismatch/],
      [["cat", HELLO, "--offset", "abc"], /not a size/],
      [["cat", HELLO, "--offset", String(64 * 1024 ** 3)], /past the virtual size/],
      [["zfile", "--algo", "gzip", tmp.path("disk.layer"), tmp.path("x")], /zstd or lz4/],
      [["zfile", HELLO, tmp.path("y")], /already ZFile/],
      [["create", tmp.path("a"), tmp.path("b"), "--size", "1000"], /multiple of 512/],
      [["import-raw", tmp.path("nope"), tmp.path("z")], /no such file/],
      [["commit", tmp.path("junk"), tmp.path("junk"), tmp.path("z")], /magic/],
      [["info", tmp.path("junk")], /magic/],
    ];
    for (const [args, re] of cases) {
      const r = run(...args);
      expect(r.code).not.toBe(0);
      expect(r.err.trim().split("\n").length).toBe(1);
      expect(r.err).toMatch(re);
    }
  }, 60_000);
});
