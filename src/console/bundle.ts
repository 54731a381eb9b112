/**
 * Build-time bundling of the browser console, used as a Bun macro (`import ... with { type:
 * "macro" }` in assets.ts): it runs when assets.ts is transpiled — by `bun build --compile`, so
 * the single binary carries the result and needs nothing at run time, or by `bun` when run from
 * source. It bundles web/main.tsx (Preact, xterm.js, uPlot from node_modules) with `bun build`
 * (a macro may not call Bun.build itself), split so that the terminal (xterm.js) and the charts
 * (uPlot) load only on the pages that show them, names every file by its content hash, and joins
 * the style sheets. Nothing is fetched from the network.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const ROOT = join(import.meta.dir, "../..");
/** Style sheets of the page, in order: the libraries', then ours. */
const CSS_FILES = ["node_modules/@xterm/xterm/css/xterm.css", "node_modules/uplot/dist/uPlot.min.css", "src/console/web/style.css"];

/** The console's script files (served side by side; `entry` loads the others) and its style sheet. */
export interface ConsoleBundle {
  /** File name -> JavaScript text. */
  scripts: Record<string, string>;
  /** The file the page loads. */
  entry: string;
  css: string;
}

/** Bundle the console. @throws Error with bun build's output when the bundle fails. */
export function consoleBundle(): ConsoleBundle {
  const out = mkdtempSync(join(tmpdir(), "aenv-console-"));
  try {
    const r = Bun.spawnSync(
      [
        process.execPath,
        "build",
        join(ROOT, "src/console/web/main.tsx"),
        "--target=browser",
        "--format=esm",
        "--minify",
        "--splitting",
        "--jsx-runtime=automatic",
        "--jsx-import-source=preact",
        `--outdir=${out}`,
        "--entry-naming=[name]-[hash].[ext]",
        "--chunk-naming=chunk-[hash].[ext]",
      ],
      { cwd: ROOT, stdout: "pipe", stderr: "pipe", env: { ...process.env, NODE_ENV: "production" } },
    );
    if (r.exitCode !== 0) throw new Error(`bundling the console failed: ${r.stderr.toString()}${r.stdout.toString().slice(0, 2000)}`);
    const scripts: Record<string, string> = {};
    for (const f of readdirSync(out)) if (f.endsWith(".js")) scripts[f] = readFileSync(join(out, f), "utf8");
    const entry = Object.keys(scripts).find((f) => f.startsWith("main-"));
    if (!entry) throw new Error(`bundling the console wrote no main-*.js: ${Object.keys(scripts).join(", ")}`);
    return { scripts, entry, css: CSS_FILES.map((f) => readFileSync(join(ROOT, f), "utf8")).join("\n") };
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
}
