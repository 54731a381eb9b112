/**
 * Nodes (`GET /nodes`): on a node, itself; on the gateway, every node of the cluster with its
 * load (host CPU, memory, allocated vCPUs and memory, disk) and its sandboxes (the gateway's
 * merged list names each sandbox's node).
 */
import { api, settings } from "./api.ts";
import { bytes } from "./format.ts";
import { usePoll } from "./hooks.ts";
import { listSandboxes, type Listed } from "./sandboxes.tsx";
import { ListTable, SandboxLink, State } from "./table.tsx";

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
      <ListTable
        id="nodes"
        rows={nodes}
        rowKey={(n) => n.id}
        rowData={(n) => ({ node: n.id })}
        columns={[
          { head: "Node", cell: (n) => n.id },
          {
            head: "Status",
            cell: (n) => (
              <>
                <State value={n.status} />
                {n.message && <span class="error"> {n.message}</span>}
              </>
            ),
          },
          {
            head: "Sandboxes",
            cell: (n) => {
              const mine = on(n);
              return (
                <>
                  {n.sandboxCount}
                  {mine.length ? (
                    <div class="small-list">
                      {mine.map((s) => (
                        <SandboxLink id={s.sandboxID} />
                      ))}
                    </div>
                  ) : null}
                </>
              );
            },
          },
          { head: "Host CPU", cell: ({ metrics: m }) => (m ? `${m.cpuPercent}% of ${m.cpuCount}` : "-") },
          { head: "vCPUs allocated", cell: ({ metrics: m }) => (m ? m.allocatedCPU : "-") },
          { head: "Host memory", cell: ({ metrics: m }) => (m ? `${bytes(m.memoryUsedBytes)} / ${bytes(m.memoryTotalBytes)}` : "-") },
          { head: "Memory allocated", cell: ({ metrics: m }) => (m ? bytes(m.allocatedMemoryBytes) : "-") },
          {
            head: "Disk",
            cell: ({ metrics: m }) => {
              const d = m?.disks?.[0];
              return d ? `${bytes(d.usedBytes)} / ${bytes(d.totalBytes)}` : "-";
            },
          },
          { head: "Version", cell: (n) => n.version },
        ]}
      />
    </section>
  );
}
