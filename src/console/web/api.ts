/**
 * The console's API client: the node's (or gateway's) E2B API on the page's own origin, with the
 * key the operator typed in (kept in this tab's sessionStorage, sent as X-API-Key, never put in
 * a URL). A 401 forgets the key and shows the login again. Sandbox internals (files, processes)
 * go to envd through the sandbox proxy (`/proxy/{id}/49983/...`), authorised by the sandbox's
 * envd access token, as the SDKs do.
 */

const KEY_ITEM = "agentenv.apiKey";
/** envd's port in every sandbox (src/envd/version.ts). */
export const ENVD_PORT = 49983;

/** A refused or failed API call: status, E2B's message and AgentENV's error code when given. */
export class ApiFailure extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly code: string | null,
  ) {
    super(message);
  }
}

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY_ITEM);
}

/** Forget the key (logout, or a 401) and tell the app. */
export function forgetKey(): void {
  sessionStorage.removeItem(KEY_ITEM);
  window.dispatchEvent(new Event("agentenv:logout"));
}

/**
 * Check `key` against the API and keep it for this tab when it is accepted.
 * @returns null when accepted, else why not (the API's message).
 */
export async function login(key: string): Promise<string | null> {
  const res = await fetch("/v2/sandboxes?limit=1", { headers: { "x-api-key": key } });
  if (res.ok) {
    sessionStorage.setItem(KEY_ITEM, key);
    return null;
  }
  const body = (await res.json().catch(() => null)) as { message?: string } | null;
  return body?.message ?? `HTTP ${res.status}`;
}

async function failure(res: Response): Promise<ApiFailure> {
  const text = await res.text();
  let body: { message?: string; error_code?: string } | null = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON
  }
  return new ApiFailure(res.status, body?.message ?? (text.slice(0, 300) || `HTTP ${res.status}`), body?.error_code ?? null);
}

/** One API call with the key; JSON in and out. @throws ApiFailure for a non-2xx answer. */
export async function api<T>(path: string, init: { method?: string; body?: unknown } = {}): Promise<{ data: T; headers: Headers }> {
  const headers: Record<string, string> = { "x-api-key": apiKey() ?? "" };
  if (init.body !== undefined) headers["content-type"] = "application/json";
  const res = await fetch(path, { method: init.method ?? "GET", headers, body: init.body === undefined ? undefined : JSON.stringify(init.body) });
  if (res.status === 401) {
    forgetKey();
    throw await failure(res);
  }
  if (!res.ok) throw await failure(res);
  const text = await res.text();
  return { data: (text ? JSON.parse(text) : null) as T, headers: res.headers };
}

/** Every page of a list that pages with `x-next-token` (at most `maxPages`). */
export async function allPages<T>(path: string, params: Record<string, string>, maxPages = 50): Promise<T[]> {
  const out: T[] = [];
  let token: string | null = null;
  for (let i = 0; i < maxPages; i++) {
    const q = new URLSearchParams({ ...params, ...(token ? { nextToken: token } : {}) });
    const r: { data: T[]; headers: Headers } = await api<T[]>(`${path}?${q}`);
    out.push(...r.data);
    token = r.headers.get("x-next-token");
    if (!token) break;
  }
  return out;
}

/** How the console reaches one sandbox's envd. */
export interface EnvdAccess {
  sandboxId: string;
  /** envd access token (secure sandboxes), sent as X-Access-Token. */
  token: string | null;
  /** Guest user files and processes are handled as. */
  user: string;
}

function envdHeaders(a: EnvdAccess, extra: Record<string, string> = {}): Record<string, string> {
  return { authorization: `Basic ${btoa(`${a.user}:`)}`, ...(a.token ? { "x-access-token": a.token } : {}), ...extra };
}

/** envd base path through the proxy. */
export function envdBase(sandboxId: string): string {
  return `/proxy/${encodeURIComponent(sandboxId)}/${ENVD_PORT}`;
}

/** A unary Connect call (JSON codec) to envd, e.g. `filesystem.Filesystem/ListDir`. @throws ApiFailure */
export async function envdRpc<T>(a: EnvdAccess, method: string, body: unknown): Promise<T> {
  const res = await fetch(`${envdBase(a.sandboxId)}/${method}`, {
    method: "POST",
    headers: envdHeaders(a, { "content-type": "application/json", "connect-protocol-version": "1" }),
    body: JSON.stringify(body),
  });
  if (!res.ok) throw await failure(res);
  return (await res.json()) as T;
}

/** Download a guest file's bytes. @throws ApiFailure */
export async function envdDownload(a: EnvdAccess, path: string): Promise<Blob> {
  const res = await fetch(`${envdBase(a.sandboxId)}/files?${new URLSearchParams({ path })}`, { headers: envdHeaders(a) });
  if (!res.ok) throw await failure(res);
  return await res.blob();
}

/** Write `data` to guest file `path` (created or replaced). @throws ApiFailure */
export async function envdUpload(a: EnvdAccess, path: string, data: Blob): Promise<void> {
  const res = await fetch(`${envdBase(a.sandboxId)}/files?${new URLSearchParams({ path })}`, {
    method: "POST",
    headers: envdHeaders(a, { "content-type": "application/octet-stream" }),
    body: data,
  });
  if (!res.ok) throw await failure(res);
}

/** The page's settings, from the attributes the node wrote on <html>. */
export const settings = {
  role: (document.documentElement.dataset.role ?? "node") as "node" | "gateway",
  refreshMs: Math.max(250, Number(document.documentElement.dataset.refreshMs ?? 2000)),
};
