/**
 * The node's boot snapshots (boot-snapshot.ts has what one is and how it is made and restored):
 * which one a cold boot of a shape restores, one build per shape at a time (concurrent cold boots
 * of the shape wait for it), and a pause after a failure (cold boots of that shape boot the
 * kernel for BOOT_SNAPSHOT_RETRY_MS).
 */
import { join } from "node:path";
import type { Logger } from "pino";
import type { SnapshotManifest } from "../snapshot/index.ts";
import { bootShapeKey, bootShapeOf, findBootSnapshot, makeBootSnapshot, staleBootSnapshots, type BootKeys, type BootShape } from "./boot-snapshot.ts";
import type { BuildBootSnapshots } from "./build-vm.ts";
import type { KernelKeys } from "./capture.ts";
import type { VmRuntimeOptions } from "./options.ts";
import type { SnapshotUsers } from "./snapshot-users.ts";
import type { WarmImages } from "./warm-images.ts";

/** After a failed boot snapshot build or restore, cold boots of its shape boot for this long before the next try, ms. */
const BOOT_SNAPSHOT_RETRY_MS = 600_000;
/** Bound on booting a boot snapshot's VM to envd, ms. */
export const BOOT_SNAPSHOT_TIMEOUT_MS = 120_000;

/** Boot snapshots in use on this node, with their builds in progress and recent failures. */
export class BootSnapshots {
  /** Builds in progress, and when one last failed, by shape key. */
  readonly #builds = new Map<string, Promise<SnapshotManifest | undefined>>();
  readonly #failures = new Map<string, number>();
  /** Aborts builds at close (a build serves every waiter, so no one caller's signal ends it). */
  readonly #abort = new AbortController();

  constructor(
    private readonly o: VmRuntimeOptions,
    private readonly kernelKeys: KernelKeys,
    private readonly users: SnapshotUsers,
    private readonly warm: WarmImages,
    private readonly log: Logger,
  ) {}

  /** Whether cold boots restore boot snapshots (`[vm] boot_snapshots`). */
  get enabled(): boolean {
    return this.o.bootSnapshots === true;
  }

  /**
   * What makes a boot snapshot current on this node now: driver, kernel, tools drive.
   * @throws when the kernel or the tools drive cannot be read
   */
  keys(): BootKeys {
    return { driver: this.o.driver.name, machineKey: this.o.driver.machineKey, kernelKey: this.kernelKeys.of(this.o.kernelPath()), toolsImage: this.o.toolsImage() };
  }

  /**
   * The current boot snapshot of `shape`, made first when there is none. Undefined when making
   * or restoring the shape's last failed less than BOOT_SNAPSHOT_RETRY_MS ago, with another
   * driver than QEMU, or when `signal` aborts first (the build goes on for other waiters): the
   * caller boots.
   */
  async find(shape: BootShape, signal: AbortSignal): Promise<SnapshotManifest | undefined> {
    // Firecracker's snapshot load re-opens the drives at the paths they had when the snapshot was
    // taken (its API has no drive override), and a boot snapshot's placeholder is gone by then
    if (this.o.driver.name !== "qemu") return undefined;
    const keys = this.keys();
    const key = bootShapeKey(shape);
    const failedAt = this.#failures.get(key);
    if (failedAt !== undefined && Date.now() - failedAt < BOOT_SNAPSHOT_RETRY_MS) return undefined;
    const have = findBootSnapshot(this.o.snapshots.repo, shape, keys);
    if (have) {
      // its memory image stays served between cold boots (and build VMs): each restore then
      // finds its pages in the page cache instead of reading them through the export again
      await this.warm.keep(have);
      return have;
    }
    const build = this.#builds.get(key) ?? this.build(key, shape, keys);
    // each waiter stops waiting when its own start is abandoned; the build goes on for the others
    if (signal.aborted) return undefined;
    let onAbort = () => {};
    const abandoned = new Promise<undefined>((r) => (onAbort = () => r(undefined)));
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      return await Promise.race([build, abandoned]);
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }

  private build(key: string, shape: BootShape, keys: BootKeys): Promise<SnapshotManifest | undefined> {
    const o = this.o;
    const deps = { repo: o.snapshots.repo, driver: o.driver, net: o.net, kernelPath: o.kernelPath(), workRoot: join(o.homePath, "sandboxes"), envdPollMs: o.envdPollMs, bootTimeoutMs: BOOT_SNAPSHOT_TIMEOUT_MS, log: this.log };
    const build = makeBootSnapshot(deps, `bootsnap-${key}`.slice(0, 40), shape, keys, this.#abort.signal)
      .then(
        (m) => {
          this.dropStale(keys);
          return m;
        },
        (e) => {
          if (!this.#abort.signal.aborted) {
            this.#failures.set(key, Date.now());
            this.log.warn({ err: e, ...shape }, "making a boot snapshot failed: cold boots of this shape boot the kernel");
          }
          return undefined;
        },
      )
      .finally(() => this.#builds.delete(key));
    this.#builds.set(key, build);
    return build;
  }

  /** Restoring `snap` failed: cold boots of its shape boot for BOOT_SNAPSHOT_RETRY_MS. */
  failed(snap: SnapshotManifest): void {
    this.#failures.set(bootShapeKey(bootShapeOf(snap)), Date.now());
  }

  /** What build VMs restore boot snapshots through, or undefined when cold boots boot. */
  forBuildVms(): BuildBootSnapshots | undefined {
    if (!this.enabled) return undefined;
    return {
      find: (shape, signal) => this.find(shape, signal),
      use: (snap, vm) => this.users.use(snap, vm),
      unuse: (snap, vm) => this.users.unuse(snap, vm),
      failed: (snap) => this.failed(snap),
    };
  }

  /** Stop the builds in progress and wait for them (each frees its VM and slot itself). */
  async close(): Promise<void> {
    this.#abort.abort();
    await Promise.all([...this.#builds.values()]);
  }

  /** Tombstone (in use) or remove boot snapshots of another kernel, tools drive or driver than `keys`. */
  private dropStale(keys: BootKeys): void {
    try {
      for (const old of staleBootSnapshots(this.o.snapshots.repo, keys)) {
        if (this.users.inUse(old.id)) this.o.snapshots.repo.tombstone(old.id);
        else this.o.snapshots.repo.remove(old.id);
      }
    } catch (e) {
      this.log.warn({ err: e }, "stale boot snapshots not removed");
    }
  }
}
