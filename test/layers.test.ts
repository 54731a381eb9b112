/**
 * The layers of the house, checked on the sources (docs/architecture.md explains RANKS). Every
 * import of every file under src/, services/ and deploy/ is read with the TypeScript parser
 * (static, type-only, `export ... from`, dynamic `import()`, `import("...")` in a type,
 * `require()`) and resolved to a file. Each file belongs to the most specific unit of RANKS
 * that holds it, and an import must point into its own unit or a lower rank: an upward or
 * sideways edge fails, and so does any file-level import cycle (within a unit too). Kernel
 * interfaces (bun:ffi values, the one dlopen) live only in src/ffi.
 */
import { afterAll, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import * as ts from "typescript";

const REPO = join(import.meta.dir, "..");
/** The trees whose imports are checked. */
const ROOTS = ["src", "services", "deploy"];

/**
 * Units of the code, top rank first. A unit is a folder or a file; a file belongs to the most
 * specific unit holding it. A unit may import itself and any unit of a lower rank, never one of
 * its own rank or above. Written down once here; docs/architecture.md says why.
 */
const RANKS: readonly (readonly string[])[] = [
  ["src/cli/main.ts"], // the binary's entry point: loads every command lazily, the control plane's too
  ["src/cli", "services/cluster", "services/gateway", "services/scheduler", "deploy"], // commands
  ["src/node"], // the composition root: a node's parts wired together
  ["src/api"], // the node's HTTP API and sandbox proxy
  ["src/console", "src/events"], // the operators' console (its terminal reads envd's Connect frames with src/sandbox/connect-frames.ts); lifecycle events and webhooks
  ["src/sandbox"], // the SandboxRuntime adapter (implements the orchestrator's port)
  ["src/orchestrator", "src/template"], // sandbox lifecycle (defines the port); the template catalog and builds
  ["src/image"], // registry images as template bases
  ["src/net", "src/tools", "src/snapshot", "src/volume", "src/secrets"],
  ["src/vmm", "src/storage/daemon", "src/envd"], // VMM drivers; the disk daemon; the guest's daemon
  ["src/storage/ublk", "src/storage/fuse"], // the two ways a disk is exported
  ["src/storage/overlaybd"], // the image format
  ["src/storage"], // what every disk shares: block.ts, raw.ts, errors.ts
  ["src/observability", "src/config", "src/db", "src/cluster"],
  ["src/ffi"], // every kernel interface
  ["src/util", "src/errors.ts", "src/bundle.ts"], // plain helpers, the error base class, worker entry points
];

/** One import, as the parser sees it. */
interface Import {
  /** Importing file, relative to the root. */
  from: string;
  /**
   * The imported file relative to the root for a relative specifier (`unresolved:<path>` when
   * no file answers it); the bare specifier for a package or a built-in module.
   */
  to: string;
  kind: "static" | "type" | "export" | "dynamic" | "type-import" | "require";
}

/** The file a relative specifier names: the path itself, + `.ts` or `.tsx`, or its folder's index.ts. */
function resolveSpecifier(root: string, fromAbs: string, spec: string): string {
  if (!spec.startsWith(".")) return spec;
  const base = resolve(dirname(fromAbs), spec);
  for (const c of [base, `${base}.ts`, `${base}.tsx`, join(base, "index.ts")]) {
    if (existsSync(c) && statSync(c).isFile()) return relative(root, c);
  }
  return `unresolved:${relative(root, base)}`;
}

/** Every import of the .ts and .tsx files under `dirs` (relative to `root`), read with the TypeScript parser. */
function readImports(root: string, dirs: readonly string[]): Import[] {
  const out: Import[] = [];
  for (const dir of dirs) {
    if (!existsSync(join(root, dir))) continue;
    for (const f of [...new Bun.Glob("**/*.{ts,tsx}").scanSync(join(root, dir))].sort()) {
      const abs = join(root, dir, f);
      const from = relative(root, abs);
      const sf = ts.createSourceFile(abs, readFileSync(abs, "utf8"), ts.ScriptTarget.Latest, true, f.endsWith(".tsx") ? ts.ScriptKind.TSX : ts.ScriptKind.TS);
      const add = (spec: ts.Node | undefined, kind: Import["kind"]) => {
        if (!spec || !ts.isStringLiteralLike(spec)) {
          out.push({ from, to: `computed:${spec?.getText(sf) ?? ""}`, kind });
          return;
        }
        out.push({ from, to: resolveSpecifier(root, abs, spec.text), kind });
      };
      const visit = (n: ts.Node): void => {
        if (ts.isImportDeclaration(n)) {
          const c = n.importClause;
          const typeOnly = c !== undefined && (c.isTypeOnly || (!c.name && c.namedBindings !== undefined && ts.isNamedImports(c.namedBindings) && c.namedBindings.elements.length > 0 && c.namedBindings.elements.every((e) => e.isTypeOnly)));
          add(n.moduleSpecifier, typeOnly ? "type" : "static");
        } else if (ts.isExportDeclaration(n) && n.moduleSpecifier) {
          add(n.moduleSpecifier, "export");
        } else if (ts.isImportEqualsDeclaration(n) && ts.isExternalModuleReference(n.moduleReference)) {
          add(n.moduleReference.expression, "require");
        } else if (ts.isCallExpression(n) && n.expression.kind === ts.SyntaxKind.ImportKeyword) {
          add(n.arguments[0], "dynamic");
        } else if (ts.isCallExpression(n) && ts.isIdentifier(n.expression) && n.expression.text === "require") {
          add(n.arguments[0], "require");
        } else if (ts.isImportTypeNode(n)) {
          add(ts.isLiteralTypeNode(n.argument) ? n.argument.literal : n.argument, "type-import");
        }
        ts.forEachChild(n, visit);
      };
      visit(sf);
    }
  }
  return out;
}

const isLocal = (to: string) => ROOTS.some((r) => to.startsWith(`${r}/`));

/** The unit of RANKS holding `file` (the longest match), with its rank (0 = top), or undefined. */
function unitOf(file: string): { unit: string; rank: number } | undefined {
  let best: { unit: string; rank: number } | undefined;
  RANKS.forEach((units, rank) => {
    for (const u of units) {
      if ((file === u || file.startsWith(`${u}/`)) && (!best || u.length > best.unit.length)) best = { unit: u, rank };
    }
  });
  return best;
}

/** Imports between units that do not point to a lower rank: `from -> to (unit rank r -> unit rank r)`. */
function layerViolations(imports: readonly Import[]): string[] {
  const out: string[] = [];
  for (const i of imports) {
    if (!isLocal(i.to)) continue;
    const a = unitOf(i.from);
    const b = unitOf(i.to);
    if (!a || !b || a.unit === b.unit || a.rank < b.rank) continue; // rank 0 is the top
    out.push(`${i.from} -> ${i.to} (${a.unit} rank ${a.rank} -> ${b.unit} rank ${b.rank})`);
  }
  return out;
}

/** Files that reach themselves through imports: each cycle's files (a strongly connected component), sorted. */
function fileCycles(imports: readonly Import[]): string[][] {
  const next = new Map<string, string[]>();
  for (const i of imports) {
    if (!isLocal(i.to)) continue;
    next.set(i.from, [...(next.get(i.from) ?? []), i.to]);
  }
  // Tarjan's strongly connected components, iterative (no recursion depth limit)
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const out: string[][] = [];
  for (const start of [...next.keys()].sort()) {
    if (index.has(start)) continue;
    const work: { v: string; i: number }[] = [{ v: start, i: 0 }];
    index.set(start, index.size);
    low.set(start, index.get(start)!);
    stack.push(start);
    onStack.add(start);
    while (work.length > 0) {
      const top = work[work.length - 1]!;
      const succ = next.get(top.v) ?? [];
      if (top.i < succ.length) {
        const w = succ[top.i++]!;
        if (!index.has(w)) {
          index.set(w, index.size);
          low.set(w, index.get(w)!);
          stack.push(w);
          onStack.add(w);
          work.push({ v: w, i: 0 });
        } else if (onStack.has(w)) low.set(top.v, Math.min(low.get(top.v)!, index.get(w)!));
        continue;
      }
      work.pop();
      const parent = work[work.length - 1];
      if (parent) low.set(parent.v, Math.min(low.get(parent.v)!, low.get(top.v)!));
      if (low.get(top.v) === index.get(top.v)) {
        const scc: string[] = [];
        let w: string;
        do {
          w = stack.pop()!;
          onStack.delete(w);
          scc.push(w);
        } while (w !== top.v);
        if (scc.length > 1 || succ.includes(top.v)) out.push(scc.sort());
      }
    }
  }
  return out.sort((a, b) => a[0]!.localeCompare(b[0]!));
}

const ALL = readImports(REPO, ROOTS);
const show = (i: Import) => `${i.from} -> ${i.to}`;
const under = (p: string, dir: string) => p === dir || p.startsWith(`${dir}/`);

test("every import is read and resolves to a file", () => {
  expect(ALL.length).toBeGreaterThan(1000);
  const main = ALL.filter((i) => i.from === "src/cli/main.ts");
  expect(main).toContainEqual({ from: "src/cli/main.ts", to: "services/gateway/cli.ts", kind: "dynamic" });
  expect(main).toContainEqual({ from: "src/cli/main.ts", to: "package.json", kind: "static" });
  expect(ALL).toContainEqual({ from: "src/envd/index.ts", to: "src/envd/version.ts", kind: "export" });
  expect(ALL).toContainEqual({ from: "src/orchestrator/runtime.ts", to: "src/volume/types.ts", kind: "type" });
  expect(ALL.filter((i) => i.to.startsWith("unresolved:") || i.to.startsWith("computed:")).map(show)).toEqual([]);
});

test("RANKS names every file's unit, and only units that exist", () => {
  const files = ROOTS.flatMap((r) => [...new Bun.Glob("**/*.{ts,tsx}").scanSync(join(REPO, r))].map((f) => join(r, f)));
  expect(files.filter((f) => !unitOf(f))).toEqual([]);
  expect(RANKS.flat().filter((u) => !existsSync(join(REPO, u)))).toEqual([]);
  expect(new Set(RANKS.flat()).size).toBe(RANKS.flat().length);
});

test("imports point down the ranks only", () => {
  expect(layerViolations(ALL)).toEqual([]);
});

test("no file-level import cycle", () => {
  expect(fileCycles(ALL)).toEqual([]);
});

test("nothing under src/ imports services/ or deploy/, but the binary's entry point (its lazy subcommands)", () => {
  const bad = ALL.filter((i) => under(i.from, "src") && (under(i.to, "services") || under(i.to, "deploy")) && i.from !== "src/cli/main.ts");
  expect(bad.map(show)).toEqual([]);
});

test("envd is guest code: it imports only what the guest has (itself, src/ffi, src/util, the error base class) and packages", () => {
  const guest = ["src/envd", "src/ffi", "src/util", "src/errors.ts"];
  const bad = ALL.filter((i) => under(i.from, "src/envd") && isLocal(i.to) && !guest.some((g) => under(i.to, g)));
  expect(bad.map(show)).toEqual([]);
});

test("kernel interfaces only in src/ffi: bun:ffi values nowhere else, one dlopen", () => {
  const ffi = ALL.filter((i) => i.to === "bun:ffi" && i.kind !== "type" && i.kind !== "type-import" && !under(i.from, "src/ffi"));
  expect(ffi.map(show)).toEqual([]);
  const dlopen = [...new Bun.Glob("{src,services}/**/*.ts").scanSync(REPO)].filter((f) => /\bdlopen\s*\(/.test(readFileSync(join(REPO, f), "utf8")));
  expect(dlopen).toEqual(["src/ffi/libc.ts"]);
});

// The test of the test: fixture trees with every import form, a planted upward import and a
// planted cycle; the checker must report exactly those.
const FIXTURES = mkdtempSync(join(tmpdir(), "aenv-layers-"));
afterAll(() => rmSync(FIXTURES, { recursive: true, force: true }));

function plant(root: string, files: Record<string, string>): void {
  for (const [p, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, p)), { recursive: true });
    writeFileSync(join(root, p), text);
  }
}

