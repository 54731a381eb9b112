/**
 * Volumes as the orchestrator keeps them: records in the `volumes` table, and who holds each one,
 * read from the live sandboxes' `volumeMounts` (creating, running, pausing, paused, resuming and
 * killing sandboxes hold theirs). The rule it enforces: a volume has one writer or any number of
 * readers, never both, and the node itself touches a volume's disk only while no sandbox writes
 * it. The content API is routed accordingly: through the writer's envd while it runs, on a host
 * mount when nobody holds the volume (read-only beside readers), refused (409) otherwise.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { eq } from "drizzle-orm";
import type { Db } from "../db/index.ts";
import { volumes as volumesTable } from "../db/schema/sandboxes.ts";
import type { VolumeFiles } from "../volume/types.ts";
import { OrchestratorError } from "./errors.ts";
import { newSandboxId, randomHex } from "./ids.ts";
import { KeyedLock } from "./lock.ts";
import type { VolumeBackend } from "./runtime.ts";
import type { SandboxRecord, VolumeMount, VolumeRecord } from "./types.ts";

/** DNS label (RFC 1123): 1-63 of [a-z0-9-], not starting or ending with "-". */
export const VOLUME_NAME = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
/** Directories a volume may not be mounted on or inside (the guest's own system). */
export const FORBIDDEN_MOUNT_ROOTS = ["/proc", "/sys", "/dev"] as const;

/**
 * Why `p` cannot be a guest mount path, or null when it can: it must be absolute, canonical
 * (no ".", "..", "//" or trailing "/"), at most 255 printable characters, not "/" and not /proc,
 * /sys, /dev or anything below them.
 */
export function mountPathProblem(p: string): string | null {
  if (!p.startsWith("/")) return "must be an absolute path";
  if (p === "/") return "may not be / (it would shadow the whole guest filesystem)";
  if (p.length > 255 || /[\u0000-\u001f\u007f]/.test(p)) return "must be at most 255 printable characters";
  if (p.endsWith("/") || p.split("/").slice(1).some((s) => s === "" || s === "." || s === "..")) return "must be canonical (no empty, . or .. segments, no trailing /)";
  const root = FORBIDDEN_MOUNT_ROOTS.find((r) => p === r || p.startsWith(r + "/"));
  if (root) return `may not be ${root} or below it (it would shadow the guest's ${root})`;
  return null;
}

/** Settings (`[volumes]`). */
export interface VolumesConfig {
  /** Size of a new volume's filesystem, bytes. */
  sizeBytes: number;
  maxMountsPerSandbox: number;
  /** Bound on waiting for another operation on the same volume, ms. */
  lockWaitMs: number;
}

/** States in which a sandbox holds its volumes. */
const HOLDING = ["creating", "running", "pausing", "paused", "resuming", "killing"] as const;

const bad = (message: string, details: Record<string, unknown>) => new OrchestratorError("orchestrator.bad_request", message, details);

export function volumeNotFound(id: string): OrchestratorError {
  return new OrchestratorError("orchestrator.volume_not_found", `volume "${id}" doesn't exist or you don't have access to it`, { volumeId: id });
}

export class VolumeManager {
  private readonly lock: KeyedLock;

  constructor(
    private readonly db: Db,
    private readonly backend: VolumeBackend | undefined,
    private readonly cfg: VolumesConfig,
    /** Live sandbox records (the orchestrator's store). */
    private readonly live: () => SandboxRecord[],
    /** File access through a running sandbox's envd (the runtime's). */
    private readonly guestFiles: ((holder: SandboxRecord, mount: VolumeMount) => VolumeFiles) | undefined,
    private readonly now: () => number,
  ) {
    this.lock = new KeyedLock(cfg.lockWaitMs, 64);
  }

