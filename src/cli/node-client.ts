/**
 * How the CLI's node clients (`agentenv sandbox ...`, `snapshot`, `template`, completions) reach a
 * node's API: the URL and key (--url, AENV_API_URL or E2B_API_URL, else `[api] addr` with a
 * wildcard host as 127.0.0.1; --key, AENV_API_KEY or E2B_API_KEY, else $home_path/api-key), one
 * JSON call, a text table, and how a refusal ends the command.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfigOrExit } from "../node/load-config.ts";
import { errorMessage } from "../util/error.ts";

/** A node's API: base URL (no trailing slash) and API key. */
export interface Conn {
  url: string;
  key: string;
}

/** Flags every node client command takes. */
export const common = {
  url: { type: "string", description: "node URL (AENV_API_URL / E2B_API_URL)" },
  key: { type: "string", description: "API key (AENV_API_KEY / E2B_API_KEY / $home_path/api-key)" },
  config: { type: "string", description: "config file (for the default URL and key file)" },
} as const;

/** A user-facing failure: printed as `error: <message>`, exit status 1. `status`: the API's answer, when it refused. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly status?: number,
  ) {
    super(message);
  }
}

/**
 * The node's URL when none is given: `[api] addr` (AENV_API_ADDR) with a wildcard host
 * (0.0.0.0, ::, empty) replaced by 127.0.0.1.
 */
export function defaultNodeUrl(addr: string): string {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d{1,5})$/.exec(addr);
  if (!m) throw new CliError(`invalid [api] addr / AENV_API_ADDR ${JSON.stringify(addr)}: expected host:port`);
  const host = m[1] ?? m[2] ?? "";
  const shown = host === "" || host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host;
  return `http://${shown.includes(":") ? `[${shown}]` : shown}:${m[3]}`;
}

/**
 * Node URL and API key from flags, environment, config and `$home_path/api-key`.
 * @throws CliError when no key can be found.
 */
export function conn(args: { url?: string; key?: string; config?: string }): Conn {
  const cfg = loadConfigOrExit({ path: args.config });
  const url = (args.url || process.env.AENV_API_URL || process.env.E2B_API_URL || defaultNodeUrl(cfg.api.addr)).replace(/\/$/, "");
  let key = args.key ?? process.env.AENV_API_KEY ?? process.env.E2B_API_KEY ?? cfg.api.key;
  if (!key) {
    const f = join(cfg.home_path, "api-key");
    if (!existsSync(f)) throw new CliError(`no API key: pass --key, set AENV_API_KEY, or run on the node (${f} not found)`);
    key = readFileSync(f, "utf8").trim();
  }
  return { url, key };
}

/**
 * One API call; JSON body in and out.
 * @throws CliError when the node is unreachable or answers >= 400 (`METHOD path: status message`).
 */
export async function call(c: Conn, method: string, path: string, body?: unknown): Promise<{ status: number; data: unknown; headers: Headers }> {
  let res: Response;
  try {
    res = await fetch(c.url + path, {
      method,
      headers: { "x-api-key": c.key, ...(body === undefined ? {} : { "content-type": "application/json" }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    throw new CliError(`cannot reach the node at ${c.url}: ${errorMessage(e)}`);
  }
  const text = await res.text();
  let data: unknown = text;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    // not JSON
  }
  if (res.status >= 400) {
    const msg = (data as { message?: string } | null)?.message ?? text;
    throw new CliError(`${method} ${path}: ${res.status} ${msg}`, res.status);
  }
  return { status: res.status, data, headers: res.headers };
}

/** Render rows as an aligned text table. */
export function table(head: string[], rows: string[][]): string {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (r: string[]) => r.map((c, i) => c.padEnd(w[i]!)).join("  ").trimEnd();
  return [line(head), ...rows.map(line)].join("\n");
}

/** Run a command body: CliError -> `error: ...` on stderr and exit 1. */
export function run(fn: () => Promise<void>): Promise<void> {
  return fn().catch((e) => {
    if (e instanceof CliError) {
      console.error(`error: ${e.message}`);
      process.exit(1);
    }
    throw e;
  });
}
