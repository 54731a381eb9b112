// The documentation: README.md stays short (at most 200 lines) and links every page of docs/;
// every page opens with a title and a paragraph saying what a reader comes for; and every
// relative link and anchor in README.md and docs/*.md resolves (a file that exists, a heading
// that exists in it, anchors as GitHub makes them).
import { expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

const ROOT = join(import.meta.dir, "..");
const PAGES = ["README.md", ...readdirSync(join(ROOT, "docs")).filter((f) => f.endsWith(".md")).map((f) => `docs/${f}`)];

/** Markdown without fenced code blocks (their text is not headings or links). */
function prose(md: string): string {
  return md.replace(/^```[\s\S]*?^```/gm, "");
}

/** GitHub's anchor of a heading: lower case, formatting and punctuation dropped, spaces to hyphens. */
export function slug(heading: string): string {
  return heading
    .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/[`*_]/g, "")
    .toLowerCase()
    .replace(/[^\p{L}\p{N} -]/gu, "")
    .replace(/ /g, "-");
}

/** Every anchor of a page (duplicates numbered as GitHub does). */
function anchors(file: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const m of prose(readFileSync(file, "utf8")).matchAll(/^#{1,6} +(.+?) *#*$/gm)) {
    const s = slug(m[1]!);
    const n = seen.get(s) ?? 0;
    out.add(n ? `${s}-${n}` : s);
    seen.set(s, n + 1);
  }
  return out;
}

/** Relative links of a page: [text](target), with the line they are on. */
function links(md: string): { target: string; line: number }[] {
  const out: { target: string; line: number }[] = [];
  prose(md)
    .split("\n")
    .forEach((l, i) => {
      for (const m of l.replace(/`[^`]*`/g, "").matchAll(/\]\(([^)\s]+)\)/g)) {
        if (!/^[a-z][a-z0-9+.-]*:/i.test(m[1]!)) out.push({ target: m[1]!, line: i + 1 });
      }
    });
  return out;
}

test("slugs follow GitHub's rules", () => {
  expect(slug("VMs, guest kernel, base template")).toBe("vms-guest-kernel-base-template");
  expect(slug("Per-sandbox vCPUs and memory")).toBe("per-sandbox-vcpus-and-memory");
  expect(slug("The `[console]` section: *what* it does")).toBe("the-console-section-what-it-does");
});

test("README.md is at most 200 lines and links every docs page", () => {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  expect(readme.trimEnd().split("\n").length).toBeLessThanOrEqual(200);
  const linked = new Set(links(readme).map((l) => resolve(ROOT, l.target.split("#")[0]!)));
  const unlinked = PAGES.filter((p) => p.startsWith("docs/") && !linked.has(join(ROOT, p)));
  expect(unlinked).toEqual([]);
});

test("every docs page opens with a title and a paragraph saying what a reader comes for", () => {
  for (const p of PAGES.filter((x) => x.startsWith("docs/"))) {
    const [title, ...rest] = readFileSync(join(ROOT, p), "utf8").split("\n");
    expect({ p, title: /^# \S/.test(title!) }).toEqual({ p, title: true });
    const first = rest.find((l) => l.trim() !== "") ?? "";
    expect({ p, opensWithProse: /^[A-Za-z`"(]/.test(first) && !/^(#|- |\* |```|\|)/.test(first) }).toEqual({ p, opensWithProse: true });
  }
});

test("every relative link and anchor in README.md and docs/*.md resolves", () => {
  const broken: string[] = [];
  for (const p of PAGES) {
    const file = join(ROOT, p);
    for (const { target, line } of links(readFileSync(file, "utf8"))) {
      const [path, anchor] = target.split("#") as [string, string | undefined];
      const to = path === "" ? file : resolve(dirname(file), decodeURIComponent(path));
      if (!existsSync(to)) {
        broken.push(`${p}:${line}: ${target}: no file ${relative(ROOT, to)}`);
        continue;
      }
      if (anchor !== undefined && (statSync(to).isDirectory() || !to.endsWith(".md") || !anchors(to).has(anchor))) broken.push(`${p}:${line}: ${target}: no heading #${anchor} in ${relative(ROOT, to)}`);
    }
  }
  expect(broken).toEqual([]);
  // the check sees links at all
  expect(PAGES.flatMap((p) => links(readFileSync(join(ROOT, p), "utf8"))).length).toBeGreaterThan(30);
});
