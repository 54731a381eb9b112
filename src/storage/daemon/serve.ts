/**
 * Body of `agentenv disk serve --spec FILE --fuse-fd N [--resume]`: the child process that serves
 * one disk over a FUSE connection the node mounted and handed over as fd N.
 *
 * Why a child per export, with the node holding the connection:
 * - a FUSE request the node itself triggered (stat, a read of the image) would deadlock a server
 *   living on the node's own main thread, and a slow image read can't stall the node's API;
 * - a crashed server takes down only its disk, and not even that: the node keeps the /dev/fuse
 *   fd, so the mount survives, and a replacement child started with `--resume` asks the kernel to
 *   re-send the requests the dead one held (FUSE_NOTIFY_RESEND): the VM sees a pause, not EIO;
 * - after a node crash the children are found through their records and reaped.
 *
 * Protocol with the parent: one line `ready <path>` on stdout once serving; logs on stderr.
 * SIGTERM/SIGINT or the unmount (reader threads see ENODEV) end it with exit code 0.
 */
import { readFileSync } from "node:fs";
import { FuseExport } from "../fuse/server.ts";
import { logger } from "../../observability/log.ts";
import { LayeredImage } from "../overlaybd/index.ts";
import { layeredDirectPlan } from "./direct.ts";
import { DiskError } from "./errors.ts";
import { removeRecord, writeRecord } from "./record.ts";
import { openImage, validateServeSpec } from "./spec.ts";

const log = logger("disk");

/**
 * Serve the disk described by the JSON file `specPath` on the inherited FUSE fd until signalled
 * or unmounted.
 * @returns the exit code for the process
 * @throws DiskError `disk.bad_spec`, `disk.open_failed`; OverlaybdError from opening layers
 */
export async function serveDisk(specPath: string, fuseFd: number, resume: boolean): Promise<number> {
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
    const acceptWritableOpen = spec.image.kind === "raw" && spec.image.acceptWritableOpen === true;
    // reader threads read local layer files themselves; a raw image offers its file by itself
    const direct = image instanceof LayeredImage ? (layeredDirectPlan(image) ?? undefined) : undefined;
    exp = FuseExport.attach({ mountPoint: spec.mountPoint, fileName: spec.fileName, image, ...spec.tuning, acceptWritableOpen, direct, fd: fuseFd, resume });
  } catch (e) {
    await image.close();
    throw e;
  }
  const signalled = new Promise<string>((resolve) => {
    process.once("SIGTERM", () => resolve("SIGTERM"));
    process.once("SIGINT", () => resolve("SIGINT"));
  });
  process.stdout.write(`ready ${exp.path}\n`);
  const why = await Promise.race([signalled, exp.ended]);
  log.debug({ id: spec.id, why }, "disk server stopping");
  await exp.close();
  removeRecord(spec.recordDir, spec.id);
  return 0;
}
