/** Test helpers for snapshot repositories: commit manifests over small made-up layer files. */
import { writeFileSync } from "node:fs";
import { newSnapshotId, type LocalRepository, type SnapshotKind, type SnapshotManifest } from "../../src/snapshot/index.ts";

/** A manifest for `repo` whose disk/memory/state (and tools) layers are files with the given contents. */
export function commitFake(
  repo: LocalRepository,
  o: {
    kind?: SnapshotKind;
    sandboxId?: string | null;
    names?: string[];
    disk?: string[];
    memory?: string[] | null;
    parent?: string | null;
    createdAt?: string;
    /** Fields of `vm` to set over the defaults (a boot snapshot's shape, volumeSlots, ...). */
    vm?: Partial<SnapshotManifest["vm"]>;
    /** A tools drive layer with these contents, and its `toolsKey`. */
    tools?: { content: string; key: string };
    /** A paused sandbox's record (kind `pause`). */
    sandbox?: Record<string, unknown>;
  } = {},
): SnapshotManifest {
  const txn = repo.begin();
  const add = (content: string, i: number) => {
    const p = txn.file(`f${i}-${Math.random().toString(36).slice(2)}`);
    writeFileSync(p, content);
    return txn.addLayer(p);
  };
  const disk = (o.disk ?? ["disk-0"]).map(add);
  const memory = o.memory === null ? null : (o.memory ?? ["mem-0"]).map(add);
  const m: SnapshotManifest = {
    version: 1,
    id: newSnapshotId(),
    kind: o.kind ?? "user",
    parent: o.parent ?? null,
    createdAt: o.createdAt ?? new Date().toISOString(),
    names: o.names ?? [],
    source: { sandboxId: o.sandboxId === undefined ? "sbx1" : o.sandboxId, templateId: "base" },
    vm: { driver: "qemu", vcpus: 1, memoryMiB: 256, kernelKey: "k", mac: "02:ae:fe:00:00:01", bootArgs: "root=/dev/vda", ...o.vm },
    envd: { version: "0.6.4", accessToken: null },
    disk: { virtualSize: 1 << 20, layers: disk },
    memory: memory ? { size: 256 << 20, layers: memory } : null,
    vmState: memory ? add(`state-${Math.random()}`, 99) : null,
    ...(o.tools ? { tools: add(o.tools.content, 98), toolsKey: o.tools.key } : {}),
    ...(o.sandbox ? { sandbox: o.sandbox } : {}),
  };
  txn.publish(m);
  return m;
}
