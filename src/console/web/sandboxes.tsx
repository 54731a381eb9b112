/**
 * The sandboxes page: every running and paused sandbox (all pages of `GET /v2/sandboxes`),
 * refreshed every `[console] refresh_ms` so new ones appear without a reload, with state,
 * template, age, and CPU and memory sparklines from the latest metrics
 * (`GET /sandboxes/metrics`, 100 ids a call) kept in the page for the last few minutes; a
 * metadata filter (`key=value, ...`, the API's `metadata` filter) and a create form.
 */
import { useState } from "preact/hooks";
import { allPages, api, settings } from "./api.ts";
import { Sparkline } from "./charts.tsx";
import { bytes, duration, pct } from "./format.ts";
import { usePoll } from "./hooks.ts";
import { errorMessage } from "../../util/error.ts";
import { ListTable, SandboxLink, State, type Column } from "./table.tsx";

/** `ListedSandbox` fields the console shows (the gateway adds `nodeID`). */
export interface Listed {
  sandboxID: string;
  templateID: string;
  alias?: string;
  startedAt: string;
  endAt: string;
  cpuCount: number;
  memoryMB: number;
  state: "running" | "paused";
  metadata: Record<string, string> | null;
  nodeID?: string;
}

/** `SandboxMetric` fields the console shows. */
export interface Metric {
  timestampUnix: number;
  cpuUsedPct: number;
  cpuCount: number;
  memUsed: number;
  memTotal: number;
  diskUsed: number;
  diskTotal: number;
}

/** Samples kept per sandbox for the sparklines. */
const HISTORY = 40;
const history = new Map<string, { at: number[]; cpu: number[]; mem: number[]; last: Metric }>();

function remember(id: string, m: Metric): void {
  const h = history.get(id) ?? { at: [], cpu: [], mem: [], last: m };
  if (h.at[h.at.length - 1] !== m.timestampUnix) {
    h.at.push(m.timestampUnix);
    h.cpu.push(m.cpuUsedPct);
    h.mem.push(m.memUsed);
    if (h.at.length > HISTORY) (h.at.shift(), h.cpu.shift(), h.mem.shift());
  }
  h.last = m;
  history.set(id, h);
}

/** Latest metrics of `ids` (100 per call), remembered for the sparklines. */
async function loadMetrics(ids: string[]): Promise<void> {
  for (let i = 0; i < ids.length; i += 100) {
    const q = new URLSearchParams({ sandbox_ids: ids.slice(i, i + 100).join(",") });
    const r = await api<{ sandboxes: Record<string, Metric> }>(`/sandboxes/metrics?${q}`);
    for (const [id, m] of Object.entries(r.data.sandboxes)) remember(id, m);
  }
}

/**
 * The API's metadata filter value for `k=v, k2=v2` (each key and value URL-encoded, pairs joined
 * as a query string, as the SDK sends it).
 * @throws Error naming a pair without `=`.
 */
export function metadataFilter(text: string): string {
  const pairs = text
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)
    .map((p) => {
      const i = p.indexOf("=");
      if (i <= 0) throw new Error(`"${p}" is not key=value`);
      return [encodeURIComponent(p.slice(0, i).trim()), encodeURIComponent(p.slice(i + 1).trim())];
    });
  return new URLSearchParams(pairs).toString();
}

/** All running and paused sandboxes matching `filter` (the API's metadata filter value). */
export async function listSandboxes(filter = ""): Promise<Listed[]> {
  return allPages<Listed>("/v2/sandboxes", { state: "running,paused", limit: "100", ...(filter ? { metadata: filter } : {}) });
}