test("the reader sees each import form, and nothing in comments or strings", () => {
  const root = join(FIXTURES, "forms");
  const target = (name: string) => `export const ${name} = 1;\nexport type T${name} = number;\n`;
  plant(root, {
    "src/util/forms.ts": [
      '/** Example: import { x } from "./doc.ts" (a doc comment, not an import) */',
      '// import "./line-comment.ts";',
      'import def, { named } from "./a.ts";',
      'import * as ns from "./b";',
      'import type { Tc } from "./c.ts";',
      'import { type Td } from "./d.ts";',
      'import "./sub";',
      'export { e } from "./e.ts";',
      'export * from "./f.ts";',
      'const s = "import x from \'./in-string.ts\'";',
      'const t = `export * from "./in-template.ts"`;',
      'const lazy = () => import("./g.ts");',
      'type I = typeof import("./h.ts");',
      'const r = require("./i.ts");',
      'import { readFileSync } from "node:fs";',
      'import pkg from "../../package.json" with { type: "json" };',
      'import gone from "./missing.ts";',
    ].join("\n"),
    ...Object.fromEntries(["a", "b", "c", "d", "e", "f", "g", "h", "i"].map((n) => [`src/util/${n}.ts`, target(n)])),
    "src/util/sub/index.ts": target("sub"),
    "package.json": "{}",
  });
  const got = readImports(root, ["src"]).filter((i) => i.from === "src/util/forms.ts");
  const from = "src/util/forms.ts";
  expect(got).toEqual([
    { from, to: "src/util/a.ts", kind: "static" },
    { from, to: "src/util/b.ts", kind: "static" },
    { from, to: "src/util/c.ts", kind: "type" },
    { from, to: "src/util/d.ts", kind: "type" },
    { from, to: "src/util/sub/index.ts", kind: "static" },
    { from, to: "src/util/e.ts", kind: "export" },
    { from, to: "src/util/f.ts", kind: "export" },
    { from, to: "src/util/g.ts", kind: "dynamic" },
    { from, to: "src/util/h.ts", kind: "type-import" },
    { from, to: "src/util/i.ts", kind: "require" },
    { from, to: "node:fs", kind: "static" },
    { from, to: "package.json", kind: "static" },
    { from, to: "unresolved:src/util/missing.ts", kind: "static" },
  ]);
});

