/**
 * Dockerfile → template build steps, as the E2B SDK's `fromDockerfile` maps them
 * (../shared/docs/template-build.md §1): FROM is the base (what it names, a template of the node
 * or an image, is the node's to decide: spec.ts dockerfileBase); RUN, COPY/ADD, ENV/ARG, WORKDIR, USER
 * become steps; CMD/ENTRYPOINT become the start command (ready check: `sleep 20`, E2B's
 * `waitForTimeout(20000)`); `USER root` + `WORKDIR /` are prepended and `USER user` +
 * `WORKDIR /home/user` appended when the file sets neither. Unlike the SDK (which drops them with
 * a warning), any other instruction is kept as a step of its own type, so the build ends in
 * `error` naming it. Line continuations (`\`), comments, JSON-array (exec) forms,
 * `COPY --chown=user[:group]` and `--chmod=` are understood; BuildKit's `RUN --mount=...` (any
 * RUN flag) and here-documents are refused naming the line (they would run as other shell text).
 */
import { TemplateError } from "./errors.ts";
import type { BuildStep } from "./spec.ts";

/** A parsed Dockerfile. */
export interface ParsedDockerfile {
  /** FROM's argument as written: sent to the node as the build's `from` (spec.ts dockerfileBase). */
  from: string;
  steps: BuildStep[];
  startCmd: string;
  readyCmd: string;
}

/** Logical lines: continuations joined, comments and blank lines dropped, with their first line number. */
function logicalLines(text: string): { line: number; text: string }[] {
  const out: { line: number; text: string }[] = [];
  let cur = "";
  let start = 0;
  text.split(/\r?\n/).forEach((raw, i) => {
    if (!cur && /^\s*#/.test(raw)) return;
    if (!cur) start = i + 1;
    if (/\\\s*$/.test(raw)) {
      cur += raw.replace(/\\\s*$/, "") + " ";
      return;
    }
    cur += raw;
    if (cur.trim()) out.push({ line: start, text: cur.trim() });
    cur = "";
  });
  if (cur.trim()) out.push({ line: start, text: cur.trim() });
  return out;
}

/** `["a","b"]` → [a, b]; anything else → null (shell form). */
function execForm(s: string): string[] | null {
  if (!s.startsWith("[")) return null;
  try {
    const v = JSON.parse(s);
    return Array.isArray(v) && v.every((x) => typeof x === "string") ? v : null;
  } catch {
    return null;
  }
}

const shellQuote = (s: string) => (/^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);

/**
 * Split an instruction's text into words as Docker does for ENV/ARG: unquoted whitespace
 * separates, double quotes (with backslash escapes) and single quotes group and are removed, a
 * backslash outside quotes escapes the next character. @returns null for an unterminated quote.
 */
export function dockerWords(s: string): string[] | null {
  const out: string[] = [];
  let cur = "";
  let inWord = false;
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (/\s/.test(c)) {
      if (inWord) out.push(cur);
      cur = "";
      inWord = false;
      continue;
    }
    inWord = true;
    if (c === "\\" && i + 1 < s.length) cur += s[++i];
    else if (c === "'") {
      const end = s.indexOf("'", i + 1);
      if (end < 0) return null;
      cur += s.slice(i + 1, end);
      i = end;
    } else if (c === '"') {
      let j = i + 1;
      for (; j < s.length && s[j] !== '"'; j++) cur += s[j] === "\\" && j + 1 < s.length ? s[++j] : s[j];
      if (j >= s.length) return null;
      i = j;
    } else cur += c;
  }
  if (inWord) out.push(cur);
  return out;
}

/**
 * ENV/ARG pairs: `K=V [K2="v 2" ...]` when the first word holds `=` (then every word must), else
 * the legacy `ENV K the rest is the value` (for ENV) or a bare `ARG NAME` (no default: none).
 * @returns pairs, or a reason the text is malformed.
 */
function envPairs(kw: string, rest: string): [string, string][] | string {
  const words = dockerWords(rest);
  if (!words || words.length === 0) return `${kw} needs a value`;
  if (!words[0]!.includes("=")) {
    if (kw === "ARG") return words.length === 1 && /^[A-Za-z_][A-Za-z0-9_]*$/.test(words[0]!) ? [] : `ARG ${words[0]} takes no value without '='`;
    const sp = /^(\S+)\s+(.*)$/s.exec(rest);
    if (!sp) return "ENV needs a value";
    return [[sp[1]!, sp[2]!]];
  }
  const pairs: [string, string][] = [];
  for (const w of words) {
    const m = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/s.exec(w);
    if (!m) return `${kw} ${JSON.stringify(w)} is not KEY=VALUE`;
    pairs.push([m[1]!, m[2]!]);
  }
  return pairs;
}

