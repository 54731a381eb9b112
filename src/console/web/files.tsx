/**
 * A sandbox's file browser through envd: a directory listing (`filesystem.Filesystem/ListDir`),
 * downloads (`GET /files`, saved by the browser) and uploads (`POST /files`, the file's bytes as
 * they are) into the directory shown.
 */
import { useState } from "preact/hooks";
import { envdDownload, envdRpc, envdUpload, type EnvdAccess } from "./api.ts";
import { bytes, when } from "./format.ts";
import { usePoll } from "./hooks.ts";
import { errorMessage } from "../../util/error.ts";
import { ListTable } from "./table.tsx";

interface Entry {
  name: string;
  type: string;
  path: string;
  size?: string | number;
  permissions?: string;
  owner?: string;
  modifiedTime?: string;
  symlinkTarget?: string;
}

const isDir = (e: Entry) => e.type === "FILE_TYPE_DIRECTORY";

/** `dir` joined with `name`, and the parent of `dir`. */
const join = (dir: string, name: string) => `${dir.replace(/\/+$/, "")}/${name}`;
const parent = (dir: string) => dir.replace(/\/+$/, "").replace(/\/[^/]*$/, "") || "/";

export function Files({ access }: { access: EnvdAccess }) {
  const [dir, setDir] = useState("/home/user");
  const [typed, setTyped] = useState("/home/user");
  const [note, setNote] = useState<{ text: string; error?: boolean } | null>(null);
  const list = usePoll(
    () => envdRpc<{ entries?: Entry[] }>(access, "filesystem.Filesystem/ListDir", { path: dir, depth: 1 }).then((r) => r.entries ?? []),
    60_000,
    [access.sandboxId, dir],
  );
  const go = (d: string) => {
    setDir(d);
    setTyped(d);
  };
  const download = async (e: Entry) => {
    try {
      const blob = await envdDownload(access, e.path);
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = e.name;
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
    } catch (err) {
      setNote({ text: `download of ${e.path} failed: ${errorMessage(err)}`, error: true });
    }
  };
  const upload = async (files: FileList | null) => {
    for (const f of Array.from(files ?? [])) {
      const path = join(dir, f.name);
      try {
        await envdUpload(access, path, f);
        setNote({ text: `uploaded ${path} (${bytes(f.size)})` });
      } catch (err) {
        setNote({ text: `upload of ${path} failed: ${errorMessage(err)}`, error: true });
      }
    }
    list.reload();
  };
  const rows = [...(list.value ?? [])].sort((a, b) => Number(isDir(b)) - Number(isDir(a)) || a.name.localeCompare(b.name));
  return (
    <div>
      <div class="toolbar">
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            go(typed.trim() || "/");
          }}
        >
          <input aria-label="directory" class="path" value={typed} onInput={(e) => setTyped((e.target as HTMLInputElement).value)} />
          <button>Open</button>
        </form>
        <button onClick={() => go(parent(dir))} disabled={dir === "/"}>
          Up
        </button>
        <button onClick={() => list.reload()}>Refresh</button>
        <label class="upload">
          Upload <input id="upload" type="file" multiple onChange={(e) => void upload((e.target as HTMLInputElement).files)} />
        </label>
      </div>
      {note && (
        <p class={note.error ? "error" : "note"} role="status">
          {note.text}
        </p>
      )}
      {list.error && <p class="error">{list.error.message}</p>}
      <ListTable
        id="files"
        rows={rows}
        rowKey={(e) => e.path}
        rowData={(e) => ({ path: e.path })}
        columns={[
          {
            head: "Name",
            cell: (e) => (
              <>
                {isDir(e) ? (
                  <button class="link" onClick={() => go(e.path)}>
                    {e.name}/
                  </button>
                ) : (
                  <span>{e.name}</span>
                )}
                {e.symlinkTarget ? <span class="muted"> → {e.symlinkTarget}</span> : null}
              </>
            ),
          },
          { head: "Size", cell: (e) => (isDir(e) ? "" : bytes(Number(e.size ?? 0))) },
          { head: "Mode", class: "mono", cell: (e) => e.permissions ?? "" },
          { head: "Owner", cell: (e) => e.owner ?? "" },
          { head: "Modified", cell: (e) => when(e.modifiedTime ?? null) },
          {
            head: "",
            cell: (e) =>
              !isDir(e) && (
                <button class="small" onClick={() => void download(e)}>
                  Download
                </button>
              ),
          },
        ]}
      />
    </div>
  );
}
