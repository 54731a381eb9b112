/**
 * Serving the console at `/console/` (node and gateway alike): the page (never cached), its
 * script and style sheet under content-hashed names (cached for good), gzip when the client
 * takes it, and headers that keep the page to its own origin (CSP, no framing, no referrer).
 * The page and its files are public (they hold no secret); everything they show comes from the
 * API with the key the operator types in, kept in the tab's sessionStorage.
 */
import type { ConsoleFile } from "./assets.ts";

/** What the page is told about where it runs. */
export interface SiteOptions {
  /** "node" or "gateway" (the nodes page shows the cluster from a gateway). */
  role: "node" | "gateway";
  /** How often lists and charts refresh, ms (config `[console] refresh_ms`). */
  refreshMs: number;
}

/** Prefix of every console path. */
export const CONSOLE_PREFIX = "/console";

const SECURITY_HEADERS = {
  // xterm.js and uPlot set style attributes: inline styles, nothing else inline
  "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
};

const escapeAttr = (s: string) => s.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;");

/** Whether `pathname` belongs to the console (the listener serves it without a key). */
export function isConsolePath(pathname: string): boolean {
  return pathname === CONSOLE_PREFIX || pathname.startsWith(`${CONSOLE_PREFIX}/`);
}

/** The console's files for one listener; the bundle is loaded on the first request. */
export class ConsoleSite {
  private loaded?: Promise<{ page: ConsoleFile; files: Map<string, ConsoleFile> }>;

  constructor(private readonly o: SiteOptions) {}

  /** Load the bundle now (a listener calls it at start so the first page view does not wait). */
  preload(): void {
    void this.load().catch(() => {});
  }

  /**
   * Answer a console path (GET/HEAD): the page, a bundle file, or 404.
   * @returns null when `url` is not a console path.
   */
  async fetch(req: Request, url: URL): Promise<Response | null> {
    if (!isConsolePath(url.pathname)) return null;
    if (req.method !== "GET" && req.method !== "HEAD") return Response.json({ code: 405, message: "the console serves GET only" }, { status: 405, headers: { allow: "GET, HEAD" } });
    if (url.pathname === CONSOLE_PREFIX) return new Response(null, { status: 301, headers: { location: `${CONSOLE_PREFIX}/` } });
    const { page, files } = await this.load();
    const rel = url.pathname.slice(CONSOLE_PREFIX.length + 1);
    if (rel === "" || rel === "index.html") return this.send(req, page, "no-store");
    const f = rel.startsWith("assets/") ? files.get(rel.slice(7)) : undefined;
    if (!f) return Response.json({ code: 404, message: `no console file ${url.pathname}` }, { status: 404 });
    return this.send(req, f, "public, max-age=31536000, immutable");
  }

  private send(req: Request, f: ConsoleFile, cache: string): Response {
    const gz = /\bgzip\b/.test(req.headers.get("accept-encoding") ?? "");
    const body = gz ? f.gzip : f.body;
    return new Response(req.method === "HEAD" ? null : body, {
      headers: { ...SECURITY_HEADERS, "content-type": f.type, "cache-control": cache, vary: "accept-encoding", "content-length": String(body.length), ...(gz ? { "content-encoding": "gzip" } : {}) },
    });
  }

  private load() {
    return (this.loaded ??= import("./assets.ts").then(({ bundleFiles, consoleFile }) => {
      const b = bundleFiles();
      const html = `<!doctype html>
<html lang="en" data-role="${escapeAttr(this.o.role)}" data-refresh-ms="${this.o.refreshMs}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>AgentENV console</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="${CONSOLE_PREFIX}/assets/${b.css}">
<script type="module" src="${CONSOLE_PREFIX}/assets/${b.entry}"></script>
</head>
<body><div id="app"></div></body>
</html>
`;
      return { page: consoleFile(html, "text/html; charset=utf-8"), files: b.files };
    }));
  }
}
