/** A sandbox's processes, as envd lists them (`process.Process/List`), with a kill button each. */
import { useState } from "preact/hooks";
import { envdRpc, settings, type EnvdAccess } from "./api.ts";
import { usePoll } from "./hooks.ts";
import { errorMessage } from "../../util/error.ts";
import { ListTable } from "./table.tsx";

interface ProcessInfo {
  pid: number;
  tag?: string;
  config: { cmd: string; args?: string[]; cwd?: string };
}

export function Processes({ access }: { access: EnvdAccess }) {
  const list = usePoll(() => envdRpc<{ processes?: ProcessInfo[] }>(access, "process.Process/List", {}).then((r) => r.processes ?? []), settings.refreshMs, [access.sandboxId]);
  const [error, setError] = useState<string | null>(null);
  const kill = async (pid: number) => {
    try {
      await envdRpc(access, "process.Process/SendSignal", { process: { pid }, signal: "SIGNAL_SIGKILL" });
      setError(null);
    } catch (e) {
      setError(`kill ${pid}: ${errorMessage(e)}`);
    }
    list.reload();
  };
  const rows = [...(list.value ?? [])].sort((a, b) => a.pid - b.pid);
  return (
    <div>
      <p class="muted">Processes started through envd (commands, terminals, the start command); the guest's own daemons are not listed.</p>
      {(list.error || error) && <p class="error">{error ?? list.error?.message}</p>}
      <ListTable
        id="processes"
        rows={rows}
        rowKey={(p) => p.pid}
        columns={[
          { head: "PID", cell: (p) => p.pid },
          { head: "Command", class: "mono", cell: (p) => [p.config.cmd, ...(p.config.args ?? [])].join(" ") },
          { head: "Directory", class: "mono", cell: (p) => p.config.cwd ?? "" },
          { head: "Tag", cell: (p) => p.tag ?? "" },
          {
            head: "",
            cell: (p) => (
              <button class="small danger" onClick={() => kill(p.pid)}>
                Kill
              </button>
            ),
          },
        ]}
      />
      {list.value && rows.length === 0 && <p class="muted">No processes.</p>}
    </div>
  );
}
