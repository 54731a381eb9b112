/**
 * No module-level mutable state in src/ or services/ (issue 14: a cache, a counter or a last
 * sample at module level is shared by every instance and every test in the process, and
 * outlives the owner that should reset it). Each file is parsed with the TypeScript compiler
 * and these are refused:
 *  - a top-level `let` or `var`;
 *  - a top-level `const` holding a container (`new ...`, `[...]`, `{...}`) that the file
 *    mutates: a mutating method (set, add, push, fill, splice, setUint32, ...), an assignment,
 *    `++`/`--` or `delete` on one of its elements or properties, or `Object.assign` into it;
 *  - a `static` class field that is not `readonly`.
 * State belongs in the object that owns it (e.g. `KernelKeys` in src/sandbox/capture.ts, a
 * `VmRuntime` field). ALLOWED lists the exceptions, each with why.
 */
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join, relative } from "node:path";
import * as ts from "typescript";

const REPO = join(import.meta.dir, "..");

/** `file: name` exceptions, each with its reason. */
const ALLOWED: Record<string, string> = {
  // the one libc binding, opened on first use in each thread (a worker thread has its own
  // module instance): a handle to the process's libc, not state that differs between owners
  "src/ffi/libc.ts: bound": "lazily opened libc handle",
  "src/ffi/libc.ts: pty": "lazily opened openpty handle",
  // one epoll thread watches every pidfd the process holds (thousands of adopted VMMs cost one
  // thread); it starts with the first watch and stops when none is left, so no owner outlives it
  "src/ffi/pidfd-watch.ts: current": "the process-wide pidfd watcher thread",
  "src/ffi/pidfd-watch.ts: nextToken": "epoll token counter of that watcher",
};

const MUTATORS = new Set(["set", "add", "delete", "clear", "push", "pop", "shift", "unshift", "splice", "sort", "reverse", "fill", "copyWithin"]);

/** The findings of one source text: `name (what)` for each piece of module-level mutable state. */
function mutableState(file: string, text: string): string[] {
  const sf = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
  const out: string[] = [];
  const containers = new Set<string>();
  for (const st of sf.statements) {
    if (ts.isVariableStatement(st)) {
      const flags = st.declarationList.flags;
      for (const d of st.declarationList.declarations) {
        const name = d.name.getText(sf);
        if (!(flags & ts.NodeFlags.Const)) {
          out.push(`${name} (top-level ${flags & ts.NodeFlags.Let ? "let" : "var"})`);
          continue;
        }
        let init = d.initializer;
        while (init && (ts.isAsExpression(init) || ts.isSatisfiesExpression(init) || ts.isParenthesizedExpression(init) || ts.isTypeAssertionExpression(init))) init = init.expression;
        if (init && (ts.isNewExpression(init) || ts.isArrayLiteralExpression(init) || ts.isObjectLiteralExpression(init)) && ts.isIdentifier(d.name)) containers.add(name);
      }
    }
    if (ts.isClassDeclaration(st)) {
      for (const m of st.members) {
        const mods = ts.canHaveModifiers(m) ? (ts.getModifiers(m) ?? []) : [];
        const isStatic = mods.some((x) => x.kind === ts.SyntaxKind.StaticKeyword);
        const isReadonly = mods.some((x) => x.kind === ts.SyntaxKind.ReadonlyKeyword);
        if (ts.isPropertyDeclaration(m) && isStatic && !isReadonly) out.push(`${st.name?.text ?? "class"}.${m.name.getText(sf)} (static field, not readonly)`);
      }
    }
  }
  // what is written through a module-level container, anywhere in the file (functions included)
  const owner = (e: ts.Expression): string | undefined => {
    if ((ts.isPropertyAccessExpression(e) || ts.isElementAccessExpression(e)) && ts.isIdentifier(e.expression) && containers.has(e.expression.text)) return e.expression.text;
    return undefined;
  };
  const hits = new Map<string, string>();
  const visit = (n: ts.Node): void => {
    if (ts.isCallExpression(n) && ts.isPropertyAccessExpression(n.expression)) {
      const target = n.expression.expression;
      const method = n.expression.name.text;
      if (ts.isIdentifier(target) && containers.has(target.text) && (MUTATORS.has(method) || /^set[A-Z]/.test(method))) hits.set(target.text, `.${method}()`);
      if (ts.isIdentifier(target) && target.text === "Object" && method === "assign" && n.arguments[0] && ts.isIdentifier(n.arguments[0]) && containers.has(n.arguments[0].text)) hits.set(n.arguments[0].text, "Object.assign");
    }
    if (ts.isBinaryExpression(n) && n.operatorToken.kind >= ts.SyntaxKind.FirstAssignment && n.operatorToken.kind <= ts.SyntaxKind.LastAssignment) {
      const o = owner(n.left);
      if (o) hits.set(o, "assigned");
    }
    if ((ts.isPrefixUnaryExpression(n) || ts.isPostfixUnaryExpression(n)) && (n.operator === ts.SyntaxKind.PlusPlusToken || n.operator === ts.SyntaxKind.MinusMinusToken)) {
      const o = owner(n.operand);
      if (o) hits.set(o, "++/--");
    }
    if (ts.isDeleteExpression(n)) {
      const o = owner(n.expression);
      if (o) hits.set(o, "delete");
    }
    ts.forEachChild(n, visit);
  };
  visit(sf);
  for (const [name, how] of hits) out.push(`${name} (module-level container, ${how})`);
  return out;
}

function scan(dirs: string[]): string[] {
  const found: string[] = [];
  for (const dir of dirs) {
    for (const f of new Bun.Glob("**/*.ts").scanSync(join(REPO, dir))) {
      const file = join(REPO, dir, f);
      for (const s of mutableState(file, readFileSync(file, "utf8"))) found.push(`${relative(REPO, file)}: ${s}`);
    }
  }
  return found;
}

test("the scanner finds each kind of module-level mutable state, and leaves constants and owned state alone", () => {
  const text = `
    let counter = 0;
    var legacy = 1;
    const cache = new Map<string, number>();
    const seen = new Set<string>();
    const list: number[] = [];
    const stats = { n: 0 };
    const cfg = { a: 1 } as const;
    const view = new DataView(new ArrayBuffer(8));
    const table = new Uint16Array(16);
    const names = new Map([["a", 1]]);
    export class K { static n = 0; static readonly max = 3; private readonly own = new Map<string, number>(); put() { this.own.set("a", 1); } }
    export function f(k: string) {
      cache.set(k, 1); seen.add(k); list.push(1); stats.n++; view.setUint32(0, 1); table[0] = 1;
      return cfg.a + (names.get(k) ?? 0);
    }`;
  expect(mutableState("x.ts", text).sort()).toEqual(
    [
      "counter (top-level let)",
      "legacy (top-level var)",
      "cache (module-level container, .set())",
      "seen (module-level container, .add())",
      "list (module-level container, .push())",
      "stats (module-level container, ++/--)",
      "view (module-level container, .setUint32())",
      "table (module-level container, assigned)",
      "K.n (static field, not readonly)",
    ].sort(),
  );
});

test("src/ and services/ hold no module-level mutable state beyond the listed exceptions", () => {
  const found = scan(["src", "services"]);
  const key = (s: string) => s.slice(0, s.indexOf(" ("));
  expect(found.filter((s) => !(key(s) in ALLOWED))).toEqual([]);
  // every exception is still needed (a stale entry would hide a new finding of the same name)
  expect(Object.keys(ALLOWED).filter((k) => !found.some((s) => key(s) === k))).toEqual([]);
});
