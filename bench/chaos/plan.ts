/**
 * The pure pieces of the chaos bench (bench/chaos.ts): the kill schedule it draws from a seeded
 * random source (test/helpers/fuzz.ts rng), the ledger of files the workload wrote (what a
 * check may find in each, and the bytes lost when it finds something else), the leak tally after
 * the final stop, and percentiles.
 * Nothing here touches a process, a file or the network; test/bench/chaos.test.ts covers it.
 */
import { rng } from "../../test/helpers/fuzz.ts";

/** What the bench kills with SIGKILL: the node process, the disk daemon, or one VMM. */
export type KillKind = "node" | "daemon" | "vmm";

/** Every kind, in report order. */
export const KILL_KINDS: readonly KillKind[] = ["node", "daemon", "vmm"];

/** One kill of the schedule. */
export interface PlannedKill {
  /** Wait after the previous kill's checks ended (the first: after the workload started), ms. */
  gapMs: number;
  kind: KillKind;
  /** Which VMM a `vmm` kill takes: index `floor(pick * running VMMs)`. In [0, 1). */
  pick: number;
}

/** Parameters of `killSchedule`. */
export interface ScheduleOptions {
  seed: number;
  /** How many kills, at most. */
  kills: number;
  /** Bounds of the wait before each kill, ms (minGapMs <= maxGapMs). */
  minGapMs: number;
  maxGapMs: number;
  /** Relative weights of the kinds (a kind of weight 0 is never drawn; at least one > 0). */
  weights: Record<KillKind, number>;
  /**
   * Daemon kills allowed between two node kills: the node starts a dead daemon again at most
   * `[disk] max_restarts` times over its life, so more would end the run's disks by design, not
   * by a bug. A daemon kill drawn beyond it becomes a node kill.
   */
  daemonKillsPerNode: number;
}

/**
 * The kills of a run, drawn from `seed`: each a wait (uniform in [minGapMs, maxGapMs]), a kind
 * (by weight) and a pick for a VMM kill. The same options give the same schedule.
 * @throws RangeError when a bound is negative or inverted, or every weight is 0.
 */
export function killSchedule(o: ScheduleOptions): PlannedKill[] {
  if (!(o.kills >= 0) || !(o.minGapMs >= 0) || !(o.maxGapMs >= o.minGapMs)) throw new RangeError(`bad schedule bounds: kills ${o.kills}, gap ${o.minGapMs}..${o.maxGapMs} ms`);
  const total = KILL_KINDS.reduce((s, k) => s + Math.max(0, o.weights[k]), 0);
  if (!(total > 0)) throw new RangeError("every kill kind has weight 0");
  const rnd = rng(o.seed);
  const out: PlannedKill[] = [];
  let daemonKills = 0;
  for (let i = 0; i < o.kills; i++) {
    const gapMs = Math.round(o.minGapMs + rnd() * (o.maxGapMs - o.minGapMs));
    let x = rnd() * total;
    let kind: KillKind = KILL_KINDS.find((k) => (x -= Math.max(0, o.weights[k])) < 0) ?? "node";
    if (kind === "daemon" && daemonKills >= o.daemonKillsPerNode) kind = "node";
    daemonKills = kind === "node" ? 0 : kind === "daemon" ? daemonKills + 1 : daemonKills;
    out.push({ gapMs, kind, pick: rnd() });
  }
  return out;
}

/** Content of a file as the ledger knows it: its sha256 (hex) and size in bytes. */
export interface FileVersion {
  sha256: string;
  size: number;
}

/** What a check found in one file: a version, or `null` for no such file. */
export type Observed = FileVersion | null;

/** What `FileLedger.observe` concluded about one file. */
export interface FileVerdict {
  /** The file holds its last acknowledged version, or one of the writes whose answer never came. */
  ok: boolean;
  /** Bytes of the acknowledged version that are gone (0 when ok). */
  bytesLost: number;
  /**
   * The file holds content it must not: an older version, a torn or a foreign file (not ok, and
   * not simply gone).
   */
  wrong: boolean;
  /** When not ok, what was there instead: an older acknowledged version, nothing, or content no write put there. */
  found?: "older" | "absent" | "foreign";
  /** When not ok, when the lost version was acknowledged (epoch ms, as given to `acked`). */
  ackedAt?: number;
}

interface FileEntry {
  /** The last version the SDK acknowledged; null: none yet (absent). */
  acked: FileVersion | null;
  /** When it was acknowledged (epoch ms), 0 when unknown. */
  ackedAt: number;
  /** Digests of the versions acknowledged before it (the last few). */
  older: string[];
  /** Writes sent after it whose answer never came: each may or may not have landed. */
  pending: FileVersion[];
}

