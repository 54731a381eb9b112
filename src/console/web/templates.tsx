/**
 * Templates and their builds: the template list (`GET /templates`), one template's builds
 * (`GET /templates/{id}`), a build's status and log followed live
 * (`GET /templates/{id}/builds/{b}/status?logsOffset=`) until it ends, and a build form: a
 * Dockerfile without COPY (the browser holds no build context; `agentenv template build` uploads
 * one), whose FROM names a template of the node (built on it) or a registry image, as the node
 * decides (src/template/spec.ts dockerfileBase).
 */
import { useEffect, useRef, useState } from "preact/hooks";
import { parseDockerfile } from "../../template/dockerfile.ts";
import { api, settings } from "./api.ts";
import { when } from "./format.ts";
import { usePoll } from "./hooks.ts";
import { errorMessage } from "../../util/error.ts";
import { ListTable, State } from "./table.tsx";

interface TemplateRow {
  templateID: string;
  aliases: string[];
  buildStatus: string;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  spawnCount: number;
  lastSpawnedAt: string | null;
  createdAt: string;
}

interface Build {
  buildID: string;
  status: string;
  createdAt: string;
  finishedAt?: string;
  cpuCount: number;
  memoryMB: number;
}

interface LogLine {
  timestamp: string;
  level: string;
  message: string;
}

const enc = encodeURIComponent;

/**
 * Start a build of `dockerfile` as template `name` (E2B's v3 flow: register, then start).
 * @returns the template and build ids.
 * @throws Error for a Dockerfile the parser refuses or one with COPY/ADD; ApiFailure when the node refuses.
 */
async function startBuild(name: string, dockerfile: string): Promise<{ templateID: string; buildID: string }> {
  const df = parseDockerfile(dockerfile, (src) => {
    throw new Error(`COPY ${src}: the console has no build context; use \`agentenv template build --dockerfile\``);
  });
  const reg = (await api<{ templateID: string; buildID: string }>("/v3/templates", { method: "POST", body: { name } })).data;
  // FROM goes as `from`: the node decides whether it names one of its templates or an image
  await api(`/v2/templates/${enc(reg.templateID)}/builds/${enc(reg.buildID)}`, {
    method: "POST",
    body: { from: df.from, steps: df.steps, startCmd: df.startCmd || undefined, readyCmd: df.readyCmd || undefined },
  });
  return reg;
}

