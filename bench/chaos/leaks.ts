/**
 * What a node left on the host (bench/chaos.ts, after its final stop): processes, network
 * namespaces, mounts, loop and ublk devices, work dirs, layers, staging dirs and VMM records of
 * the node's directories that no live sandbox record names.
 */
import { Database } from "bun:sqlite";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { diskDaemonsUnder, qemuPidsUnder, type NodeWorld } from "../../test/e2e/world.ts";
import type { Leftovers } from "./plan.ts";

const ls = (dir: string) => (existsSync(dir) ? readdirSync(dir) : []);

/** ublk block and char devices on the host now (to compare with those before the node started). */
export function ublkDevices(): string[] {
  return ls("/dev").filter((d) => /^ublk[bc]\d+$/.test(d)).sort();
}

/** Layer files of the repository under `home` that no manifest names (tombstoned ones too). */
export function unnamedLayers(home: string): string[] {
  const named = new Set<string>();
  const dir = join(home, "snapshots", "manifests");
  for (const f of ls(dir).filter((f) => f.endsWith(".json"))) {
    const m = JSON.parse(readFileSync(join(dir, f), "utf8"));
    for (const l of [...m.disk.layers, ...(m.memory?.layers ?? []), ...(m.vmState ? [m.vmState] : []), ...(m.tools ? [m.tools] : [])]) named.add(l.digest.slice(7));
  }
  return ls(join(home, "snapshots", "layers")).filter((f) => !named.has(f));
}

/** Ids of the sandboxes the node's database has in a state other than killed. */
function liveRecords(home: string): Set<string> {
  const db = new Database(join(home, "agentenv.db"), { readonly: true });
  try {
    return new Set(db.query<{ id: string }, []>("SELECT id FROM sandboxes WHERE state != 'killed'").all().map((r) => r.id));
  } finally {
    db.close();
  }
}

/**
 * Everything of world `w` (its node stopped) that no live sandbox record names, and the layers
 * no manifest names that are younger than `graceMs` (`[snapshot] gc_grace_secs`: garbage
 * collection leaves them alone so long, by design; not counted as leaks).
 * @param ublkBefore ublk devices on the host before the node started (other users' stay out)
 */
export function leftovers(w: NodeWorld, ublkBefore: string[], graceMs: number): { left: Leftovers; layersAwaitingGc: number } {
  const dirs = [w.home, w.memDir];
  const under = (p: string) => dirs.some((d) => p === d || p.startsWith(`${d}/`));
  const live = liveRecords(w.home);
  const mounts = readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((l) => l.split(" ")[4] ?? "")
    .filter(under);
  const loops = JSON.parse(Bun.spawnSync(["losetup", "-J", "-l"]).stdout.toString() || '{"loopdevices":[]}') as { loopdevices: { name: string; "back-file": string | null }[] };
  const now = Date.now();
  const unnamed = unnamedLayers(w.home);
  const old = unnamed.filter((f) => now - statSync(join(w.home, "snapshots", "layers", f)).mtimeMs >= graceMs);
  const left: Leftovers = {
    vmms: qemuPidsUnder(...dirs),
    diskDaemons: diskDaemonsUnder(w.home),
    netns: w.slotNamespaces(),
    mounts,
    loopDevices: loops.loopdevices.filter((d) => d["back-file"] && under(d["back-file"].replace(/ \(deleted\)$/, ""))).map((d) => d.name),
    ublkDevices: ublkDevices().filter((d) => !ublkBefore.includes(d)),
    workDirs: ls(join(w.home, "sandboxes")).filter((id) => !live.has(id)),
    layers: old,
    staging: ls(join(w.home, "snapshots", "staging")),
    vmmRecords: ls(join(w.home, "run", "vmm")).filter((f) => f.endsWith(".json") && !live.has(f.slice(0, -5))),
  };
  return { left, layersAwaitingGc: unnamed.length - old.length };
}