  /**
   * Create a volume: its record and an empty ext4 disk.
   * @throws OrchestratorError bad_request (400) for a name that is not a DNS label or a runtime
   *   without volumes, volume_exists (409) for a name in use
   */
  async create(name: string): Promise<VolumeRecord> {
    if (!VOLUME_NAME.test(name)) throw bad(`volume name ${JSON.stringify(name)} must be a DNS label: 1-63 of a-z, 0-9 and -, not starting or ending with -`, { name });
    const backend = this.requireBackend();
    if (this.byName(name)) throw new OrchestratorError("orchestrator.volume_exists", `a volume named ${name} already exists`, { name });
    const rec: VolumeRecord = { id: newSandboxId(), name, token: randomHex(32), sizeBytes: this.cfg.sizeBytes, createdAt: this.now() };
    // the name is taken before the disk is made, so a second create with it gets 409 at once
    this.db.orm.insert(volumesTable).values(rec).run();
    try {
      await backend.create(rec.id, name, rec.sizeBytes);
    } catch (e) {
      this.db.orm.delete(volumesTable).where(eq(volumesTable.id, rec.id)).run();
      throw e;
    }
    return rec;
  }

  /** Every volume, oldest first. */
  list(): VolumeRecord[] {
    return this.db.orm.select().from(volumesTable).all().sort((a, b) => a.createdAt - b.createdAt || (a.id < b.id ? -1 : 1));
  }

  /** @throws OrchestratorError volume_not_found (404) */
  get(id: string): VolumeRecord {
    const r = /^[a-z0-9]{1,64}$/.test(id) ? this.db.orm.select().from(volumesTable).where(eq(volumesTable.id, id)).get() : undefined;
    if (!r) throw volumeNotFound(id);
    return r;
  }

  /** Whether `presented` is volume `v`'s content token (constant time). */
  tokenMatches(v: VolumeRecord, presented: string | null): boolean {
    if (!presented) return false;
    const a = createHash("sha256").update(presented).digest();
    return timingSafeEqual(a, createHash("sha256").update(v.token).digest());
  }

  /**
   * Delete a volume nobody holds.
   * @throws OrchestratorError volume_not_found (404), volume_in_use (409) naming the sandboxes
   */
  async delete(id: string): Promise<void> {
    this.get(id);
    await this.lock.run(id, async () => {
      this.get(id);
      const holders = this.holders(id);
      if (holders.length > 0) {
        throw new OrchestratorError("orchestrator.volume_in_use", `volume ${id} is mounted by sandbox ${holders.map((h) => h.id).join(", ")}; kill ${holders.length > 1 ? "them" : "it"} first`, {
          volumeId: id,
          sandboxIds: holders.map((h) => h.id),
        });
      }
      // the disk first: a failed removal leaves the record, so the delete can be retried
      await this.requireBackend().destroy(id);
      this.db.orm.delete(volumesTable).where(eq(volumesTable.id, id)).run();
    });
  }

  /**
   * Check a create request's `volumeMounts` and resolve the names. Synchronous on purpose: the
   * caller inserts the sandbox record right after, so no other create sees the volume as free
   * in between.
   * @throws OrchestratorError bad_request (400) for unknown names, bad or repeated paths, too many
   *   mounts; volume_in_use (409) when a writer would meet another holder
   */
  resolveMounts(asked: { name: string; path: string; readOnly?: boolean }[]): VolumeMount[] {
    if (asked.length === 0) return [];
    this.requireBackend();
    if (asked.length > this.cfg.maxMountsPerSandbox) {
      throw bad(`volumeMounts: at most ${this.cfg.maxMountsPerSandbox} volumes per sandbox ([volumes] max_mounts_per_sandbox), got ${asked.length}`, { count: asked.length });
    }
    const out: VolumeMount[] = [];
    asked.forEach((m, i) => {
      const why = mountPathProblem(m.path);
      if (why) throw bad(`volumeMounts[${i}].path ${JSON.stringify(m.path)} ${why}`, { path: m.path });
      const v = this.byName(m.name);
      if (!v) throw bad(`volumeMounts[${i}].name: no volume named ${JSON.stringify(m.name)}`, { name: m.name });
      for (const o of out) {
        if (o.volumeId === v.id) throw bad(`volumeMounts[${i}]: volume ${m.name} is mounted twice`, { name: m.name });
        if (o.path === m.path || o.path.startsWith(m.path + "/") || m.path.startsWith(o.path + "/")) {
          throw bad(`volumeMounts[${i}].path ${m.path} overlaps ${o.path}`, { path: m.path });
        }
      }
      const readOnly = m.readOnly === true;
      const holders = this.holders(v.id);
      const writer = holders.find((h) => h.volumeMounts.some((x) => x.volumeId === v.id && !x.readOnly));
      if (writer || (!readOnly && holders.length > 0)) {
        const who = writer ? `sandbox ${writer.id} writes it` : `sandbox ${holders.map((h) => h.id).join(", ")} mount${holders.length > 1 ? "" : "s"} it read-only`;
        throw new OrchestratorError("orchestrator.volume_in_use", `volume ${m.name} cannot be mounted ${readOnly ? "read-only" : "writable"}: ${who}`, { volumeId: v.id });
      }
      out.push({ volumeId: v.id, name: v.name, path: m.path, readOnly });
    });
    return out;
  }

