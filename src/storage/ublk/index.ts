/**
 * The ublk block server: overlaybd stacks and (CoW) raw files served as `/dev/ublkbN` through
 * io_uring, one worker thread per queue. This is the engine the disk daemon drives.
 *
 * ```ts
 * const server = UblkServer.open(ublkConfig(cfg));               // opens /dev/ublk-control
 * const dev = await server.create(await openStackTarget({ lowers, upper }));
 * dev.blockPath;                                                  // "/dev/ublkb0": give it to the VMM
 * await dev.close();                                              // STOP_DEV + DEL_DEV, image closed
 * // after this process died with devices live (user recovery):
 * const again = await server.recover(devId, await openStackTarget({ lowers, upper }));
 * const pooled = await server.precreate();                        // ADD_DEV + queue threads, no target yet
 * await pooled.bind(await openStackTarget({ lowers, upper }));    // SET_PARAMS + fetch + START_DEV
 * await server.remove(orphanId);                                  // a device nobody will recover
 * ```
 * Every failure is a `UblkError` with a stable `code` (see errors.ts).
 */
export { checkUblkConfig, ublkConfig, type UblkConfig } from "./config.ts";
export { errnoName, type UblkFeatures } from "./control.ts";
export { CowImage, type CowOptions } from "./cow.ts";
export { UblkDevice, type DeviceOptions, type DeviceState, type DeviceStats, type DeviceTimings } from "./device.ts";
export { UblkError, type UblkErrorCode } from "./errors.ts";
export { type CowPlan, type DirectPlan, type ExtentPlan } from "./plan.ts";
export { ownerTagOf, UblkServer, ublkAvailable, type UblkDeviceSummary } from "./server.ts";
export { imageTarget, layeredTarget, openConfigTarget, openCowTarget, openRawTarget, openStackTarget, targetOf, type UblkTarget } from "./targets.ts";