function BuildForm() {
  const [name, setName] = useState("");
  const [text, setText] = useState("FROM base\nRUN echo hello > /home/user/hello.txt\n");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const r = await startBuild(name.trim(), text);
      location.hash = `#/templates/${enc(r.templateID)}/builds/${enc(r.buildID)}`;
    } catch (err) {
      setError(errorMessage(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="build" onSubmit={submit}>
      <h3>Build a template</h3>
      <input aria-label="template name" placeholder="name[:tag]" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
      <textarea aria-label="Dockerfile" rows={6} value={text} onInput={(e) => setText((e.target as HTMLTextAreaElement).value)} />
      <button id="build" disabled={busy || !name.trim()}>
        {busy ? "Starting…" : "Build"}
      </button>
      {error && <p class="error">{error}</p>}
    </form>
  );
}

function TemplateList() {
  const list = usePoll(() => api<TemplateRow[]>("/templates").then((r) => r.data), settings.refreshMs);
  const rows = list.value ?? [];
  return (
    <section>
      <h2>Templates</h2>
      {list.error && <p class="error">{list.error.message}</p>}
      <ListTable
        id="templates"
        rows={rows}
        rowKey={(t) => t.templateID}
        columns={[
          { head: "Template", cell: (t) => <a href={`#/templates/${enc(t.templateID)}`}>{t.templateID}</a> },
          { head: "Names", cell: (t) => t.aliases.join(", ") },
          { head: "Status", cell: (t) => <State value={t.buildStatus} /> },
          { head: "Shape", cell: (t) => `${t.cpuCount} vCPU · ${t.memoryMB} MiB · ${t.diskSizeMB} MiB disk` },
          { head: "Spawns", cell: (t) => t.spawnCount },
          { head: "Last spawned", cell: (t) => when(t.lastSpawnedAt) },
          { head: "Created", cell: (t) => when(t.createdAt) },
        ]}
      />
      <BuildForm />
    </section>
  );
}

function TemplateBuilds({ id }: { id: string }) {
  const t = usePoll(() => api<{ templateID: string; aliases: string[]; builds: Build[] }>(`/templates/${enc(id)}`).then((r) => r.data), settings.refreshMs, [id]);
  if (t.error) return <p class="error">{t.error.message}</p>;
  if (!t.value) return <p class="muted">Loading…</p>;
  const builds = [...t.value.builds].sort((a, b) => Date.parse(b.createdAt) - Date.parse(a.createdAt));
  return (
    <section>
      <h2>
        <a href="#/templates">Templates</a> / {t.value.aliases.join(", ") || id}
      </h2>
      <ListTable
        id="builds"
        rows={builds}
        rowKey={(b) => b.buildID}
        columns={[
          { head: "Build", cell: (b) => <a href={`#/templates/${enc(id)}/builds/${enc(b.buildID)}`}>{b.buildID}</a> },
          { head: "Status", cell: (b) => <State value={b.status} /> },
          { head: "Started", cell: (b) => when(b.createdAt) },
          { head: "Finished", cell: (b) => when(b.finishedAt ?? null) },
          { head: "Shape", cell: (b) => `${b.cpuCount} vCPU · ${b.memoryMB} MiB` },
        ]}
      />
    </section>
  );
}

/** A build's log, followed until the build is ready or failed. */
function BuildLog({ id, buildId }: { id: string; buildId: string }) {
  const [status, setStatus] = useState("…");
  const [reason, setReason] = useState<string | null>(null);
  const [lines, setLines] = useState<LogLine[]>([]);
  const [error, setError] = useState<string | null>(null);
  const box = useRef<HTMLDivElement>(null);
  useEffect(() => {
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let offset = 0;
    setLines([]);
    const tick = async () => {
      try {
        const r = await api<{ status: string; logEntries: LogLine[]; reason?: { message: string; step?: string } }>(`/templates/${enc(id)}/builds/${enc(buildId)}/status?logsOffset=${offset}`);
        if (stopped) return;
        offset += r.data.logEntries.length;
        if (r.data.logEntries.length) setLines((old) => [...old, ...r.data.logEntries]);
        setStatus(r.data.status);
        setReason(r.data.reason ? `${r.data.reason.step ? `step ${r.data.reason.step}: ` : ""}${r.data.reason.message}` : null);
        setError(null);
        const done = (r.data.status === "ready" || r.data.status === "error") && r.data.logEntries.length === 0;
        if (done) return;
        timer = setTimeout(tick, r.data.logEntries.length ? 0 : Math.min(settings.refreshMs, 1000));
      } catch (e) {
        if (stopped) return;
        setError(errorMessage(e));
        timer = setTimeout(tick, settings.refreshMs);
      }
    };
    void tick();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [id, buildId]);
  useEffect(() => {
    if (box.current) box.current.scrollTop = box.current.scrollHeight;
  }, [lines]);
  return (
    <section>
      <h2>
        <a href="#/templates">Templates</a> / <a href={`#/templates/${enc(id)}`}>{id}</a> / build {buildId}{" "}
        <State id="build-status" value={status} />
      </h2>
      {reason && <p class="error">{reason}</p>}
      {error && <p class="error">{error}</p>}
      <div class="logs" id="build-log" ref={box}>
        {lines.map((l) => (
          <div class={`line ${l.level}`}>
            <span class="t">{when(l.timestamp)}</span> <span class="msg">{l.message}</span>
          </div>
        ))}
      </div>
    </section>
  );
}

export function Templates({ id, buildId }: { id: string | null; buildId: string | null }) {
  if (id && buildId) return <BuildLog id={id} buildId={buildId} />;
  if (id) return <TemplateBuilds id={id} />;
  return <TemplateList />;
}
