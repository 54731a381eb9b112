/**
 * Nodes (`GET /nodes`): on a node, itself; on the gateway, every node of the cluster with its
 * load (host CPU, memory, allocated vCPUs and memory, disk) and its sandboxes (the gateway's
 * merged list names each sandbox's node).
 */
import { api, settings } from "./api.ts";
import { bytes } from "./format.ts";
import { usePoll } from "./hooks.ts";
import { listSandboxes, type Listed } from "./sandboxes.tsx";

interface NodeRow {
  id: string;
  status: string;
  version: string;
  sandboxCount: number;
  sandboxStartingCount?: number;
  message?: string;
  metrics?: {
    cpuPercent: number;
    cpuCount: number;
    allocatedCPU: number;
    memoryUsedBytes: number;
    memoryTotalBytes: number;
    allocatedMemoryBytes: number;
    disks: { mountPoint: string; usedBytes: number; totalBytes: number }[];
  };
}

export function Nodes() {
  const data = usePoll(async () => {
    const [nodes, live] = await Promise.all([api<NodeRow[]>("/nodes").then((r) => r.data), listSandboxes()]);
    return { nodes, live };
  }, settings.refreshMs);
  if (data.error && !data.value) return <p class="error">{data.error.message}</p>;
  if (!data.value) return <p class="muted">Loading…</p>;
  const { nodes, live } = data.value;
  const on = (n: NodeRow): Listed[] => (nodes.length === 1 ? live.filter((s) => !s.nodeID || s.nodeID === n.id) : live.filter((s) => s.nodeID === n.id));
  return (
    <section>
      <h2>
        Nodes <span class="count">{nodes.length}</span>
      </h2>
      {data.error && <p class="error">{data.error.message}</p>}
      <table class="list" id="nodes">
        <thead>
          <tr>
            <th>Node</th>
            <th>Status</th>
            <th>Sandboxes</th>
            <th>Host CPU</th>
            <th>vCPUs allocated</th>
            <th>Host memory</th>
            <th>Memory allocated</th>
            <th>Disk</th>
            <th>Version</th>
          </tr>
        </thead>
        <tbody>
          {nodes.map((n) => {
            const m = n.metrics;
            const d = m?.disks?.[0];
            const mine = on(n);
            return (
              <tr key={n.id} data-node={n.id}>
                <td>{n.id}</td>
                <td>
                  <span class={`state ${n.status}`}>{n.status}</span>
                  {n.message && <span class="error"> {n.message}</span>}
                </td>
                <td>
                  {n.sandboxCount}
                  {mine.length ? (
                    <div class="small-list">
                      {mine.map((s) => (
                        <a href={`#/sandboxes/${encodeURIComponent(s.sandboxID)}`}>{s.sandboxID}</a>
                      ))}
                    </div>
                  ) : null}
                </td>
                <td>{m ? `${m.cpuPercent}% of ${m.cpuCount}` : "-"}</td>
                <td>{m ? m.allocatedCPU : "-"}</td>
                <td>{m ? `${bytes(m.memoryUsedBytes)} / ${bytes(m.memoryTotalBytes)}` : "-"}</td>
                <td>{m ? bytes(m.allocatedMemoryBytes) : "-"}</td>
                <td>{d ? `${bytes(d.usedBytes)} / ${bytes(d.totalBytes)}` : "-"}</td>
                <td>{n.version}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </section>
  );
}
