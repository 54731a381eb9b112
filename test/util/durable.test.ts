import { afterAll, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fsyncDir, fsyncPath, renameDurable, writeFileDurable } from "../../src/util/durable.ts";

const dir = mkdtempSync(join(tmpdir(), "aenv-durable-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("writeFileDurable replaces a file whole, with the asked mode, and leaves no temporary file", () => {
  const p = join(dir, "state.json");
  writeFileSync(p, "old");
  writeFileDurable(p, '{"v":2}\n', { mode: 0o640 });
  expect(readFileSync(p, "utf8")).toBe('{"v":2}\n');
  expect(statSync(p).mode & 0o777).toBe(0o640);
  writeFileDurable(p, new Uint8Array([1, 2, 3]));
  expect([...readFileSync(p)]).toEqual([1, 2, 3]);
  expect(readdirSync(dir).filter((f) => f.startsWith("state.json"))).toEqual(["state.json"]);
});

test("a failed write leaves what was there and removes its temporary file", () => {
  const sub = join(dir, "sub");
  // the target is a directory holding a file: rename(2) fails (EISDIR) after the temporary file was written
  const target = join(sub, "dir");
  mkdirSync(target, { recursive: true });
  writeFileSync(join(target, "x"), "kept");
  expect(() => writeFileDurable(target, "new", { tmp: join(sub, "t.tmp") })).toThrow(expect.objectContaining({ code: "EISDIR" }));
  expect(existsSync(join(sub, "t.tmp"))).toBe(false);
  expect(readFileSync(join(target, "x"), "utf8")).toBe("kept");
});

test("renameDurable moves a finished file into place; a missing file is an ENOENT error", () => {
  const tmp = join(dir, "layer.tmp");
  writeFileSync(tmp, "bytes");
  chmodSync(tmp, 0o444);
  renameDurable(tmp, join(dir, "layer"));
  expect(readFileSync(join(dir, "layer"), "utf8")).toBe("bytes");
  expect(existsSync(tmp)).toBe(false);
  expect(() => renameDurable(join(dir, "missing"), join(dir, "other"))).toThrow(expect.objectContaining({ code: "ENOENT" }));
  expect(() => fsyncPath(join(dir, "missing"))).toThrow(expect.objectContaining({ code: "ENOENT" }));
  fsyncDir(dir);
});
