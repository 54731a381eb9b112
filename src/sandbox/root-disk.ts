/**
 * Per-sandbox writable root disk. The template's root image is never written; each sandbox gets
 * its own copy made with `cp --sparse=always --reflink=auto` (a reflink on XFS/btrfs, a sparse
 * byte copy on ext4), which stays in the sandbox's work dir across pause/resume (it is the
 * paused sandbox's disk state). The VMM opens it as a plain file.
 */
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { OrchestratorError } from "../orchestrator/errors.ts";
import { ROOT_DISK_FILE } from "../storage/daemon/index.ts";


/**
 * Make `workDir/root.img` from `templateRootfs` unless it exists already (resume).
 * @returns its path.
 * @throws OrchestratorError `orchestrator.disk_failed` with cp's stderr.
 */
export async function copyRootImage(templateRootfs: string, workDir: string, signal: AbortSignal): Promise<string> {
  mkdirSync(workDir, { recursive: true });
  const path = join(workDir, ROOT_DISK_FILE);
  if (existsSync(path)) return path;
  const tmp = `${path}.tmp`;
  const proc = Bun.spawn(["cp", "--sparse=always", "--reflink=auto", templateRootfs, tmp], { stderr: "pipe", stdout: "ignore", signal });
  const [code, err] = await Promise.all([proc.exited, new Response(proc.stderr).text()]);
  if (code !== 0) {
    throw new OrchestratorError("orchestrator.disk_failed", `copying root image ${templateRootfs} failed (exit ${code}): ${err.trim()}`, { templateRootfs, workDir, code });
  }
  const mv = Bun.spawnSync(["mv", "-f", tmp, path]);
  if (mv.exitCode !== 0) throw new OrchestratorError("orchestrator.disk_failed", `cannot move ${tmp} into place`, { tmp, path });
  return path;
}
