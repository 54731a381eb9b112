// src/bundle.ts: every worker-thread entry module exists and is named by every compile of the
// binary (package.json "build"; the template build and tests call compileEntrypoints()).
import { expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join, relative } from "node:path";
import pkg from "../package.json" with { type: "json" };
import { compileEntrypoints, isCompiled, WORKER_ENTRYPOINTS, workerEntry } from "../src/bundle.ts";

const ROOT = join(import.meta.dir, "..");

test("compile entrypoints: main first, then every worker module; all exist; package.json's build names them all", () => {
  const entries = compileEntrypoints();
  expect(relative(ROOT, entries[0]!)).toBe("src/cli/main.ts");
  expect(entries.slice(1).map((e) => relative(ROOT, e))).toEqual(WORKER_ENTRYPOINTS.map((w) => `src/${w}`));
  for (const e of entries) expect(existsSync(e)).toBe(true);
  const build = pkg.scripts.build.split(/\s+/);
  for (const e of entries) expect(build).toContain(relative(ROOT, e));
});

test("from source a worker path is the module file itself", () => {
  expect(isCompiled()).toBe(false);
  expect(workerEntry("storage/fuse/reader-worker.ts")).toBe(join(ROOT, "src/storage/fuse/reader-worker.ts"));
});
