/**
 * One sandbox: its record (`GET /sandboxes/{id}`, refreshed), the lifecycle buttons (pause,
 * resume, kill, snapshot, fork) and tabs: metrics charts, live log tail, processes, files,
 * terminal, and its snapshots.
 */
import type { ComponentChildren } from "preact";
import { useState } from "preact/hooks";
import { api, settings, type EnvdAccess } from "./api.ts";
import { TimeChart } from "./charts.tsx";
import { bytes, duration, pct, when } from "./format.ts";
import { usePoll } from "./hooks.ts";
import { LogTail } from "./logs.tsx";
import { Processes } from "./processes.tsx";
import { Files } from "./files.tsx";
import { Terminal } from "./terminal.tsx";
import type { Metric } from "./sandboxes.tsx";
import { errorMessage } from "../../util/error.ts";
import { ListTable, SandboxLink, State } from "./table.tsx";
import { CREATE_DEFAULT_TIMEOUT_SECS } from "../../orchestrator/timeouts.ts";

/** `SandboxDetail` fields the page shows. */
interface Detail {
  sandboxID: string;
  templateID: string;
  alias?: string;
  state: "running" | "paused";
  startedAt: string;
  endAt: string;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB?: number;
  envdVersion: string;
  envdAccessToken?: string;
  metadata: Record<string, string> | null;
  volumeMounts?: { name: string; path: string }[];
  lifecycle?: { autoResume: boolean; onTimeout: string };
}

const TABS = [
  ["overview", "Metrics"],
  ["logs", "Logs"],
  ["processes", "Processes"],
  ["files", "Files"],
  ["terminal", "Terminal"],
  ["snapshots", "Snapshots"],
] as const;

function Actions({ d, onChange }: { d: Detail; onChange: () => void }) {
  const [busy, setBusy] = useState<string | null>(null);
  const [note, setNote] = useState<{ text: string; error?: boolean; links?: string[] } | null>(null);
  const [snapName, setSnapName] = useState("");
  const [forks, setForks] = useState("1");
  const [forkTimeout, setForkTimeout] = useState(String(CREATE_DEFAULT_TIMEOUT_SECS));
  const [armedKill, setArmedKill] = useState(false);
  const id = encodeURIComponent(d.sandboxID);
  const act = async (what: string, fn: () => Promise<{ text: string; links?: string[] }>) => {
    setBusy(what);
    setNote(null);
    try {
      setNote(await fn());
    } catch (e) {
      setNote({ text: `${what} failed: ${errorMessage(e)}`, error: true });
    } finally {
      setBusy(null);
      onChange();
    }
  };
  const running = d.state === "running";
  return (
    <div class="actions">
      {running ? (
        <button id="pause" disabled={busy !== null} onClick={() => act("pause", async () => (await api(`/sandboxes/${id}/pause`, { method: "POST", body: {} }), { text: "paused" }))}>
          {busy === "pause" ? "Pausing…" : "Pause"}
        </button>
      ) : (
        <button id="resume" disabled={busy !== null} onClick={() => act("resume", async () => (await api(`/v2/sandboxes/${id}/connect`, { method: "POST", body: {} }), { text: "resumed" }))}>
          {busy === "resume" ? "Resuming…" : "Resume"}
        </button>
      )}
      <form
        class="inline"
        onSubmit={(e) => {
          e.preventDefault();
          void act("snapshot", async () => {
            const r = await api<{ snapshotID: string; names: string[] }>(`/sandboxes/${id}/snapshots`, { method: "POST", body: snapName.trim() ? { name: snapName.trim() } : {} });
            return { text: `snapshot ${r.data.snapshotID}${r.data.names.length ? ` (${r.data.names.join(", ")})` : ""} committed` };
          });
        }}
      >
        <input aria-label="snapshot name" placeholder="snapshot name (optional)" value={snapName} onInput={(e) => setSnapName((e.target as HTMLInputElement).value)} />
        <button id="snapshot" disabled={busy !== null || !running}>
          {busy === "snapshot" ? "Snapshotting…" : "Snapshot"}
        </button>
      </form>
      <form
        class="inline"
        onSubmit={(e) => {
          e.preventDefault();
          void act("fork", async () => {
            const r = await api<{ sandbox?: { sandboxID: string }; error?: { message: string } }[]>(`/sandboxes/${id}/fork`, { method: "POST", body: { count: Number(forks), timeout: Number(forkTimeout) } });
            const ok = r.data.flatMap((x) => (x.sandbox ? [x.sandbox.sandboxID] : []));
            const bad = r.data.flatMap((x) => (x.error ? [x.error.message] : []));
            return { text: `forked ${ok.length}${bad.length ? `, ${bad.length} failed: ${bad.join("; ")}` : ""}`, links: ok };
          });
        }}
      >
        <input aria-label="fork count" type="number" min="1" max="100" value={forks} onInput={(e) => setForks((e.target as HTMLInputElement).value)} />
        <input aria-label="fork timeout" title="lifetime of each child, seconds" type="number" min="1" value={forkTimeout} onInput={(e) => setForkTimeout((e.target as HTMLInputElement).value)} />
        <button id="fork" disabled={busy !== null || !running}>
          {busy === "fork" ? "Forking…" : "Fork"}
        </button>
      </form>
      {armedKill ? (
        <button
          id="kill-confirm"
          class="danger"
          disabled={busy !== null}
          onClick={() =>
            act("kill", async () => {
              await api(`/sandboxes/${id}`, { method: "DELETE" });
              location.hash = "#/sandboxes";
              return { text: "killed" };
            })
          }
        >
          Really kill?
        </button>
      ) : (
        <button id="kill" class="danger" onClick={() => setArmedKill(true)}>
          Kill
        </button>
      )}
      {note && (
        <p class={note.error ? "error" : "note"} role="status">
          {note.text}
          {note.links?.map((l) => (
            <>
              {" "}
              <SandboxLink id={l} />
            </>
          ))}
        </p>
      )}
    </div>
  );
}

