/**
 * The node's API key: `api.key` from config (AENV_API_KEY) when set, else the key stored in
 * `$home_path/api-key`, generated on first start as `e2b_` + 40 hex chars (the Python SDK
 * refuses keys not matching `e2b_[0-9a-f]+` unless E2B_VALIDATE_API_KEY=false).
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ApiError } from "./errors.ts";
import { randomHex } from "../orchestrator/index.ts";
import { errorMessage } from "../util/error.ts";

/** Where the generated key lives. */
export function apiKeyPath(homePath: string): string {
  return join(homePath, "api-key");
}

/**
 * Resolve the key: configured, stored, or newly generated and stored (mode 0600).
 * @returns the key and where it came from.
 * @throws ApiError api.key_unreadable (500) when the key file exists but cannot be read or is empty.
 */
export function loadOrCreateApiKey(configured: string, homePath: string): { key: string; source: "config" | "file" | "generated" } {
  if (configured) return { key: configured, source: "config" };
  const path = apiKeyPath(homePath);
  if (existsSync(path)) {
    let key: string;
    try {
      key = readFileSync(path, "utf8").trim();
    } catch (e) {
      throw new ApiError("api.key_unreadable", `cannot read API key file ${path}: ${errorMessage(e)}`, { path });
    }
    if (!key) throw new ApiError("api.key_unreadable", `API key file ${path} is empty`, { path });
    return { key, source: "file" };
  }
  mkdirSync(homePath, { recursive: true });
  const key = `e2b_${randomHex(20)}`;
  writeFileSync(path, key + "\n", { mode: 0o600, flag: "wx" });
  chmodSync(path, 0o600);
  return { key, source: "generated" };
}

/** Constant-time check of a presented key (header `X-API-Key`, any case). */
export function keyMatches(presented: string | null, key: string): boolean {
  if (!presented) return false;
  const a = createHash("sha256").update(presented).digest();
  const b = createHash("sha256").update(key).digest();
  return timingSafeEqual(a, b);
}