/** A here-document (`<<EOF`, `<<-"EOF"`; not `<<<` here-strings or arithmetic `1<<2`). */
const HEREDOC_RE = /(?<!<)<<(?!<)-?\s*["']?[A-Za-z_]/;

/**
 * Parse `text`. `filesHash(src, dest)` gives the hash of a COPY's files (the caller packs and
 * uploads them).
 * @throws TemplateError `template.bad_request` for a file without FROM, a second FROM
 *   (multi-stage builds are not supported) or a malformed instruction, naming its line.
 */
export function parseDockerfile(text: string, filesHash: (src: string, dest: string) => string): ParsedDockerfile {
  let from = "";
  const steps: BuildStep[] = [{ type: "USER", args: ["root"], force: false }, { type: "WORKDIR", args: ["/"], force: false }];
  let startCmd = "";
  let entrypoint: string[] | null = null;
  let cmd: string[] | null = null;
  let setUser = false;
  let setWorkdir = false;
  const bad = (line: number, why: string): never => {
    throw new TemplateError("template.bad_request", `Dockerfile line ${line}: ${why}`, { line });
  };
  for (const { line, text: l } of logicalLines(text)) {
    const m = /^(\S+)\s*(.*)$/.exec(l)!;
    const kw = m[1]!.toUpperCase();
    const rest = m[2]!.trim();
    if (kw !== "FROM" && kw !== "ARG" && !from) bad(line, `${kw} before FROM`);
    switch (kw) {
      case "FROM": {
        if (from) bad(line, "a second FROM: multi-stage builds are not supported");
        const parts = rest.split(/\s+/).filter((p) => !p.startsWith("--"));
        if (!parts[0]) bad(line, "FROM needs an image");
        from = parts[0]!;
        break;
      }
      case "RUN": {
        const ex = execForm(rest);
        if (!rest) bad(line, "RUN needs a command");
        // BuildKit's RUN flags and here-documents change what runs: refused, never run as shell text
        if (!ex && /^--[a-z]/.test(rest)) bad(line, `RUN flag ${rest.split(/\s/)[0]} is not supported`);
        if (!ex && HEREDOC_RE.test(rest)) bad(line, "RUN with a here-document (<<) is not supported");
        steps.push({ type: "RUN", args: [ex ? ex.map(shellQuote).join(" ") : rest], force: false });
        break;
      }
      case "COPY":
      case "ADD": {
        if (HEREDOC_RE.test(rest)) bad(line, `${kw} with a here-document (<<) is not supported`);
        const words = execForm(rest) ?? rest.split(/\s+/);
        let owner = "";
        let mode = "";
        const plain: string[] = [];
        for (const w of words) {
          if (w.startsWith("--chown=")) owner = w.slice(8).split(":")[0]!;
          else if (w.startsWith("--chmod=")) mode = w.slice(8);
          else if (w.startsWith("--")) bad(line, `${kw} flag ${w} is not supported`);
          else plain.push(w);
        }
        if (plain.length < 2) bad(line, `${kw} needs a source and a destination`);
        const dest = plain.pop()!;
        for (const src of plain) steps.push({ type: "COPY", args: [src, dest, owner, mode], filesHash: filesHash(src, dest), force: false });
        break;
      }
      case "ENV":
      case "ARG": {
        if (!from) break; // an ARG before FROM only parameterises FROM (not supported here)
        const pairs = envPairs(kw, rest);
        if (typeof pairs === "string") {
          bad(line, pairs);
          break;
        }
        if (pairs.length === 0) break; // ARG NAME without a default: nothing to set
        steps.push({ type: "ENV", args: pairs.flat(), force: false });
        break;
      }
      case "WORKDIR":
        if (!rest) bad(line, "WORKDIR needs a path");
        steps.push({ type: "WORKDIR", args: [rest], force: false });
        setWorkdir = true;
        break;
      case "USER":
        if (!rest) bad(line, "USER needs a name");
        steps.push({ type: "USER", args: [rest.split(":")[0]!], force: false });
        setUser = true;
        break;
      case "CMD":
        cmd = execForm(rest) ?? ["/bin/sh", "-c", rest];
        break;
      case "ENTRYPOINT":
        entrypoint = execForm(rest) ?? ["/bin/sh", "-c", rest];
        break;
      default:
        steps.push({ type: kw, args: rest ? [rest] : [], force: false });
    }
  }
  if (!from) throw new TemplateError("template.bad_request", "Dockerfile has no FROM", {});
  if (!setUser) steps.push({ type: "USER", args: ["user"], force: false });
  if (!setWorkdir) steps.push({ type: "WORKDIR", args: ["/home/user"], force: false });
  const argv = [...(entrypoint ?? []), ...(cmd ?? [])];
  if (argv.length) startCmd = argv.map(shellQuote).join(" ");
  return { from, steps, startCmd, readyCmd: startCmd ? "sleep 20" : "" };
}
