/**
 * Talking to one registry endpoint with Debian's skopeo: the flags that reach it (TLS verified
 * or not, the pull's credentials file, the extra CAs), the proxy variables it reads, asking it
 * for a manifest, copying an image by digest, and skopeo's failures as typed errors. Every line
 * skopeo prints passes through the pull's redaction before it reaches a log or an error.
 */
import type { Static } from "@sinclair/typebox";
import { createHash } from "node:crypto";
import { describeProblem } from "../util/json-check.ts";
import { ImageError } from "./errors.ts";
import { MANIFEST_OR_LIST } from "./manifests.ts";
import { redact } from "./auth.ts";
import type { Endpoint } from "./settings.ts";
import { runTool } from "./tool.ts";

/** What every skopeo run of one pull shares. */
export interface SkopeoContext {
  /** containers-auth.json of this pull (0600, in its private work dir); none: anonymous. */
  authFile?: string;
  /** Directory of the extra CA certificates (`*.crt`); none: the system's only. */
  certDir?: string;
  /** Proxy variables (src/util/proxy.ts `proxyEnv`). */
  env: Record<string, string>;
  /** Strings never to show in a line (passwords, tokens). */
  secrets: readonly string[];
  manifestTimeoutMs: number;
  toolTimeoutMs: number;
  signal?: AbortSignal;
}

/** How to run one tool: its bound, what a timeout means, and whether stdout is progress. */
export interface ToolRun {
  timeoutMs: number;
  /** What the run does, for a timeout's message ("asking r for its manifest"). */
  what: string;
  /** The typed error of a failed run (stderr tail, exit code). */
  classify: (err: string, code: number) => ImageError;
  /** Progress lines: stderr, and stdout too with `stdoutProgress` (skopeo copy's "Copying blob ..."). */
  onLine?: (l: string) => void;
  stdoutProgress?: boolean;
  signal?: AbortSignal;
  env?: Record<string, string>;
  /** Replaced by *** in every line and error. */
  secrets?: readonly string[];
}

/**
 * Run a tool to its end (runTool).
 * @returns stdout.
 * @throws ImageError `image.tool_missing`; `image.timeout` past `timeoutMs`; `image.pull_failed`
 *   when `signal` aborted it; `classify(stderr)` when it exits non-zero.
 */
export async function tool(cmd: string[], t: ToolRun): Promise<string> {
  const clean = (s: string) => (t.secrets?.length ? redact(s, t.secrets) : s);
  const r = await runTool(cmd, { timeoutMs: t.timeoutMs, onLine: t.onLine ? (l) => t.onLine!(clean(l)) : undefined, stdoutLines: t.stdoutProgress, signal: t.signal, env: t.env });
  if (r.code === 0) return r.stdout;
  if (r.missing) throw new ImageError("image.tool_missing", `cannot run ${cmd[0]}: ${r.stderr.trim()}`, { cmd: cmd[0] });
  if (r.timedOut) throw new ImageError("image.timeout", `${t.what} took longer than ${t.timeoutMs} ms`, { cmd: cmd[0], timeoutMs: t.timeoutMs });
  if (r.cancelled) throw new ImageError("image.pull_failed", `${t.what} was cancelled`, { cmd: cmd[0] });
  throw t.classify(clean(r.stderr.trim() || r.stdout.trim().slice(-2000)), r.code);
}

/** The message of a logrus line (`time=... level=fatal msg="..."`), else the line as is. */
function skopeoMessage(line: string): string {
  const m = /\bmsg="((?:[^"\\]|\\.)*)"/.exec(line);
  if (!m) return line;
  try {
    const text: unknown = JSON.parse(`"${m[1]}"`);
    return typeof text === "string" ? text : m[1]!;
  } catch {
    return m[1]!;
  }
}

/** Map skopeo's stderr (it exited with `code`) to a typed error. */
export function classifySkopeo(ref: string, registry: string, err: string, code: number): ImageError {
  const d = { ref, registry, stderr: err.slice(-1500) };
  const tailMsg = skopeoMessage(err.split("\n").filter(Boolean).pop() ?? `exit ${code}`);
  if (/digest did not match|digest mismatch|Digest mismatch|computed digest|does not match digest|does not match provided manifest digest/i.test(err)) return new ImageError("image.digest_mismatch", `a blob of ${ref} does not match its digest: ${tailMsg}`, d);
  if (/manifest unknown|name unknown|not found|NAME_UNKNOWN|MANIFEST_UNKNOWN/i.test(err)) return new ImageError("image.not_found", `image ${ref} not found: ${tailMsg}`, d);
  if (/no image found in manifest list|choosing image instance/i.test(err)) return new ImageError("image.no_platform", `image ${ref} has no linux/amd64 entry: ${tailMsg}`, d);
  // the proxy's refusal (407) or failure, before the registry's own auth failures it reads like
  if (/proxyconnect|Proxy Authentication Required/i.test(err)) return new ImageError("image.unreachable", `registry ${registry} unreachable through the proxy: ${tailMsg}`, d);
  if (/http: server gave HTTP response to HTTPS client|x509|tls:|certificate/i.test(err)) {
    return new ImageError("image.tls", `registry ${registry} does not speak verified TLS (add its CA with [image] ca_path, or list it in [image] insecure_registries to allow plain HTTP): ${tailMsg}`, d);
  }
  // status codes as words: a port such as :40312 is not a 403
  if (/unauthorized|authentication required|denied|\b40[13]\b|invalid username\/password/i.test(err)) return new ImageError("image.auth", `registry ${registry} refused access to ${ref}: ${tailMsg}`, d);
  if (/connection refused|no such host|i\/o timeout|network is unreachable|dial tcp/i.test(err)) return new ImageError("image.unreachable", `registry ${registry} unreachable: ${tailMsg}`, d);
  return new ImageError("image.pull_failed", `pulling ${ref} failed: ${tailMsg}`, d);
}

