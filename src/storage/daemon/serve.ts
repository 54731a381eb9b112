/**
 * Body of `agentenv disk serve --spec FILE`: the child process that serves one disk over FUSE.
 * Why a child per export and not the node's own event loop: a FUSE request the node itself
 * triggered (stat, read of the image) would deadlock a server living on the node's main
 * thread, a slow image read can't stall the node's API, a crash of one export takes down only
 * its disk, and after a node crash the children are found by their records and reaped.
 *
 * Protocol with the parent: one line `ready <path>` on stdout once mounted; logs on stderr.
 * SIGTERM/SIGINT or an external unmount end it with exit code 0.
 */
import { readFileSync } from "node:fs";
import { FuseExport } from "../fuse/server.ts";
import { logger } from "../../observability/log.ts";
import { DiskError } from "./errors.ts";
import { removeRecord, writeRecord } from "./record.ts";
import { openImage, validateServeSpec } from "./spec.ts";

const log = logger("disk");

/**
 * Serve the disk described by the JSON file `specPath` until signalled or unmounted.
 * @returns the exit code for the process
 */
export async function serveDisk(specPath: string): Promise<number> {
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(specPath, "utf8"));
  } catch (e) {
    throw new DiskError("disk.bad_spec", `cannot read disk spec ${specPath}: ${(e as Error).message}`, { specPath });
  }
  const spec = validateServeSpec(raw);
  const image = await openImage(spec.image);
  writeRecord(spec.recordDir, { id: spec.id, pid: process.pid, mountPoint: spec.mountPoint, startedAt: Date.now() });
  let exp: FuseExport;
  try {
    exp = FuseExport.start({ mountPoint: spec.mountPoint, fileName: spec.fileName, image, ...spec.tuning });
  } catch (e) {
    removeRecord(spec.recordDir, spec.id);
    await image.close();
    throw e;
  }
  const stop = async (why: string) => {
    log.debug({ id: spec.id, why }, "disk export stopping");
    await exp.close();
    removeRecord(spec.recordDir, spec.id);
  };
  const signalled = new Promise<string>((resolve) => {
    process.once("SIGTERM", () => resolve("SIGTERM"));
    process.once("SIGINT", () => resolve("SIGINT"));
  });
  process.stdout.write(`ready ${exp.path}\n`);
  const why = await Promise.race([signalled, exp.ended]);
  await stop(why);
  return 0;
}