function MetricsTab({ id }: { id: string }) {
  const m = usePoll(() => api<Metric[]>(`/sandboxes/${encodeURIComponent(id)}/metrics`).then((r) => r.data), settings.refreshMs, [id]);
  const samples = m.value ?? [];
  if (m.error) return <p class="error">{m.error.message}</p>;
  if (m.value && samples.length === 0) return <p class="muted">No samples yet (the node samples running sandboxes every [metrics] sample_interval_ms).</p>;
  const t = samples.map((s) => s.timestampUnix);
  const last = samples[samples.length - 1];
  return (
    <div class="charts">
      {last && (
        <p>
          CPU {pct(last.cpuUsedPct)} of {last.cpuCount} vCPU · memory {bytes(last.memUsed)} of {bytes(last.memTotal)} · disk {bytes(last.diskUsed)} of {bytes(last.diskTotal)}
        </p>
      )}
      <TimeChart title="CPU %" times={t} series={[{ label: "CPU", values: samples.map((s) => s.cpuUsedPct), stroke: "#2b6cb0" }]} format={(v) => `${v.toFixed(0)}%`} />
      <TimeChart title="Memory" times={t} series={[{ label: "used", values: samples.map((s) => s.memUsed), stroke: "#2f855a" }, { label: "total", values: samples.map((s) => s.memTotal), stroke: "#a0aec0" }]} format={bytes} />
      <TimeChart title="Disk" times={t} series={[{ label: "used", values: samples.map((s) => s.diskUsed), stroke: "#c05621" }, { label: "total", values: samples.map((s) => s.diskTotal), stroke: "#a0aec0" }]} format={bytes} />
    </div>
  );
}

