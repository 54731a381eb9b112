/**
 * What `agentenv template build --dockerfile` uploads for a COPY: exactly the entries the source
 * names inside the build context (a path, a glob's matches, directories with their content),
 * never anything outside it (`..`, absolute paths, links leading out), minus `.dockerignore`;
 * the packed archive holds those entries and no others, and the files hash covers the same set.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { copyEntries, filesHash, ignored, packCopy } from "../../src/cli/template-build.ts";

let root: string;
let ctx: string;

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "aenv-ctx-"));
  ctx = join(root, "ctx");
  writeFileSync(join(root, "secret.txt"), "outside the context\n");
  mkdirSync(join(ctx, "src/sub"), { recursive: true });
  mkdirSync(join(ctx, "node_modules/x"), { recursive: true });
  writeFileSync(join(ctx, "src/a.py"), "a\n");
  writeFileSync(join(ctx, "src/b.txt"), "b\n");
  writeFileSync(join(ctx, "src/.hidden.py"), "h\n");
  writeFileSync(join(ctx, "src/sub/c.py"), "c\n");
  writeFileSync(join(ctx, "src/sub/debug.log"), "log\n");
  writeFileSync(join(ctx, "node_modules/x/i.js"), "i\n");
  symlinkSync(root, join(ctx, "up")); // a link leading out of the context
  symlinkSync("a.py", join(ctx, "src/link.py")); // a link inside: packed as a link
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

test("a glob names its matches only; a directory everything under it", () => {
  expect(copyEntries(ctx, "src/*.py", [])).toEqual(["src/.hidden.py", "src/a.py", "src/link.py"]);
  expect(copyEntries(ctx, "src/**/*.py", [])).toEqual(["src/.hidden.py", "src/a.py", "src/link.py", "src/sub/c.py"]);
  expect(copyEntries(ctx, "src/", [])).toEqual(["src", "src/.hidden.py", "src/a.py", "src/b.txt", "src/link.py", "src/sub", "src/sub/c.py", "src/sub/debug.log"]);
  expect(copyEntries(ctx, "./src/a.py", [])).toEqual(["src/a.py"]);
});

test("sources outside the context are refused: .., absolute, through a link", () => {
  expect(() => copyEntries(ctx, "../secret.txt", [])).toThrow("COPY ../secret.txt: outside the build context");
  expect(() => copyEntries(ctx, "src/../../secret.txt", [])).toThrow("outside the build context");
  expect(() => copyEntries(ctx, join(root, "secret.txt"), [])).toThrow("outside the build context");
  expect(() => copyEntries(ctx, "up/secret.txt", [])).toThrow("up/secret.txt is reached through a link leading out of the build context");
  // the link itself is an entry like any other (its target is a guest path then)
  expect(copyEntries(ctx, "up", [])).toEqual(["up"]);
  expect(() => copyEntries(ctx, "nothing/*.py", [])).toThrow("matches nothing");
});

test(".dockerignore: patterns exclude paths and what is under them, ! includes again, last match wins", () => {
  expect(ignored("node_modules/x/i.js", ["node_modules"])).toBe(true);
  expect(ignored("src/sub/debug.log", ["**/*.log"])).toBe(true);
  expect(ignored("src/sub/debug.log", ["**/*.log", "!src/sub/debug.log"])).toBe(false);
  expect(ignored("src/a.py", ["/src/", "!src/a.py"])).toBe(false);
  expect(ignored("src/b.txt", ["/src/", "!src/a.py"])).toBe(true);
  expect(copyEntries(ctx, "src/", ["**/*.log", "src/b.txt"])).toEqual(["src", "src/.hidden.py", "src/a.py", "src/link.py", "src/sub", "src/sub/c.py"]);
  expect(() => copyEntries(ctx, "node_modules", ["node_modules"])).toThrow("matches nothing in the build context");
});

test("the hash covers exactly the entries: a file outside the glob does not change it, one inside does", () => {
  const h = filesHash(ctx, "src/*.py", "/app/", []);
  writeFileSync(join(ctx, "src/b.txt"), "b changed\n");
  expect(filesHash(ctx, "src/*.py", "/app/", [])).toBe(h);
  writeFileSync(join(ctx, "src/a.py"), "a changed\n");
  expect(filesHash(ctx, "src/*.py", "/app/", [])).not.toBe(h);
  expect(filesHash(ctx, "src/*.py", "/other/", [])).not.toBe(filesHash(ctx, "src/*.py", "/app/", []));
});

test("the archive holds exactly those entries (a glob's matches, not the rest of their directory)", () => {
  writeFileSync(join(ctx, ".dockerignore"), "# comment\n**/*.log\n");
  const packed = packCopy(ctx, "src/sub/*");
  try {
    const listing = Bun.spawnSync(["tar", "-tzf", packed.path], { stdout: "pipe" }).stdout.toString().trim().split("\n");
    expect(listing).toEqual(["src/sub/c.py"]);
  } finally {
    packed.cleanup();
    rmSync(join(ctx, ".dockerignore"));
  }
});
