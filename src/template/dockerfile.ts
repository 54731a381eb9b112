/**
 * Dockerfile → template build steps, as the E2B SDK's `fromDockerfile` maps them
 * (../shared/docs/template-build.md §1): FROM is the base; RUN, COPY/ADD, ENV/ARG, WORKDIR, USER
 * become steps; CMD/ENTRYPOINT become the start command (ready check: `sleep 20`, E2B's
 * `waitForTimeout(20000)`); `USER root` + `WORKDIR /` are prepended and `USER user` +
 * `WORKDIR /home/user` appended when the file sets neither. Unlike the SDK (which drops them with
 * a warning), any other instruction is kept as a step of its own type, so the build ends in
 * `error` naming it. Line continuations (`\`), comments, JSON-array (exec) forms,
 * `COPY --chown=user[:group]` and `--chmod=` are understood.
 */
import { TemplateError } from "./errors.ts";
import type { BuildStep } from "./spec.ts";

/** A parsed Dockerfile. `copies` lists the COPY sources (relative to the context) in step order. */
export interface ParsedDockerfile {
  fromImage: string;
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

/** Split `k=v k2="v 2"` (ENV/ARG key=value form), honouring double and single quotes. */
function keyValues(s: string): [string, string][] {
  const out: [string, string][] = [];
  const re = /([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|'[^']*'|\S*)/g;
  for (const m of s.matchAll(re)) {
    let v = m[2]!;
    if (v.startsWith('"')) v = v.slice(1, -1).replace(/\\(.)/g, "$1");
    else if (v.startsWith("'")) v = v.slice(1, -1);
    out.push([m[1]!, v]);
  }
  return out;
}

/**
 * Parse `text`. `filesHash(src, dest)` gives the hash of a COPY's files (the caller packs and
 * uploads them).
 * @throws TemplateError `template.bad_request` for a file without FROM, a second FROM
 *   (multi-stage builds are not supported) or a malformed instruction, naming its line.
 */
export function parseDockerfile(text: string, filesHash: (src: string, dest: string) => string): ParsedDockerfile {
  let fromImage = "";
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
    if (kw !== "FROM" && kw !== "ARG" && !fromImage) bad(line, `${kw} before FROM`);
    switch (kw) {
      case "FROM": {
        if (fromImage) bad(line, "a second FROM: multi-stage builds are not supported");
        const parts = rest.split(/\s+/).filter((p) => !p.startsWith("--"));
        if (!parts[0]) bad(line, "FROM needs an image");
        fromImage = parts[0]!;
        break;
      }
      case "RUN": {
        const ex = execForm(rest);
        if (!rest) bad(line, "RUN needs a command");
        steps.push({ type: "RUN", args: [ex ? ex.map(shellQuote).join(" ") : rest], force: false });
        break;
      }
      case "COPY":
      case "ADD": {
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
        if (!fromImage) break; // an ARG before FROM only parameterises FROM (not supported here)
        let pairs = keyValues(rest);
        if (pairs.length === 0) {
          const sp = /^(\S+)\s+(.*)$/.exec(rest);
          if (kw === "ENV" && !sp) bad(line, "ENV needs a value");
          pairs = sp ? [[sp[1]!, sp[2]!]] : [];
          if (kw === "ARG" && !sp) break; // ARG NAME without a default: nothing to set
        }
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
  if (!fromImage) throw new TemplateError("template.bad_request", "Dockerfile has no FROM", {});
  if (!setUser) steps.push({ type: "USER", args: ["user"], force: false });
  if (!setWorkdir) steps.push({ type: "WORKDIR", args: ["/home/user"], force: false });
  const argv = [...(entrypoint ?? []), ...(cmd ?? [])];
  if (argv.length) startCmd = argv.map(shellQuote).join(" ");
  return { fromImage, steps, startCmd, readyCmd: startCmd ? "sleep 20" : "" };
}