/**
 * skopeo source flags for `e`: TLS verified unless it is insecure (loopback or listed; then
 * plain HTTP is allowed too); the pull's credentials file (never the command line, where
 * /proc/<pid>/cmdline shows them to every local user) or anonymous; the extra CAs.
 */
export function srcFlags(e: Pick<Endpoint, "insecure">, ctx: Pick<SkopeoContext, "authFile" | "certDir">): string[] {
  return [
    `--src-tls-verify=${e.insecure ? "false" : "true"}`,
    ...(ctx.authFile ? ["--src-authfile", ctx.authFile] : ["--src-no-creds"]),
    ...(ctx.certDir ? ["--src-cert-dir", ctx.certDir] : []),
  ];
}

const sha256hex = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");

/** A manifest as an endpoint served it. */
export interface ServedManifest {
  /** sha256 of the bytes served for the reference (a list's own digest for a manifest list). */
  digest: string;
  /** Compressed bytes of the linux/amd64 image's layers. */
  compressedBytes: number;
}

/**
 * Ask `e` for the manifest of `target` (a tag or a digest): its digest, and for a manifest list
 * the linux/amd64 entry's layer sizes.
 * @param ref the reference as the user named it (for messages)
 * @throws ImageError (see classifySkopeo), `image.no_platform`, `image.timeout`
 */
export async function inspectManifest(e: Endpoint, target: { tag: string; digest?: string }, ref: string, ctx: SkopeoContext): Promise<ServedManifest> {
  const flags = srcFlags(e, ctx).map((f) => f.replace("--src-", "--"));
  const inspect = (what: string) =>
    tool(["skopeo", "inspect", "--raw", "--retry-times", "0", ...flags, `docker://${e.host}/${e.repository}${what}`], {
      timeoutMs: ctx.manifestTimeoutMs,
      what: `asking ${e.label} for the manifest of ${ref}`,
      classify: (err, c) => classifySkopeo(ref, e.host, err, c),
      signal: ctx.signal,
      env: ctx.env,
      secrets: ctx.secrets,
    });
  const raw = await inspect(target.digest ? `@${target.digest}` : `:${target.tag}`);
  const digest = `sha256:${sha256hex(raw)}`;
  let m = parseManifest(raw, ref, e);
  if (Array.isArray(m.manifests)) {
    const pick = m.manifests.find((x) => x.platform?.os === "linux" && x.platform?.architecture === "amd64");
    if (!pick) throw new ImageError("image.no_platform", `image ${ref} has no linux/amd64 entry in its manifest list`, { ref, platforms: m.manifests.map((x) => `${x.platform?.os}/${x.platform?.architecture}`) });
    const inner = await inspect(`@${pick.digest}`);
    const innerDigest = `sha256:${sha256hex(inner)}`;
    if (innerDigest !== pick.digest) throw digestMismatch(ref, e, pick.digest, innerDigest);
    m = parseManifest(inner, ref, e);
  }
  return { digest, compressedBytes: (m.layers ?? []).reduce((a, l) => a + (typeof l?.size === "number" ? l.size : 0), 0) };
}

/**
 * A registry's manifest answer, checked.
 * @throws ImageError `image.pull_failed` when it is not a JSON object; `image.bad_manifest`
 *   naming the field of one not of a manifest's or a manifest list's shape.
 */
function parseManifest(raw: string, ref: string, e: Endpoint): Static<typeof MANIFEST_OR_LIST.schema> {
  let m: unknown;
  try {
    m = JSON.parse(raw);
  } catch {
    m = null;
  }
  if (typeof m !== "object" || m === null || Array.isArray(m)) throw new ImageError("image.pull_failed", `${e.label} answered the manifest of ${ref} with something that is not a JSON manifest`, { ref, registry: e.host });
  const r = MANIFEST_OR_LIST.check(m);
  if (!r.ok) throw new ImageError("image.bad_manifest", `${e.label} answered the manifest of ${ref} with one not of the image spec's shape: ${describeProblem(r.problem)}`, { ref, what: "manifest", field: r.problem.path });
  return r.value;
}

/** The error for a manifest `e` served whose digest is `actual` where `expected` was asked for. */
export function digestMismatch(ref: string, e: Endpoint, expected: string, actual: string): ImageError {
  return new ImageError("image.digest_mismatch", `${e.label} served a manifest with digest ${actual} for ${ref}, which pins ${expected}`, { ref, endpoint: e.label, expected, actual });
}

/**
 * Copy the image `digest` from `e` into skopeo's `dir:` layout at `dest` (layers decompressed,
 * linux/amd64 chosen from a list); skopeo checks every blob against its digest and the manifest
 * against `digest`.
 * @throws ImageError (see classifySkopeo), `image.timeout`
 */
export async function copyImage(e: Endpoint, digest: string, dest: string, ref: string, ctx: SkopeoContext, onLine: (l: string) => void): Promise<void> {
  // skopeo says "Copying blob sha256:..." on stdout per layer: that is the pull's progress
  await tool(["skopeo", "copy", "--retry-times", "0", "--dest-decompress", "--format", "oci", "--override-os", "linux", "--override-arch", "amd64", ...srcFlags(e, ctx), `docker://${e.host}/${e.repository}@${digest}`, `dir:${dest}`], {
    timeoutMs: ctx.toolTimeoutMs,
    what: `pulling ${ref} from ${e.label}`,
    classify: (err, c) => classifySkopeo(ref, e.host, err, c),
    onLine,
    stdoutProgress: true,
    signal: ctx.signal,
    env: ctx.env,
    secrets: ctx.secrets,
  });
}
