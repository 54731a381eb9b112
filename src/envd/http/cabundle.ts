/**
 * `/init` `caBundle`: PEM certificates the host wants the guest to trust (the node's egress CA,
 * docs/security.md). They are written to one file in the system's extra-CA directory (Debian:
 * /usr/local/share/ca-certificates, so a later `update-ca-certificates` keeps them) and put into
 * the system bundle file directly (as E2B's envd does: rebuilding the store with
 * update-ca-certificates costs seconds under TCG), replacing the block an earlier /init put there.
 * Unchanged bundles are not rewritten. Processes envd starts also get the variables that clients
 * with trust stores of their own read (`trustEnv`).
 */
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { errorMessage } from "../../util/error.ts";
import { EnvdError } from "../errors.ts";
import { writeFileDurable } from "../../util/durable.ts";

/** File name envd owns inside the CA directory. */
export const CA_FILE = "agentenv-init.crt";

const PEM_CERT = /-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+-----END CERTIFICATE-----/g;

/** Where /init's certificates go (config `[envd]` ca_dir, ca_bundle_path, ca_update_command). */
export interface CaTarget {
  /** Directory for extra CA certificates. */
  caDir: string;
  /** The system bundle file OpenSSL, curl and Python read; "" = none. */
  bundlePath: string;
  /** Command that rebuilds the trust store; empty = none. */
  updateCommand: string;
}

/**
 * The certificate blocks of a PEM bundle, each normalised to end with a newline.
 * @throws EnvdError `invalid_argument` when there is no certificate block.
 */
export function pemCertificates(bundle: string): string[] {
  const certs = bundle.match(PEM_CERT) ?? [];
  if (certs.length === 0) throw new EnvdError("invalid_argument", "caBundle holds no PEM certificate", {});
  return certs.map((c) => `${c.replace(/\r\n/g, "\n").trim()}\n`);
}

/**
 * Environment variables that make clients with their own trust stores trust what `installCaBundle`
 * installed: Node's NODE_EXTRA_CA_CERTS (added to its built-in roots), and the system bundle for
 * Python's requests (REQUESTS_CA_BUNDLE, else certifi's bundle), OpenSSL (SSL_CERT_FILE) and curl
 * builds without a default (CURL_CA_BUNDLE).
 */
export function trustEnv(t: CaTarget): Record<string, string> {
  const env: Record<string, string> = { NODE_EXTRA_CA_CERTS: join(t.caDir, CA_FILE) };
  if (t.bundlePath) Object.assign(env, { REQUESTS_CA_BUNDLE: t.bundlePath, SSL_CERT_FILE: t.bundlePath, CURL_CA_BUNDLE: t.bundlePath });
  return env;
}

/**
 * Install `bundle` into `t.caDir` and the system bundle, then run `t.updateCommand` (skipped
 * when empty or not found).
 * @returns true when the trust store changed.
 * @throws EnvdError `invalid_argument` for a bundle without certificates, `internal` when a file
 *   cannot be written or the update command fails.
 */
export async function installCaBundle(bundle: string, t: CaTarget): Promise<boolean> {
  const content = pemCertificates(bundle).join("");
  const target = join(t.caDir, CA_FILE);
  const previous = existsSync(target) ? readFileSync(target, "utf8") : "";
  const system = t.bundlePath && existsSync(t.bundlePath) ? readFileSync(t.bundlePath, "utf8") : null;
  if (previous === content && (system === null || system.includes(content))) return false;
  try {
    mkdirSync(t.caDir, { recursive: true, mode: 0o755 });
    writeFileDurable(target, content, { mode: 0o644 });
    if (system !== null) {
      const kept = previous && system.includes(previous) ? system.replace(previous, "") : system;
      writeFileDurable(t.bundlePath, `${kept}${kept.endsWith("\n") || kept === "" ? "" : "\n"}${content}`, { mode: 0o644 });
    }
  } catch (err) {
    throw new EnvdError("internal", `cannot write CA bundle to ${target}: ${errorMessage(err)}`, { path: target }, { cause: err });
  }
  const argv = t.updateCommand.split(/\s+/).filter(Boolean);
  if (argv.length && Bun.which(argv[0]!)) {
    const p = Bun.spawn(argv, { stdout: "ignore", stderr: "pipe" });
    const code = await p.exited;
    if (code !== 0) {
      const stderr = (await new Response(p.stderr).text()).slice(0, 500);
      throw new EnvdError("internal", `${argv[0]} failed with exit code ${code}: ${stderr}`, { command: t.updateCommand, code });
    }
  }
  return true;
}
