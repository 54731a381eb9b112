/** A sandbox's processes, as envd lists them (`process.Process/List`), with a kill button each. */
import { useState } from "preact/hooks";
import { envdRpc, settings, type EnvdAccess } from "./api.ts";
import { usePoll } from "./hooks.ts";
import { errorMessage } from "../../util/error.ts";

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
      <table class="list" id="processes">
        <thead>
          <tr>
            <th>PID</th>
            <th>Command</th>
            <th>Directory</th>
            <th>Tag</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {rows.map((p) => (
            <tr key={p.pid}>
              <td>{p.pid}</td>
              <td class="mono">{[p.config.cmd, ...(p.config.args ?? [])].join(" ")}</td>
              <td class="mono">{p.config.cwd ?? ""}</td>
              <td>{p.tag ?? ""}</td>
              <td>
                <button class="small danger" onClick={() => kill(p.pid)}>
                  Kill
                </button>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {list.value && rows.length === 0 && <p class="muted">No processes.</p>}
    </div>
  );
}
