/**
 * `/init` `caBundle`: PEM certificates the host wants the guest to trust. They are written to
 * one file in the system's extra-CA directory (Debian: /usr/local/share/ca-certificates) and the
 * trust store is rebuilt (`update-ca-certificates`). Unchanged bundles are not rewritten.
 */
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { EnvdError } from "../errors.ts";

/** File name envd owns inside the CA directory. */
export const CA_FILE = "agentenv-init.crt";

const PEM_CERT = /-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+-----END CERTIFICATE-----/g;

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
 * Install `bundle` into `caDir` and run `updateCommand` (skipped when empty or not found).
 * @returns true when the trust store changed.
 * @throws EnvdError `invalid_argument` for a bundle without certificates, `internal` when the
 *   file cannot be written or the update command fails.
 */
export async function installCaBundle(bundle: string, caDir: string, updateCommand: string): Promise<boolean> {
  const content = pemCertificates(bundle).join("");
  const target = join(caDir, CA_FILE);
  if (existsSync(target) && readFileSync(target, "utf8") === content) return false;
  try {
    mkdirSync(caDir, { recursive: true, mode: 0o755 });
    writeFileSync(`${target}.tmp`, content, { mode: 0o644 });
    renameSync(`${target}.tmp`, target);
  } catch (err) {
    throw new EnvdError("internal", `cannot write CA bundle to ${target}: ${(err as Error).message}`, { path: target }, { cause: err });
  }
  const argv = updateCommand.split(/\s+/).filter(Boolean);
  if (argv.length && Bun.which(argv[0]!)) {
    const p = Bun.spawn(argv, { stdout: "ignore", stderr: "pipe" });
    const code = await p.exited;
    if (code !== 0) {
      const stderr = (await new Response(p.stderr).text()).slice(0, 500);
      throw new EnvdError("internal", `${argv[0]} failed with exit code ${code}: ${stderr}`, { command: updateCommand, code });
    }
  }
  return true;
}