function SnapshotsTab({ id }: { id: string }) {
  const s = usePoll(() => api<{ snapshotID: string; names: string[]; createdAt?: string }[]>(`/snapshots?${new URLSearchParams({ sandboxID: id })}`).then((r) => r.data), settings.refreshMs, [id]);
  if (s.error) return <p class="error">{s.error.message}</p>;
  const list = s.value ?? [];
  return (
    <div>
      <p class="muted">
        Snapshots taken from this sandbox, oldest first; the <a href="#/snapshots">snapshot tree</a> shows what was created from them.
      </p>
      <ListTable
        id="sandbox-snapshots"
        rows={list}
        rowKey={(x) => x.snapshotID}
        columns={[
          { head: "Snapshot", cell: (x) => x.snapshotID },
          { head: "Names", cell: (x) => x.names.join(", ") },
          { head: "Taken", cell: (x) => when(x.createdAt ?? null) },
        ]}
      />
    </div>
  );
}

export function SandboxPage({ id, tab }: { id: string; tab: string }) {
  const d = usePoll(() => api<Detail>(`/sandboxes/${encodeURIComponent(id)}`).then((r) => r.data), settings.refreshMs, [id]);
  if (d.error && !d.value) return <p class="error">{d.error.message}</p>;
  const s = d.value;
  if (!s) return <p class="muted">Loading {id}…</p>;
  const access: EnvdAccess = { sandboxId: s.sandboxID, token: s.envdAccessToken ?? null, user: "user" };
  const running = s.state === "running";
  const needsRunning = (body: ComponentChildren) => (running ? body : <p class="muted">The sandbox is paused: resume it to use this tab.</p>);
  const now = Date.now();
  return (
    <section>
      <div class="toolbar">
        <h2>
          <a href="#/sandboxes">Sandboxes</a> / {s.sandboxID} <State id="state" value={s.state} />
        </h2>
      </div>
      {d.error && <p class="error">{d.error.message}</p>}
      <dl class="facts">
        <dt>Template</dt>
        <dd>{s.alias ?? s.templateID}</dd>
        <dt>Started</dt>
        <dd>
          {when(s.startedAt)} ({duration(now - Date.parse(s.startedAt))} ago)
        </dd>
        <dt>Expires</dt>
        <dd>{running ? `${when(s.endAt)} (in ${duration(Date.parse(s.endAt) - now)})` : "-"}</dd>
        <dt>Shape</dt>
        <dd>
          {s.cpuCount} vCPU · {s.memoryMB} MiB{s.diskSizeMB ? ` · disk ${s.diskSizeMB} MiB` : ""}
        </dd>
        <dt>envd</dt>
        <dd>{s.envdVersion}</dd>
        <dt>Metadata</dt>
        <dd>
          {Object.entries(s.metadata ?? {})
            .map(([k, v]) => `${k}=${v}`)
            .join(", ") || "-"}
        </dd>
        {s.volumeMounts?.length ? (
          <>
            <dt>Volumes</dt>
            <dd>{s.volumeMounts.map((v) => `${v.name} at ${v.path}`).join(", ")}</dd>
          </>
        ) : null}
      </dl>
      <Actions d={s} onChange={d.reload} />
      <nav class="tabs">
        {TABS.map(([t, label]) => (
          <a href={`#/sandboxes/${encodeURIComponent(id)}/${t}`} class={t === tab ? "active" : ""} id={`tab-${t}`}>
            {label}
          </a>
        ))}
      </nav>
      <div class="tab">
        {tab === "overview" && <MetricsTab id={id} />}
        {tab === "logs" && <LogTail id={id} />}
        {tab === "processes" && needsRunning(<Processes access={access} />)}
        {tab === "files" && needsRunning(<Files access={access} />)}
        {tab === "terminal" && needsRunning(<Terminal id={id} />)}
        {tab === "snapshots" && <SnapshotsTab id={id} />}
      </div>
    </section>
  );
}