  /**
   * Get the volumes of new sandbox `rec` ready to attach: the node's own access is closed, and
   * the first reader of a volume gets a consistent filesystem. Called under the sandbox's lock
   * before its VM boots.
   */
  async prepareAttach(rec: SandboxRecord): Promise<void> {
    const backend = this.requireBackend();
    for (const m of rec.volumeMounts) {
      await this.lock.run(m.volumeId, async () => {
        await backend.releaseHost(m.volumeId);
        if (m.readOnly && this.holders(m.volumeId).every((h) => h.id === rec.id)) await backend.prepareShared(m.volumeId);
      });
    }
  }

  /**
   * Run a content operation on volume `id` with the right access (see the file comment).
   * `fn` returns the result and a promise of the operation's end (a streamed read ends when its
   * stream does); the node's own access is held until then.
   * @throws OrchestratorError volume_busy (409) when the volume's writer is not running, or a
   *   write meets read-only holders
   */
  async withFiles<T>(id: string, write: boolean, fn: (files: VolumeFiles) => Promise<{ value: T; done?: Promise<unknown> }>): Promise<T> {
    const v = this.get(id);
    const backend = this.requireBackend();
    const route = (): { guest: { holder: SandboxRecord; mount: VolumeMount } } | { host: boolean } => {
      const holders = this.holders(id);
      const writer = holders.find((h) => h.volumeMounts.some((x) => x.volumeId === id && !x.readOnly));
      if (writer) {
        const mount = writer.volumeMounts.find((x) => x.volumeId === id)!;
        if (writer.state !== "running" || !this.guestFiles) {
          throw new OrchestratorError("orchestrator.volume_busy", `volume ${v.name} is held by sandbox ${writer.id}, which is ${writer.state}; its files are reachable while it runs`, {
            volumeId: id,
            sandboxId: writer.id,
          });
        }
        return { guest: { holder: writer, mount } };
      }
      if (holders.length > 0 && write) {
        throw new OrchestratorError("orchestrator.volume_busy", `volume ${v.name} is mounted read-only by sandbox ${holders.map((h) => h.id).join(", ")}; it cannot be changed until they are killed`, {
          volumeId: id,
        });
      }
      return { host: holders.length > 0 };
    };
    const first = route();
    if ("guest" in first) {
      const r = await fn(this.guestFiles!(first.guest.holder, first.guest.mount));
      return r.value;
    }
    return new Promise<T>((resolve, reject) => {
      this.lock
        .run(id, async () => {
          // holders may have changed while waiting for the lock
          const again = route();
          if ("guest" in again) return resolve(fn(this.guestFiles!(again.guest.holder, again.guest.mount)).then((r) => r.value));
          const access = await backend.hostFiles(id, again.host);
          try {
            const r = await fn(access.files);
            resolve(r.value);
            await r.done?.catch(() => {});
          } finally {
            access.release();
          }
        })
        .catch(reject);
    });
  }

  /** Live sandboxes holding volume `id`. */
  holders(id: string): SandboxRecord[] {
    return this.live().filter((r) => (HOLDING as readonly string[]).includes(r.state) && r.volumeMounts.some((m) => m.volumeId === id));
  }

  private byName(name: string): VolumeRecord | undefined {
    return this.db.orm.select().from(volumesTable).where(eq(volumesTable.name, name)).get();
  }

  private requireBackend(): VolumeBackend {
    if (!this.backend) throw bad("this node's runtime cannot attach volumes", {});
    return this.backend;
  }
}
