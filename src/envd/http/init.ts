/**
 * `POST /init` (docs/e2b-contract.md §3.2): install the access token, env vars, default user and
 * workdir, and sync the clock. Once a token is set only a caller holding it (the host) may
 * re-init. AgentENV extensions: `hostname`, and `entropy` (base64 host random bytes mixed into
 * the kernel's random generator, which is then reseeded: every restore of a snapshot sends its own,
 * so clones stop sharing the CRNG state they were captured with; docs/security.md).
 */
import { readFileSync, writeFileSync } from "node:fs";
import { setRealtimeClock, timespecOfMs } from "../../ffi/clock.ts";
import { MAX_ENTROPY_BYTES, reseedKernelRandom } from "../../ffi/random.ts";
import { hasValidToken } from "../auth.ts";
import { EnvdError } from "../errors.ts";
import { logger } from "../log.ts";
import type { EnvdState, InitRequest } from "../state.ts";
import { lookupUser } from "../users.ts";
import { errorMessage } from "../../util/error.ts";
import { installCaBundle, pemCertificates, trustEnv, type CaTarget } from "./cabundle.ts";

/** Where /init's side effects go (config `[envd]`). */
export interface InitOptions {
  /** Set the system clock from the timestamp and the host name from `hostname` (guests only). */
  syncClock: boolean;
  /** Mix `entropy` into the kernel random generator and reseed it (guests only; needs root). */
  reseedRandom: boolean;
  /** Where `caBundle` certificates go. */
  ca: CaTarget;
}

/** Fewest bytes of `entropy` accepted (the CRNG key is 32 bytes). */
export const MIN_ENTROPY_BYTES = 32;

function isStringMap(v: unknown): v is Record<string, string> {
  return typeof v === "object" && v !== null && !Array.isArray(v) && Object.values(v).every((x) => typeof x === "string");
}

/**
 * Validate an /init JSON body into an InitRequest.
 * @throws EnvdError `invalid_argument` naming the bad field.
 */
export function parseInitBody(body: unknown): InitRequest {
  if (body === null || body === undefined) return {};
  if (typeof body !== "object" || Array.isArray(body)) throw new EnvdError("invalid_argument", "init body must be a JSON object", {});
  const b = body as Record<string, unknown>;
  const out: InitRequest = {};
  for (const key of ["accessToken", "timestamp", "defaultUser", "defaultWorkdir", "caBundle", "hostname", "entropy"] as const) {
    if (b[key] === undefined || b[key] === null) continue;
    if (typeof b[key] !== "string") throw new EnvdError("invalid_argument", `init field ${key} must be a string`, { field: key });
    out[key] = b[key] as string;
  }
  if (b.envVars !== undefined && b.envVars !== null) {
    if (!isStringMap(b.envVars)) throw new EnvdError("invalid_argument", "init field envVars must map strings to strings", { field: "envVars" });
    out.envVars = b.envVars;
  }
  if (out.timestamp !== undefined && !Number.isFinite(Date.parse(out.timestamp))) {
    throw new EnvdError("invalid_argument", "init field timestamp must be RFC 3339", { timestamp: out.timestamp });
  }
  if (out.hostname !== undefined && !HOSTNAME_RE.test(out.hostname)) {
    throw new EnvdError("invalid_argument", "init field hostname must be 1-63 letters, digits or '-'", { field: "hostname" });
  }
  if (out.caBundle) pemCertificates(out.caBundle);
  if (out.entropy !== undefined) {
    const n = /^[A-Za-z0-9+/]*={0,2}$/.test(out.entropy) ? Buffer.from(out.entropy, "base64").length : -1;
    if (n < MIN_ENTROPY_BYTES || n > MAX_ENTROPY_BYTES) {
      throw new EnvdError("invalid_argument", `init field entropy must be base64 of ${MIN_ENTROPY_BYTES}..${MAX_ENTROPY_BYTES} bytes`, { field: "entropy" });
    }
  }
  if (out.defaultUser) {
    try {
      lookupUser(out.defaultUser);
    } catch {
      throw new EnvdError("invalid_argument", `init field defaultUser names no local user: '${out.defaultUser}'`, { field: "defaultUser", user: out.defaultUser });
    }
  }
  return out;
}

/** A host name label (RFC 1123). */
const HOSTNAME_RE = /^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/;

/**
 * Set the guest's host name (AgentENV extension of /init: a VM restored from a snapshot keeps the
 * name it had, so the host sends each sandbox its own) in the kernel, /etc/hostname and
 * /etc/hosts (so `sudo` and the like resolve it).
 */
function applyHostname(name: string): void {
  writeFileSync("/proc/sys/kernel/hostname", name);
  writeFileSync("/etc/hostname", `${name}\n`);
  let hosts = "";
  try {
    hosts = readFileSync("/etc/hosts", "utf8");
  } catch {
    // none yet
  }
  const kept = hosts.split("\n").filter((l) => l && !l.startsWith("127.0.1.1"));
  writeFileSync("/etc/hosts", [...kept, `127.0.1.1\t${name}`].join("\n") + "\n");
}

const log = logger("envd.init");

/** Clock skew tolerated before /init sets the system clock: behind, ahead (ms). */
const CLOCK_BEHIND_MS = 50;
const CLOCK_AHEAD_MS = 5000;

/**
 * Handle POST /init.
 * Reseeds the kernel's random generator from `entropy` first (before anything else of this
 * /init, and whatever its timestamp: a stale /init still carries fresh bytes), sets the system
 * clock (clock_settime(CLOCK_REALTIME), no child process: a restored guest's clock is always
 * stale, so every create sets it, and a fork/exec of `date` under TCG cost more than the rest of
 * /init) when `opts.syncClock` and the host time differs enough, and installs `caBundle`
 * certificates. A clock that cannot be set is logged and left as it is.
 * @throws EnvdError `unauthenticated` when a token is set and the caller does not hold it,
 *   `invalid_argument` for a bad body, `internal` when the reseed fails (the host must not hand
 *   out a clone whose generator is a copy).
 */
export async function handleInit(state: EnvdState, req: Request, opts: InitOptions): Promise<void> {
  if (state.accessToken && !hasValidToken(state, req.headers)) {
    throw new EnvdError("unauthenticated", "access token required to re-initialise envd", {});
  }
  const text = await req.text();
  let body: unknown;
  try {
    body = text.trim() ? JSON.parse(text) : {};
  } catch {
    throw new EnvdError("invalid_argument", "init body is not valid JSON", {});
  }
  const init = parseInitBody(body);
  if (init.entropy !== undefined && opts.reseedRandom) {
    try {
      reseedKernelRandom(Buffer.from(init.entropy, "base64"));
    } catch (e) {
      throw new EnvdError("internal", `reseeding the kernel random generator failed: ${errorMessage(e)}`, {}, { cause: e });
    }
    state.reseeds++;
  }
  if (!state.apply(init)) return;
  if (init.caBundle) {
    await installCaBundle(init.caBundle, opts.ca);
    state.trustEnv = trustEnv(opts.ca);
  }
  if (opts.syncClock && init.hostname) applyHostname(init.hostname);
  if (opts.syncClock && init.timestamp) {
    const host = Date.parse(init.timestamp);
    const skew = host - Date.now();
    if (skew > CLOCK_BEHIND_MS || skew < -CLOCK_AHEAD_MS) {
      const { sec, nsec } = timespecOfMs(host);
      try {
        setRealtimeClock(sec, nsec);
      } catch (e) {
        log.warn({ err: e, skewMs: skew }, "system clock not set");
      }
    }
  }
}