function CreateForm({ onCreated }: { onCreated: () => void }) {
  const [template, setTemplate] = useState("base");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const create = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const r = await api<{ sandboxID: string }>("/v2/sandboxes", { method: "POST", body: { templateID: template.trim() } });
      onCreated();
      location.hash = `#/sandboxes/${encodeURIComponent(r.data.sandboxID)}`;
    } catch (err) {
      setError(errorMessage(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="inline" onSubmit={create}>
      <input aria-label="template" value={template} onInput={(e) => setTemplate((e.target as HTMLInputElement).value)} />
      <button disabled={busy || !template.trim()}>{busy ? "Creating…" : "New sandbox"}</button>
      {error && <span class="error">{error}</span>}
    </form>
  );
}

/** The sandboxes table's columns at time `now` (unix ms): sparklines while running, the shape otherwise. */
function sandboxColumns(now: number): Column<Listed>[] {
  const sampled = (s: Listed) => (s.state === "running" ? history.get(s.sandboxID) : undefined);
  return [
    {
      head: "Sandbox",
      cell: (s) => (
        <>
          <SandboxLink id={s.sandboxID} />
          {s.nodeID && <span class="muted"> @{s.nodeID}</span>}
        </>
      ),
    },
    { head: "State", cell: (s) => <State value={s.state} /> },
    { head: "Template", cell: (s) => s.alias ?? s.templateID },
    { head: "Age", cell: (s) => duration(now - Date.parse(s.startedAt)) },
    {
      head: "CPU",
      class: "metric",
      cell: (s) => {
        const h = sampled(s);
        return h ? (
          <>
            <Sparkline values={h.cpu} max={100} label={`CPU of ${s.sandboxID}`} /> {pct(h.last.cpuUsedPct)}
          </>
        ) : (
          "-"
        );
      },
    },
    {
      head: "Memory",
      class: "metric",
      cell: (s) => {
        const h = sampled(s);
        return h ? (
          <>
            <Sparkline values={h.mem} max={h.last.memTotal} label={`memory of ${s.sandboxID}`} /> {bytes(h.last.memUsed)}
          </>
        ) : (
          `${s.memoryMB} MiB`
        );
      },
    },
    { head: "Expires in", cell: (s) => (s.state === "running" ? duration(Date.parse(s.endAt) - now) : "-") },
    {
      head: "Metadata",
      class: "meta",
      cell: (s) =>
        Object.entries(s.metadata ?? {})
          .map(([k, v]) => `${k}=${v}`)
          .join(", "),
    },
  ];
}

export function Sandboxes() {
  const [filterText, setFilterText] = useState("");
  const [filter, setFilter] = useState("");
  const [filterError, setFilterError] = useState<string | null>(null);
  const [, metricsArrived] = useState(0);
  const [metricsError, setMetricsError] = useState<string | null>(null);
  const list = usePoll(
    async () => {
      const items = await listSandboxes(filter);
      // the rows show at once; their sparklines fill in when the metrics arrive
      loadMetrics(items.filter((s) => s.state === "running").map((s) => s.sandboxID)).then(
        () => (metricsArrived((n) => n + 1), setMetricsError(null)),
        (e) => setMetricsError(errorMessage(e)),
      );
      return items;
    },
    settings.refreshMs,
    [filter],
  );
  const applyFilter = (e: Event) => {
    e.preventDefault();
    try {
      setFilter(metadataFilter(filterText));
      setFilterError(null);
    } catch (err) {
      setFilterError(errorMessage(err));
    }
  };
  const rows = list.value ?? [];
  const now = Date.now();
  return (
    <section>
      <div class="toolbar">
        <h2>
          Sandboxes <span class="count">{list.value ? rows.length : "…"}</span>
        </h2>
        <form class="inline" onSubmit={applyFilter}>
          <input aria-label="metadata filter" placeholder="metadata: key=value, key2=value2" value={filterText} onInput={(e) => setFilterText((e.target as HTMLInputElement).value)} />
          <button>Filter</button>
          {filterError && <span class="error">{filterError}</span>}
        </form>
        <CreateForm onCreated={list.reload} />
      </div>
      {list.error && <p class="error">{list.error.message}</p>}
      {metricsError && <p class="error">metrics: {metricsError}</p>}
      <ListTable id="sandboxes" columns={sandboxColumns(now)} rows={rows} rowKey={(s) => s.sandboxID} rowData={(s) => ({ sandbox: s.sandboxID })} />
      {list.value && rows.length === 0 && <p class="muted">No sandboxes{filter ? " match the filter" : ""}.</p>}
    </section>
  );
}
