/** Volumes (`GET /volumes`) with the live sandboxes that mount them; create and delete. */
import { useState } from "preact/hooks";
import { api, settings } from "./api.ts";
import { usePoll } from "./hooks.ts";
import { listSandboxes } from "./sandboxes.tsx";
import { errorMessage } from "../../util/error.ts";
import { ListTable, SandboxLink } from "./table.tsx";

interface VolumeRow {
  volumeID: string;
  name: string;
}

export function Volumes() {
  const data = usePoll(async () => {
    const [vols, live] = await Promise.all([api<VolumeRow[]>("/volumes").then((r) => r.data), listSandboxes()]);
    return { vols, live };
  }, settings.refreshMs);
  const [name, setName] = useState("");
  const [note, setNote] = useState<{ text: string; error?: boolean } | null>(null);
  const create = async (e: Event) => {
    e.preventDefault();
    try {
      await api("/volumes", { method: "POST", body: { name: name.trim() } });
      setNote({ text: `volume ${name.trim()} created` });
      setName("");
    } catch (err) {
      setNote({ text: errorMessage(err), error: true });
    }
    data.reload();
  };
  const remove = async (v: VolumeRow) => {
    try {
      await api(`/volumes/${encodeURIComponent(v.volumeID)}`, { method: "DELETE" });
      setNote({ text: `volume ${v.name} deleted` });
    } catch (err) {
      setNote({ text: errorMessage(err), error: true });
    }
    data.reload();
  };
  if (data.error && !data.value) return <p class="error">{data.error.message}</p>;
  const vols = data.value?.vols ?? [];
  const mounts = (v: VolumeRow) => (data.value?.live ?? []).flatMap((s) => ((s as { volumeMounts?: { name: string; path: string }[] }).volumeMounts ?? []).filter((m) => m.name === v.name).map((m) => ({ id: s.sandboxID, path: m.path })));
  return (
    <section>
      <div class="toolbar">
        <h2>
          Volumes <span class="count">{data.value ? vols.length : "…"}</span>
        </h2>
        <form class="inline" onSubmit={create}>
          <input aria-label="volume name" placeholder="name (a DNS label)" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
          <button disabled={!name.trim()}>Create volume</button>
        </form>
      </div>
      {note && <p class={note.error ? "error" : "note"}>{note.text}</p>}
      <ListTable
        id="volumes"
        rows={vols}
        rowKey={(v) => v.volumeID}
        columns={[
          { head: "Name", cell: (v) => v.name },
          { head: "Volume", class: "mono", cell: (v) => v.volumeID },
          {
            head: "Mounted by",
            cell: (v) =>
              mounts(v).map((m) => (
                <>
                  <SandboxLink id={m.id} /> at {m.path}{" "}
                </>
              )),
          },
          {
            head: "",
            cell: (v) => (
              <button class="small danger" onClick={() => void remove(v)}>
                Delete
              </button>
            ),
          },
        ]}
      />
    </section>
  );
}