test("the checker reports exactly a planted upward import, a planted sideways import and a planted cycle", () => {
  const root = join(FIXTURES, "planted");
  plant(root, {
    // allowed: down the ranks (node -> orchestrator -> util -> nothing), within a unit, to packages
    "src/node/boot.ts": 'import { run } from "../orchestrator/run.ts";\nimport { helper } from "./helper.ts";\nexport const boot = () => run(helper);\n',
    "src/node/helper.ts": 'import { join } from "node:path";\nexport const helper = join("a", "b");\n',
    "src/orchestrator/run.ts": 'import { c } from "../util/c.ts";\nexport const run = (x: string) => x + c;\n',
    "src/cli/main.ts": 'export const gw = () => import("../../services/gateway/cli.ts");\n',
    "services/gateway/cli.ts": 'import { boot } from "../../src/node/boot.ts";\nexport default boot;\n',
    // planted: ffi imports the node (upward), net imports tools (same rank), util c <-> d (cycle, type-only one way)
    "src/ffi/sys.ts": 'import { boot } from "../node/boot.ts";\nexport const sys = boot;\n',
    "src/net/slot.ts": 'export type { Drive } from "../tools/drive.ts";\n',
    "src/tools/drive.ts": "export interface Drive { path: string }\n",
    "src/util/c.ts": 'import type { D } from "./d.ts";\nexport const c: D = "c";\n',
    "src/util/d.ts": 'export type D = string;\nexport const lazyC = () => import("./c.ts");\n',
  });
  const imports = readImports(root, ROOTS);
  expect(imports.filter((i) => i.to.startsWith("unresolved:")).map(show)).toEqual([]);
  const rank = (unit: string) => unitOf(`${unit}/x.ts`)!.rank;
  expect(rank("src/net")).toBe(rank("src/tools"));
  expect(layerViolations(imports)).toEqual([
    `src/ffi/sys.ts -> src/node/boot.ts (src/ffi rank ${rank("src/ffi")} -> src/node rank ${rank("src/node")})`,
    `src/net/slot.ts -> src/tools/drive.ts (src/net rank ${rank("src/net")} -> src/tools rank ${rank("src/tools")})`,
  ]);
  expect(fileCycles(imports)).toEqual([["src/util/c.ts", "src/util/d.ts"]]);
});
