/**
 * The layers of the house (HANDBOOK, ../shared/docs/STYLE.md), checked on the sources: arrows
 * point down only (`api -> orchestrator`, `sandbox -> (vmm, storage, net, ...) -> ffi`, the
 * composition root in src/node), services/ import src/ and never the reverse, and kernel
 * interfaces (bun:ffi, one dlopen) live only in src/ffi. Reads every import, static and dynamic.
 */
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

const REPO = join(import.meta.dir, "..");

interface Import {
  /** Importing file, relative to the repository. */
  from: string;
  /** What it names: a path relative to the repository for relative imports, else the bare specifier. */
  to: string;
  typeOnly: boolean;
}

function importsOf(dirs: string[]): Import[] {
  const out: Import[] = [];
  for (const dir of dirs) {
    for (const f of new Bun.Glob("**/*.ts").scanSync(join(REPO, dir))) {
      const file = join(REPO, dir, f);
      // block comments and whole-line comments go first (doc comments show imports as examples)
      const text = readFileSync(file, "utf8").replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
      const re = /(?:^|[\s;(])(import|export)(\s+type)?\b[^"'`;]*?(?:from\s*)?\(?\s*["']([^"']+)["']/gm;
      for (const m of text.matchAll(re)) {
        const spec = m[3]!;
        if (!/^[@\w./:-]+$/.test(spec)) continue; // a quoted phrase after the word import in code, not a module
        const to = spec.startsWith(".") ? relative(REPO, resolve(dirname(file), spec)) : spec;
        out.push({ from: relative(REPO, file), to, typeOnly: m[2] !== undefined });
      }
    }
  }
  return out;
}

const ALL = importsOf(["src", "services"]);
const under = (p: string, dir: string) => p === dir || p.startsWith(`${dir}/`);
const show = (i: Import) => `${i.from} -> ${i.to}`;

test("the import reader sees static, dynamic, re-exported and type-only imports", () => {
  expect(ALL.length).toBeGreaterThan(1000);
  const main = ALL.filter((i) => i.from === "src/cli/main.ts").map((i) => i.to);
  expect(main).toContain("services/gateway/cli.ts"); // import("...") inside a lazy subcommand
  expect(main).toContain("package.json");
  expect(ALL.some((i) => i.from === "src/envd/index.ts" && i.to === "src/envd/version.ts")).toBe(true); // export { } from
  expect(ALL.some((i) => i.from === "src/orchestrator/runtime.ts" && i.to === "src/volume/types.ts" && i.typeOnly)).toBe(true);
});

test("nothing under src/ imports services/ or deploy/, but the binary's entry point (its lazy subcommands)", () => {
  const bad = ALL.filter((i) => under(i.from, "src") && (under(i.to, "services") || under(i.to, "deploy")) && i.from !== "src/cli/main.ts");
  expect(bad.map(show)).toEqual([]);
});

test("the orchestrator is the plain core: it imports no adapter (sandbox), no upper layer and no kernel or device code", () => {
  const banned = ["src/sandbox", "src/api", "src/node", "src/cli", "services", "src/vmm", "src/storage", "src/net", "src/ffi", "src/envd", "src/snapshot", "src/image", "src/tools", "bun:ffi"];
  const bad = ALL.filter((i) => under(i.from, "src/orchestrator") && banned.some((b) => under(i.to, b)));
  expect(bad.map(show)).toEqual([]);
});

test("subsystems below the orchestrator import no layer above them", () => {
  const low = ["src/ffi", "src/vmm", "src/storage", "src/net", "src/image", "src/tools", "src/template", "src/snapshot", "src/envd", "src/volume", "src/db", "src/config"];
  const upper = ["src/api", "src/node", "src/cli", "src/orchestrator", "src/sandbox", "services"];
  const bad = ALL.filter((i) => low.some((l) => under(i.from, l)) && upper.some((u) => under(i.to, u)));
  expect(bad.map(show)).toEqual([]);
  // only the composition root (and the commands that start a node) wire the API to a runtime
  const api = ALL.filter((i) => under(i.to, "src/api") && !under(i.from, "src/api") && !["src/node", "src/cli", "services"].some((d) => under(i.from, d)));
  expect(api.map(show)).toEqual([]);
});

test("kernel interfaces only in src/ffi: bun:ffi values nowhere else, one dlopen", () => {
  const ffi = ALL.filter((i) => i.to === "bun:ffi" && !i.typeOnly && !under(i.from, "src/ffi"));
  expect(ffi.map(show)).toEqual([]);
  const dlopen = [...new Bun.Glob("{src,services}/**/*.ts").scanSync(REPO)].filter((f) => /\bdlopen\s*\(/.test(readFileSync(join(REPO, f), "utf8")));
  expect(dlopen).toEqual(["src/ffi/libc.ts"]);
});
