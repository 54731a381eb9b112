/**
 * Registry of envd's processes: addressable by pid or tag while running and for a retention
 * window after exit (so a late Connect still gets the end event), bounded in number.
 */
import { EnvdError } from "../errors.ts";
import { ProcessHandle, type HandleLimits, type SpawnSpec } from "./handle.ts";

/** Bounds from config (`[envd]`). */
export interface ManagerLimits extends HandleLimits {
  /** Most processes alive at once. */
  maxProcesses: number;
  /** ms an exited process stays attachable. */
  exitedRetentionMs: number;
}

/** Which process a request means: by pid or by tag. */
export type Selector = { pid: number } | { tag: string };

/** Owns every ProcessHandle of one envd. */
export class ProcessManager {
  private readonly byPid = new Map<number, ProcessHandle>();
  private readonly timers = new Set<ReturnType<typeof setTimeout>>();

  constructor(private readonly limits: ManagerLimits) {}

  /**
   * Spawn and register a process.
   * Tags need not be unique (as in E2B's envd); selecting by tag picks a running one.
   * @throws EnvdError `resource_exhausted` past `maxProcesses`, or what `ProcessHandle.spawn` throws.
   */
  start(spec: SpawnSpec): ProcessHandle {
    const running = this.list();
    if (running.length >= this.limits.maxProcesses) {
      throw new EnvdError("resource_exhausted", `too many processes (limit ${this.limits.maxProcesses})`, { limit: this.limits.maxProcesses });
    }
    const h = ProcessHandle.spawn(spec, this.limits);
    this.byPid.set(h.pid, h);
    void h.done.then(() => {
      const t = setTimeout(() => {
        this.timers.delete(t);
        if (this.byPid.get(h.pid) === h) this.byPid.delete(h.pid);
      }, this.limits.exitedRetentionMs);
      this.timers.add(t);
    });
    return h;
  }

  /**
   * Find a process (running, or exited within the retention window).
   * @throws EnvdError `not_found`.
   */
  get(sel: Selector): ProcessHandle {
    if ("pid" in sel) {
      const h = this.byPid.get(sel.pid);
      if (h) return h;
      throw new EnvdError("not_found", `process with pid ${sel.pid} not found`, { pid: sel.pid });
    }
    let found: ProcessHandle | undefined;
    for (const h of this.byPid.values()) {
      if (h.spec.tag === sel.tag && (!found || h.running)) found = h;
    }
    if (found) return found;
    throw new EnvdError("not_found", `process with tag '${sel.tag}' not found`, { tag: sel.tag });
  }

  /** Like `get`, but an exited process counts as missing. */
  getRunning(sel: Selector): ProcessHandle {
    const h = this.get(sel);
    if (!h.running) {
      throw new EnvdError("not_found", `process ${"pid" in sel ? `with pid ${sel.pid}` : `with tag '${sel.tag}'`} not found`, { ...sel });
    }
    return h;
  }

  /** Running processes. */
  list(): ProcessHandle[] {
    return [...this.byPid.values()].filter((h) => h.running);
  }

  /** Kill every running process and wait for them; used on shutdown. */
  async shutdown(): Promise<void> {
    const live = this.list();
    for (const h of live) h.signal(9);
    await Promise.all(live.map((h) => h.done));
    for (const t of this.timers) clearTimeout(t);
    this.timers.clear();
    this.byPid.clear();
  }
}
