/**
 * Start-up recovery of the VM runtime (issue 27): a node that starts on a runtime path whose
 * previous node left VMs running takes over every sandbox the database says is running (or
 * pausing) instead of reaping it, in this order (docs/survival.md):
 * 1. VMMs: each attached from its record (`driver.attach`: pid + start time + command line,
 *    held by a pidfd; QMP or the Firecracker API reconnected, the console too), all at once;
 *    then `reapLeftovers` kills what nobody adopted (VMMs of dead sandboxes, restore pool VMs,
 *    build and boot-snapshot VMs: none of those is kept);
 * 2. disks: the disk daemon is kept (`DiskService` adopt mode), each adopted sandbox's exports
 *    claimed (root disk, volume drives, the shared memory image its VMM maps), then what nobody
 *    claimed is removed (`reapUnclaimed`) with the mounts no device owns;
 * 3. slots: `NetworkManager.start({ keep })` keeps each adopted sandbox's slot whole, its egress
 *    policy and DNS-learned addresses re-applied;
 * 4. each adopted VM is registered as a start registers it (snapshot users, memory image lease,
 *    layer holds) and continued when the previous node left it paused (a capture cut halfway).
 * A sandbox whose VMM is gone (or not proved ours, unresponsive, in a bad state), or whose disk
 * export, memory image or slot was lost, has what is left of its VM stopped and its disk kept as a
 * filesystem-only pause snapshot (`Captures.salvage`); a pause that had committed before the node
 * died is taken as it is. Then the files: work dirs of sandboxes that do not run, snapshots only
 * dead VMs needed (reaper.ts).
 */
import { rmSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { ENVD_PORT } from "../envd/version.ts";
import { guestAddress, type AllocatedSlot, type KeepSlot } from "../net/index.ts";
import type { ReapReport, RecoveredSandbox, RuntimeKnownSandbox } from "../orchestrator/runtime.ts";
import { layersOf, type LayerHold, type LayerRef, type ServedImage, type SnapshotManifest } from "../snapshot/index.ts";
import { reapStaleMounts, type DiskExport } from "../storage/daemon/index.ts";
import { readRecords, reapLeftovers, type VmHandle } from "../vmm/index.ts";
import { reapHostVolumes } from "../volume/index.ts";
import { errorMessage } from "../util/error.ts";
import type { BaseResolver } from "./base-resolver.ts";
import { layerPaths, memoryKeyOf } from "./capture.ts";
import type { Captures } from "./captures.ts";
import { consoleLogLine } from "./console-lines.ts";
import { sandboxPolicy } from "./egress.ts";
import { memoryImageDevice, servedImage } from "./memory-export.ts";
import type { VmRuntimeOptions } from "./options.ts";
import { reapFiles, type ReaperDeps } from "./reaper.ts";
import type { RunningVms } from "./running-vms.ts";
import type { SnapshotUsers } from "./snapshot-users.ts";
import { VM_STATE_VERSION, type VmState } from "./vm-state.ts";

/** The runtime's parts start-up recovery works with. */
export interface AdoptionDeps {
  o: VmRuntimeOptions;
  vms: RunningVms;
  users: SnapshotUsers;
  captures: Captures;
  resolver: BaseResolver;
  reaper: ReaperDeps;
  log: Logger;
}

/** A sandbox start-up recovery tries to keep running: its record, its stored state, what it holds so far. */
interface Candidate {
  k: RuntimeKnownSandbox<VmState>;
  st: VmState;
  vm?: VmHandle;
  root?: DiskExport;
  volumes: DiskExport[];
  /** Key of the memory image its VMM maps, when it maps one. */
  memoryImage?: string;
  slot?: AllocatedSlot;
  /** Why it cannot be kept running (set once). */
  lost?: string;
}

/**
 * Recover what a previous node left (see the module comment). Without `o.adoptAtStart` nothing
 * is adopted: every VMM is killed and every sandbox left running reported `gone` by omission.
 * @returns the outcome per sandbox that was running or pausing, what was stopped and removed, timings
 * @throws NetError from the network manager's start; DiskError when the disk daemon cannot start
 */
export async function recover(d: AdoptionDeps, known: RuntimeKnownSandbox<VmState>[]): Promise<ReapReport<VmState>> {
  const t0 = performance.now();
  const adopting = d.o.adoptAtStart === true;
  const all: Candidate[] = adopting ? known.filter(keepable).map((k) => ({ k, st: k.runtimeState!, volumes: [] })) : [];
  const recovered = new Map<string, RecoveredSandbox<VmState>>();
  await attachVmms(d, all);
  const stoppedVms = await reapLeftovers(d.o.runtimePath, { keep: new Set(all.filter((c) => c.vm).map((c) => c.k.id)) });
  const volumeHostDir = join(d.o.runtimePath, "volumes");
  // the node's own volume mounts (ext4 on a loop over an export) before the exports under them
  const removed: string[] = reapHostVolumes(volumeHostDir).map((m) => `mount ${m}`);
  const images = adopting ? await claimExports(d, all) : new Map<string, ServedImage>();
  if (adopting) removed.push(...(await d.o.disks.reapUnclaimed()).map((id) => `disk ${id}`));
  const keepMounts = new Set(all.flatMap((c) => [c.root, ...c.volumes]).filter((x): x is DiskExport => x?.engine === "fuse").map((x) => x.path.slice(0, x.path.lastIndexOf("/"))));
  removed.push(...reapStaleMounts([join(d.o.homePath, "sandboxes"), volumeHostDir], keepMounts).map((m) => `mount ${m}`));
  rmSync(volumeHostDir, { recursive: true, force: true });
  if (adopting) await keepSlots(d, all);
  await Promise.all(all.map((c) => (c.lost ? undefined : takeOver(d, c, images, recovered))));
  // memory images claimed for VMs that could not be kept: nobody maps them any more
  for (const [key, img] of images) if (!all.some((c) => c.memoryImage === key && recovered.has(c.k.id))) await img.close().catch((e) => d.log.warn({ key, err: e }, "releasing an unused memory image failed"));
  const adoptMs = Math.round(performance.now() - t0);
  // one at a time: each reads a whole upper and writes a layer
  for (const c of all) if (c.lost) recovered.set(c.k.id, await keepFiles(d, c));
  const adopted = new Map(all.filter((c) => recovered.get(c.k.id)?.kind === "adopted").map((c) => [c.k.id, c.st]));
  const paused = new Map([...recovered].flatMap(([id, r]) => (r.kind === "paused" && r.runtimeState.paused ? [[id, r.runtimeState.paused] as const] : [])));
  removed.push(...reapFiles(d.reaper, known, { adopted, paused }));
  return { stoppedVms, removed, recovered, timings: { totalMs: Math.round(performance.now() - t0), adoptMs } };
}

/** A sandbox whose VM may still run: running or pausing, with a readable state of a running VM. */
function keepable(k: RuntimeKnownSandbox<VmState>): boolean {
  return (k.state === "running" || k.state === "pausing") && k.runtimeState !== null && k.runtimeState.paused === undefined && k.runtimeState.vmmPid !== undefined;
}

/** Mark `c` lost (the first reason stays). */
function lose(c: Candidate, why: string): void {
  c.lost ??= why;
}

/** Attach every candidate's VMM from its record, all at once. */
async function attachVmms(d: AdoptionDeps, all: Candidate[]): Promise<void> {
  if (all.length === 0) return;
  const records = readRecords(d.o.runtimePath);
  await Promise.all(
    all.map(async (c) => {
      const rec = records.get(c.k.id);
      if (!rec) return lose(c, "its VMM is gone (no VMM record)");
      if (rec.pid !== c.st.vmmPid || (c.st.held && rec.startTime !== c.st.held.vmmStartTime)) return lose(c, `its VMM record names process ${rec.pid}, not the sandbox's VMM ${c.st.vmmPid}`);
      const sink = c.k.onLog;
      const r = await d.o.driver.attach(rec, sink ? { onConsoleLine: (line) => sink(consoleLogLine(line, Date.now())) } : {});
      if (r.kind === "attached") c.vm = r.vm;
      else lose(c, `its VMM was not adopted (${r.reason}): ${r.detail}`);
    }),
  );
}

/** The memory image key a VM of state `st` maps: its boot snapshot's, or its base's unless it booted; none for a v1 state whose base is gone. */
function memoryImageOf(d: AdoptionDeps, st: VmState): string | undefined {
  if (st.held) return st.held.memoryImages[0];
  if (st.bootSnapshot) return memoryKeyOf(st.bootSnapshot.memory);
  if (st.coldBoot) return undefined;
  const base = d.o.snapshots.repo.find(st.base);
  return base?.memory ? memoryKeyOf(base.memory.layers) : undefined;
}

/**
 * Claim each kept VM's exports in the adopted disk daemon (root disk, volume drives), and each
 * memory image a kept VM maps once: an export that is lost or missing loses its sandbox.
 * @returns the memory images claimed, by key
 */
async function claimExports(d: AdoptionDeps, all: Candidate[]): Promise<Map<string, ServedImage>> {
  const disks = d.o.disks;
  await disks.start();
  const claim = async (id: string): Promise<DiskExport | string> => {
    try {
      const r = await disks.claim(id);
      return r.kind === "claimed" ? r.disk : r.kind === "lost" ? `lost: ${r.reason}` : "not served by the disk daemon";
    } catch (e) {
      return `not claimed: ${errorMessage(e)}`;
    }
  };
  const live = all.filter((c) => !c.lost);
  const images = new Map<string, ServedImage>();
  const keys = new Set<string>();
  for (const c of live) {
    c.memoryImage = memoryImageOf(d, c.st);
    if (c.memoryImage) keys.add(c.memoryImage);
  }
  const imageLoss = new Map<string, string>();
  await Promise.all([
    ...[...keys].map(async (key) => {
      const r = await claim(memoryImageDevice(key));
      if (typeof r === "string") imageLoss.set(key, r);
      else images.set(key, servedImage(r));
    }),
    ...live.map(async (c) => {
      const root = await claim(c.st.held?.rootExport ?? c.k.id);
      if (typeof root === "string") lose(c, `its root disk export is ${root}`);
      else c.root = root;
      const ids = c.st.held?.volumeExports ?? c.k.volumes.map((m) => `${c.k.id}-vol-${m.volumeId}`);
      for (const id of ids) {
        const v = await claim(id);
        if (typeof v === "string") lose(c, `its volume drive export ${id} is ${v}`);
        else c.volumes.push(v);
      }
    }),
  ]);
  for (const c of live) if (c.memoryImage && imageLoss.has(c.memoryImage)) lose(c, `the memory image its VM maps is ${imageLoss.get(c.memoryImage)}`);
  return images;
}

/** Start the network manager keeping the slots of the candidates still kept; a slot that cannot be kept loses its sandbox. */
async function keepSlots(d: AdoptionDeps, all: Candidate[]): Promise<void> {
  const keep: KeepSlot[] = [];
  for (const c of all) {
    if (c.lost) continue;
    try {
      keep.push({ sandboxId: c.k.id, policy: sandboxPolicy(c.k.network, c.k.allowInternetAccess) });
    } catch (e) {
      lose(c, `its egress policy does not parse: ${errorMessage(e)}`);
    }
  }
  const r = await d.o.net.start({ keep });
  const slots = new Map(r.adopted.map((a) => [a.sandboxId, a]));
  const why = new Map(r.lost.map((l) => [l.sandboxId, l.reason]));
  for (const c of all) {
    if (c.lost) continue;
    const slot = slots.get(c.k.id);
    if (!slot) lose(c, `its network slot was not kept: ${why.get(c.k.id) ?? "unknown"}`);
    else if (c.st.held && c.st.held.slot !== slot.idx) lose(c, `its network slot is ${slot.idx}, its VM was started in slot ${c.st.held.slot}`);
    else c.slot = slot;
  }
}

/**
 * Register kept VM `c` as a start registers one (its VMM, exports, snapshot users, memory image
 * lease, layer holds), continue it when it was left paused, and record it adopted; a failure
 * marks it lost (with what it got so far released).
 */
async function takeOver(d: AdoptionDeps, c: Candidate, images: Map<string, ServedImage>, recovered: Map<string, RecoveredSandbox<VmState>>): Promise<void> {
  const id = c.k.id;
  const vm = c.vm!;
  const repo = d.o.snapshots.repo;
  const holds: { release(): unknown }[] = [];
  try {
    const base = d.resolver.baseOfState(id, c.st);
    const boot = c.st.bootSnapshot ? repo.find(c.st.bootSnapshot.id) : undefined;
    if (c.st.bootSnapshot && !boot) throw new Error(`its boot snapshot ${c.st.bootSnapshot.id} is missing`);
    const layers: LayerRef[] = [...(c.st.coldBoot ? base.disk.layers : layersOf(base)), ...(boot ? layersOf(boot) : [])];
    const hold: LayerHold | undefined = await d.o.snapshots.remote?.acquire(layers);
    if (hold) holds.push(hold);
    if (c.memoryImage) {
      const layersOfImage = boot ? boot.memory!.layers : base.memory?.layers ?? [];
      holds.push(await d.o.snapshots.images.acquire(c.memoryImage, layerPaths(repo, layersOfImage), images.get(c.memoryImage)));
    }
    if (vm.paused) await vm.resume();
    d.vms.adopt(id, vm, c.root!, c.volumes);
    d.users.use(base.id, id);
    if (boot) d.users.use(boot.id, id);
    // the fork that made it died with the previous node before it let go of its checkpoint
    if (base.kind === "fork" && !repo.isTombstoned(base.id)) repo.tombstone(base.id);
    void vm.exited.then(async () => {
      for (const h of holds) await Promise.resolve(h.release()).catch((e) => d.log.error({ sandboxId: id, err: e }, "releasing an adopted VM's hold failed"));
    });
    c.st = held(c, vm);
    const sandbox = { endpoint: { host: guestAddress(c.slot!, ENVD_PORT).host }, runtimeState: c.st, envdVersion: c.st.envdVersion, exited: vm.exited, lost: d.vms.drivesLost(id) };
    recovered.set(id, { kind: "adopted", sandbox });
    d.log.info({ sandboxId: id, pid: vm.pid, slot: c.slot!.idx }, "sandbox adopted");
  } catch (e) {
    for (const h of holds) await Promise.resolve(h.release()).catch(() => {});
    lose(c, `taking it over failed: ${errorMessage(e)}`);
  }
}

/** `c`'s state as a start of this node writes it: version 2, with what its VM holds. */
function held(c: Candidate, vm: VmHandle): VmState {
  return {
    ...c.st,
    version: VM_STATE_VERSION,
    held: {
      vmmStartTime: vm.startTime,
      controlSocket: vm.controlSocket,
      slot: c.slot!.idx,
      rootExport: c.root!.id,
      volumeExports: c.volumes.map((v) => v.id),
      memoryImages: c.memoryImage ? [c.memoryImage] : [],
    },
  };
}

/**
 * Lost sandbox `c`: what is left of its VM stops and its exports close; its files are kept as a
 * paused sandbox's: the pause the previous node committed (a pausing sandbox whose pause got
 * that far), else its disk as a filesystem-only pause snapshot; `gone` when neither can be.
 */
async function keepFiles(d: AdoptionDeps, c: Candidate): Promise<RecoveredSandbox<VmState>> {
  const id = c.k.id;
  const why = c.lost!;
  if (c.vm) await c.vm.stop().catch((e) => d.log.error({ sandboxId: id, err: e }, "stopping a VMM that cannot be kept failed"));
  for (const x of [c.root, ...c.volumes]) await x?.close().catch((e) => d.log.warn({ sandboxId: id, err: e }, "closing an export of a lost sandbox failed"));
  if (d.o.net.slotOf(id)) await d.o.net.release(id).catch((e) => d.log.warn({ sandboxId: id, err: e }, "releasing the slot of a lost sandbox failed"));
  const paused = (snapshot: string) => ({ ...c.st, rootDisk: "", vmmPid: undefined, held: undefined, bootSnapshot: undefined, paused: snapshot });
  const committed = c.k.state === "pausing" ? committedPause(d, c) : undefined;
  if (committed) {
    d.log.warn({ sandboxId: id, snapshotId: committed.id, reason: why }, "a pause cut by the node's death had committed: the sandbox is paused on it");
    return { kind: "paused", runtimeState: paused(committed.id), snapshotKind: committed.memory ? "memory" : "filesystem", why: `the node died while the sandbox paused; its pause had committed (${why})` };
  }
  try {
    const st = await d.captures.salvage(id, c.st, why);
    return { kind: "paused", runtimeState: st, snapshotKind: "filesystem", why: `${why}; its disk was kept as the VM left it` };
  } catch (e) {
    d.log.error({ sandboxId: id, err: e, reason: why }, "the disk of a sandbox whose VM was lost could not be kept");
    return { kind: "gone", why: `${why}; its disk could not be kept: ${errorMessage(e)}` };
  }
}

/** The pause snapshot pausing sandbox `c` committed before the node died (its parent is the sandbox's base), if any. */
function committedPause(d: AdoptionDeps, c: Candidate): SnapshotManifest | undefined {
  return d.o.snapshots.repo
    .list({ hidden: true })
    .filter((m) => m.kind === "pause" && m.source.sandboxId === c.k.id && m.parent === c.st.base && m.id !== c.st.base)
    .sort((a, b) => b.createdAt.localeCompare(a.createdAt))[0];
}
