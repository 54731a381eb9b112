/**
 * The console's files as served: its scripts and style sheet from the `consoleBundle` macro
 * (bundle.ts), inlined here when this module is transpiled. Every name carries its content hash
 * (the scripts' from the bundler, the style sheet's from here), so they are cached for good.
 * Gzip copies are made once, on first use.
 */
import { consoleBundle } from "./bundle.ts" with { type: "macro" };

const BUNDLE = consoleBundle();

/** One served file. */
export interface ConsoleFile {
  body: Uint8Array;
  gzip: Uint8Array;
  type: string;
}

/** A served file of `text`. */
export function consoleFile(text: string, type: string): ConsoleFile {
  const body = new TextEncoder().encode(text);
  return { body, gzip: Bun.gzipSync(body, { level: 9 }), type };
}

/** The bundle's files keyed by their served name; `entry` and `css` are the ones the page names. */
export function bundleFiles(): { entry: string; css: string; files: Map<string, ConsoleFile> } {
  const css = `app-${new Bun.CryptoHasher("sha256").update(BUNDLE.css).digest("hex").slice(0, 12)}.css`;
  const files = new Map<string, ConsoleFile>([[css, consoleFile(BUNDLE.css, "text/css; charset=utf-8")]]);
  for (const [name, text] of Object.entries(BUNDLE.scripts)) files.set(name, consoleFile(text, "text/javascript; charset=utf-8"));
  return { entry: BUNDLE.entry, css, files };
}
