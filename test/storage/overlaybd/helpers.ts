import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createHash } from "node:crypto";

/** ../shared/overlaybd-fixtures, next to the repository. */
export const FIXTURES = join(import.meta.dir, "../../../../shared/overlaybd-fixtures");
export const HELLO = join(FIXTURES, "hello-world-overlaybd-layer.blob");

/** A scratch folder removed by the returned cleanup. */
export function scratch(): { dir: string; path: (n: string) => string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "obd-test-"));
  return { dir, path: (n) => join(dir, n), cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

export const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

/** Extract ext4_64 (the 2021 ZFile base layer) from its .tar.gz into `dir`; returns its path. */
export async function extractExt4(dir: string): Promise<string> {
  const p = Bun.spawnSync(["tar", "xzf", join(FIXTURES, "ext4_64.tar.gz"), "-C", dir]);
  if (p.exitCode !== 0) throw new Error(`tar failed: ${p.stderr.toString()}`);
  return join(dir, "ext4_64");
}

export { rng } from "../../helpers/fuzz.ts";

export function hex(s: string): Uint8Array {
  const clean = s.replace(/[^0-9a-f]/gi, "");
  return Uint8Array.from(clean.match(/../g)!.map((x) => parseInt(x, 16)));
}
