/**
 * Snapshots as each sandbox's checkpoint tree: under every template, the sandboxes started from
 * it; under a sandbox, the snapshots taken of it (oldest first); under a snapshot, the sandboxes
 * started from that snapshot, and so on. Snapshots come from `GET /snapshots` (their source
 * sandbox, template and time), live sandboxes from `GET /v2/sandboxes`; a sandbox that is gone
 * but left snapshots is shown as gone. Each snapshot can start a sandbox or be deleted.
 */
import { useState } from "preact/hooks";
import { allPages, api, settings } from "./api.ts";
import { when } from "./format.ts";
import { usePoll } from "./hooks.ts";
import { SandboxLink, State } from "./table.tsx";
import { listSandboxes, type Listed } from "./sandboxes.tsx";
import { errorMessage } from "../../util/error.ts";

/** `GET /snapshots` items (AgentENV adds the source and time to E2B's id and names). */
export interface SnapshotRow {
  snapshotID: string;
  names: string[];
  sandboxID?: string | null;
  templateID?: string;
  createdAt?: string;
}

interface SandboxNode {
  id: string;
  live: Listed | null;
  templateID: string;
  snapshots: SnapshotRow[];
}

/** The forest: template id -> its root sandboxes; and snapshot id -> sandboxes started from it. */
export function checkpointTree(snaps: SnapshotRow[], live: Listed[]): { roots: Map<string, SandboxNode[]>; children: Map<string, SandboxNode[]> } {
  const nodes = new Map<string, SandboxNode>();
  for (const s of live) nodes.set(s.sandboxID, { id: s.sandboxID, live: s, templateID: s.templateID, snapshots: [] });
  for (const s of snaps) {
    if (!s.sandboxID) continue;
    const n = nodes.get(s.sandboxID) ?? { id: s.sandboxID, live: null, templateID: s.templateID ?? "?", snapshots: [] };
    n.snapshots.push(s);
    nodes.set(s.sandboxID, n);
  }
  const bySnapshot = new Map<string, string>();
  for (const s of snaps) for (const k of [s.snapshotID, ...s.names, ...s.names.map((n) => n.replace(/:[^:/]*$/, ""))]) bySnapshot.set(k, s.snapshotID);
  const roots = new Map<string, SandboxNode[]>();
  const children = new Map<string, SandboxNode[]>();
  for (const n of nodes.values()) {
    n.snapshots.sort((a, b) => Date.parse(a.createdAt ?? "0") - Date.parse(b.createdAt ?? "0"));
    const parent = bySnapshot.get(n.templateID);
    const into = parent ? children : roots;
    const key = parent ?? n.templateID;
    into.set(key, [...(into.get(key) ?? []), n]);
  }
  return { roots, children };
}

function SnapshotItem({ s, children, onChange }: { s: SnapshotRow; children: Map<string, SandboxNode[]>; onChange: () => void }) {
  const [note, setNote] = useState<string | null>(null);
  const start = async () => {
    try {
      const r = await api<{ sandboxID: string }>("/v2/sandboxes", { method: "POST", body: { templateID: s.snapshotID } });
      location.hash = `#/sandboxes/${encodeURIComponent(r.data.sandboxID)}`;
    } catch (e) {
      setNote(errorMessage(e));
    }
  };
  const remove = async () => {
    try {
      await api(`/templates/${encodeURIComponent(s.snapshotID)}`, { method: "DELETE" });
      onChange();
    } catch (e) {
      setNote(errorMessage(e));
    }
  };
  return (
    <li class="snapshot" data-snapshot={s.snapshotID}>
      <span class="kind">snapshot</span> {s.snapshotID}
      {s.names.length ? <span class="muted"> ({s.names.join(", ")})</span> : null} <span class="muted">{when(s.createdAt ?? null)}</span>{" "}
      <button class="small" onClick={start}>
        Start sandbox
      </button>{" "}
      <button class="small danger" onClick={remove}>
        Delete
      </button>
      {note && <span class="error"> {note}</span>}
      <SandboxList list={children.get(s.snapshotID) ?? []} children={children} onChange={onChange} />
    </li>
  );
}

function SandboxList({ list, children, onChange }: { list: SandboxNode[]; children: Map<string, SandboxNode[]>; onChange: () => void }) {
  if (list.length === 0) return null;
  return (
    <ul>
      {list.map((n) => (
        <li class="sandbox" data-sandbox={n.id}>
          <span class="kind">sandbox</span> {n.live ? <SandboxLink id={n.id} /> : n.id}{" "}
          <State value={n.live?.state ?? "gone"} />
          {n.snapshots.length ? (
            <ul>
              {n.snapshots.map((s) => (
                <SnapshotItem s={s} children={children} onChange={onChange} />
              ))}
            </ul>
          ) : null}
        </li>
      ))}
    </ul>
  );
}

export function Snapshots() {
  const data = usePoll(async () => {
    const [snaps, live] = await Promise.all([allPages<SnapshotRow>("/snapshots", { limit: "100" }), listSandboxes()]);
    return { snaps, live };
  }, settings.refreshMs);
  if (data.error && !data.value) return <p class="error">{data.error.message}</p>;
  if (!data.value) return <p class="muted">Loading…</p>;
  const { roots, children } = checkpointTree(data.value.snaps, data.value.live);
  const withSnapshots = [...roots.entries()].filter(([, list]) => list.some(function has(n: SandboxNode): boolean {
    return n.snapshots.length > 0 || n.snapshots.some((s) => (children.get(s.snapshotID) ?? []).some(has));
  }));
  return (
    <section>
      <h2>
        Snapshots <span class="count">{data.value.snaps.length}</span>
      </h2>
      <p class="muted">Every sandbox that has snapshots, under the template it started from; sandboxes started from a snapshot sit under it.</p>
      {data.error && <p class="error">{data.error.message}</p>}
      <ul class="tree" id="snapshot-tree">
        {withSnapshots.map(([tpl, list]) => (
          <li class="template">
            <span class="kind">template</span> {tpl}
            <SandboxList list={list.filter((n) => n.snapshots.length > 0)} children={children} onChange={data.reload} />
          </li>
        ))}
      </ul>
      {withSnapshots.length === 0 && <p class="muted">No snapshots yet: take one with a sandbox's Snapshot button.</p>}
    </section>
  );
}