/**
 * The files one sandbox holds, as far as the workload's writes tell: per path, the last version
 * the SDK acknowledged and the writes cut short after it (their outcome unknown). A check reads
 * each file and `observe`s it: the acknowledged version or any cut write is fine (an upload is
 * all or nothing); anything else loses the acknowledged version's bytes. The ledger then takes
 * what it saw as the file's acknowledged version, so a loss is counted once.
 */
export class FileLedger {
  private readonly files = new Map<string, FileEntry>();

  /** A write of `v` to `path` was acknowledged at `at` (epoch ms). */
  acked(path: string, v: FileVersion, at = 0): void {
    const e = this.files.get(path);
    const older = e?.acked ? [...e.older, e.acked.sha256].slice(-8) : e?.older ?? [];
    this.files.set(path, { acked: v, ackedAt: at, older, pending: [] });
  }

  /** A write of `v` to `path` failed or got no answer: it may or may not have landed. */
  cut(path: string, v: FileVersion): void {
    const e = this.files.get(path) ?? { acked: null, ackedAt: 0, older: [], pending: [] };
    e.pending.push(v);
    this.files.set(path, e);
  }

  /** Paths with something to check (an acknowledged or a cut write). */
  paths(): string[] {
    return [...this.files.keys()].sort();
  }

  /** Bytes of acknowledged versions held now. */
  ackedBytes(): number {
    let n = 0;
    for (const e of this.files.values()) n += e.acked?.size ?? 0;
    return n;
  }

  /**
   * Judge what a check read from `path` (`null`: no such file) and take it as acknowledged.
   * @throws RangeError for a path the ledger never saw written.
   */
  observe(path: string, seen: Observed): FileVerdict {
    const e = this.files.get(path);
    if (!e) throw new RangeError(`no write to ${path} was recorded`);
    const same = (a: Observed, b: Observed) => (a === null || b === null ? a === b : a.sha256 === b.sha256 && a.size === b.size);
    const ok = same(seen, e.acked) || e.pending.some((p) => same(seen, p));
    const found = seen === null ? "absent" : e.older.includes(seen.sha256) ? "older" : "foreign";
    const verdict: FileVerdict = ok ? { ok, bytesLost: 0, wrong: false } : { ok, bytesLost: e.acked?.size ?? 0, wrong: seen !== null, found, ackedAt: e.ackedAt };
    // every version that was there once stays known, so one coming back later is "older"
    const older = [...e.older, ...[e.acked, ...e.pending].filter((v) => v !== null && v.sha256 !== seen?.sha256).map((v) => v!.sha256)].slice(-16);
    if (seen === null && older.length === 0) this.files.delete(path);
    else this.files.set(path, { acked: seen, ackedAt: 0, older, pending: [] });
    return verdict;
  }

  /** A copy (a fork's child or a snapshot holds the files its parent held at that moment). */
  copy(): FileLedger {
    const c = new FileLedger();
    for (const [p, e] of this.files) c.files.set(p, { ...e, older: [...e.older], pending: [...e.pending] });
    return c;
  }
}

/**
 * What is left of a node after its final stop (every sandbox of the workload killed first), by
 * kind; each list names the objects (pids, names, paths). All empty: nothing leaked.
 */
export interface Leftovers {
  /** QEMU processes whose command line names the node's directories. */
  vmms: number[];
  /** Disk daemons of the node's directory. */
  diskDaemons: number[];
  /** Network namespaces with the node's name prefix (slots). */
  netns: string[];
  /** Mounts under the node's directories. */
  mounts: string[];
  /** Loop devices backed by files under the node's directories. */
  loopDevices: string[];
  /** ublk devices the node's disk daemon made (/dev/ublkb*, /dev/ublkc* beyond those there before). */
  ublkDevices: string[];
  /** Sandbox work dirs (their uppers) of no sandbox the database has alive. */
  workDirs: string[];
  /** Layer files no manifest names, older than `[snapshot] gc_grace_secs` (younger ones wait for garbage collection by design). */
  layers: string[];
  /** Staging dirs of snapshot commits. */
  staging: string[];
  /** VMM records (`<runtime_path>/vmm/<id>.json`) left. */
  vmmRecords: string[];
}

/** How many leftovers of each kind, and their sum. */
export function leakCounts(l: Leftovers): Record<keyof Leftovers, number> & { total: number } {
  const counts = Object.fromEntries(Object.entries(l).map(([k, v]) => [k, (v as unknown[]).length])) as Record<keyof Leftovers, number>;
  return { ...counts, total: Object.values(counts).reduce((s, n) => s + n, 0) };
}

/**
 * The `p`th percentile (0..100, nearest rank) of `xs`; null for none.
 * @example percentile([1, 2, 3, 4], 50) === 2
 */
export function percentile(xs: readonly number[], p: number): number | null {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}
