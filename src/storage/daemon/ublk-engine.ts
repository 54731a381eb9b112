/**
 * The ublk export engine: each device is a `/dev/ublkbN` served by this process through the ublk
 * block server (src/storage/ublk: io_uring, one worker thread per queue). The kernel keeps a
 * device with user recovery alive (quiesced) when this process dies, and a restarted daemon takes
 * it over (START/END_USER_RECOVERY); without recovery the kernel removes it and the restarted
 * daemon deletes what is left.
 *
 * Pre-created devices (the warm pool): ADD_DEV, /dev/ublkcN opened and mapped, queue threads
 * started and waiting; `bind` gives one its image (SET_PARAMS with the image's size, the tags
 * fetched, START_DEV). The kernel accepts parameters any time before START_DEV (6.1 too), so a
 * pooled device needs nothing the image decides until it is bound.
 *
 * Every device carries the daemon's owner tag (`ownerTagOf(dir)`, in `ublksrv_flags`): at start
 * the daemon removes tagged devices no row names (`sweep`: a crash between ADD_DEV and the row's
 * `ublk_dev_id` leaves one).
 *
 * engineState: { ublk_dev_id: number }.
 * Not offered (a typed `disk.unsupported`): growing a live device (a ublk device's size is fixed
 * once started on these kernels: UPDATE_SIZE is 6.16). A restack runs inside
 * `UblkDevice.exclusive` (no request through the image meanwhile).
 */
import type { BlockImage } from "../block.ts";
import { targetOf, UblkServer, type UblkConfig, type UblkDevice } from "../ublk/index.ts";
import type { EngineDevice, EngineStats, ExportEngine, PlaceSpec } from "./engine.ts";
import { DiskError } from "../errors.ts";
import type { DeviceRow } from "./store.ts";

class UblkEngineDevice implements EngineDevice {
  #dev: UblkDevice;
  #done: Promise<void> | undefined;

  constructor(dev: UblkDevice) {
    this.#dev = dev;
  }

  get path(): string | null {
    return this.#dev.bound ? this.#dev.blockPath : null;
  }

  get engineState(): Record<string, unknown> {
    return { ublk_dev_id: this.#dev.devId };
  }

  get image(): BlockImage | null {
    return this.#dev.bound ? this.#dev.target.image : null;
  }

  get ended(): Promise<string> {
    return this.#dev.ended;
  }

  stats(): EngineStats {
    const s = this.#dev.stats();
    // opens of a block device are not seen by its server: 0
    return { reads: s.reads, bytesRead: s.bytesRead, writes: s.writes, bytesWritten: s.bytesWritten, fsyncs: s.flushes, discards: s.discards, opens: 0, errors: s.errors, splicedReads: 0 };
  }

  exclusive<T>(op: () => Promise<T>): Promise<T> {
    return this.#dev.exclusive(op);
  }

  refresh(): void {
    // nothing to redo after a restack: the queue threads read only the lower layer files, which a
    // restack leaves as they are; every range written through the old upper is diverted to the image
  }

  grow(): Promise<void> {
    // UBLK_CMD_UPDATE_SIZE (feature UBLK_F_UPDATE_SIZE) is newer than the kernels this runs on
    return Promise.reject(new DiskError("disk.unsupported", `ublk device ${this.#dev.devId} keeps the size it was created with`, { engine: "ublk", devId: this.#dev.devId }));
  }

  /** @throws UblkError from SET_PARAMS / the queues / START_DEV (the device is removed then) */
  async bind(image: BlockImage): Promise<void> {
    await this.#dev.bind(targetOf(image));
  }

  detach(): Promise<void> {
    // stop serving, leave the device quiesced for the next daemon's recovery
    return (this.#done ??= this.#dev.detach());
  }

  destroy(): Promise<void> {
    return (this.#done ??= this.#dev.close());
  }
}

/** The ublk engine of one daemon. */
export class UblkEngine implements ExportEngine {
  readonly name = "ublk" as const;
  #server: UblkServer;

  private constructor(server: UblkServer) {
    this.#server = server;
  }

  /**
   * Open the control channel.
   * @param ownerTag carried by every device (see `ownerTagOf`); the sweep removes tagged devices no row names
   * @throws UblkError `ublk.unavailable` (no /dev/ublk-control)
   */
  static open(cfg: UblkConfig, ownerTag: bigint): UblkEngine {
    return new UblkEngine(UblkServer.open(cfg, { ownerTag }));
  }

  /** @throws UblkError from creating the device (the image is closed then) */
  async create(image: BlockImage, _place: PlaceSpec): Promise<EngineDevice> {
    return new UblkEngineDevice(await this.#server.create(targetOf(image)));
  }

  /** @throws UblkError from ADD_DEV or starting the queue threads (nothing is left then) */
  async precreate(): Promise<EngineDevice> {
    return new UblkEngineDevice(await this.#server.precreate());
  }

  /** @throws DiskError `disk.daemon_failed` (no device id recorded); UblkError from recovery */
  async recover(row: DeviceRow, image: BlockImage): Promise<EngineDevice> {
    const id = row.engineState.ublk_dev_id;
    if (typeof id !== "number") throw new DiskError("disk.daemon_failed", `device ${row.devId} has no ublk device id`, { devId: row.devId });
    return new UblkEngineDevice(await this.#server.recover(id, targetOf(image)));
  }

  async cleanup(row: DeviceRow): Promise<void> {
    const id = row.engineState.ublk_dev_id;
    if (typeof id === "number") await this.#server.remove(id).catch(() => undefined);
  }

  async sweep(rows: DeviceRow[]): Promise<string[]> {
    const keep = new Set(rows.filter((r) => r.engine === "ublk").map((r) => r.engineState.ublk_dev_id).filter((x): x is number => typeof x === "number"));
    return (await this.#server.sweep(keep)).map((id) => `ublk device ${id}`);
  }

  async close(opts: { detached: boolean }): Promise<void> {
    // after a detach the devices stay for the next daemon: only stop devices on a full shutdown
    if (!opts.detached) await this.#server.close();
  }
}
