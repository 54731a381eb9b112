/**
 * The console's entry: the login gate, the navigation and the hash router. Pages:
 * #/sandboxes, #/sandboxes/{id}[/{tab}], #/templates[/{id}[/builds/{buildID}]], #/snapshots,
 * #/volumes, #/nodes.
 */
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { apiKey, forgetKey, settings } from "./api.ts";
import { useHashPath } from "./hooks.ts";
import { Login } from "./login.tsx";
import { Sandboxes } from "./sandboxes.tsx";
import { SandboxPage } from "./sandbox.tsx";
import { Templates } from "./templates.tsx";
import { Snapshots } from "./snapshots.tsx";
import { Volumes } from "./volumes.tsx";
import { Nodes } from "./nodes.tsx";

const NAV = [
  ["/sandboxes", "Sandboxes"],
  ["/templates", "Templates"],
  ["/snapshots", "Snapshots"],
  ["/volumes", "Volumes"],
  ["/nodes", "Nodes"],
] as const;

function Page({ path }: { path: string }) {
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  switch (parts[0]) {
    case "sandboxes":
      return parts[1] ? <SandboxPage id={parts[1]} tab={parts[2] ?? "overview"} /> : <Sandboxes />;
    case "templates":
      return <Templates id={parts[1] ?? null} buildId={parts[2] === "builds" ? (parts[3] ?? null) : null} />;
    case "snapshots":
      return <Snapshots />;
    case "volumes":
      return <Volumes />;
    case "nodes":
      return <Nodes />;
    default:
      return <p class="error">No page {path}</p>;
  }
}

function App() {
  const [authed, setAuthed] = useState(apiKey() !== null);
  const path = useHashPath();
  useEffect(() => {
    const out = () => setAuthed(false);
    window.addEventListener("agentenv:logout", out);
    return () => window.removeEventListener("agentenv:logout", out);
  }, []);
  if (!authed) return <Login onLogin={() => setAuthed(true)} />;
  return (
    <div class="shell">
      <header>
        <span class="brand">AgentENV</span>
        <span class="role">{settings.role}</span>
        <nav>
          {NAV.map(([href, label]) => (
            <a href={`#${href}`} class={path.startsWith(href) ? "active" : ""}>
              {label}
            </a>
          ))}
        </nav>
        <button class="link" onClick={() => forgetKey()}>
          Log out
        </button>
      </header>
      <main>
        <Page path={path} />
      </main>
    </div>
  );
}

render(<App />, document.getElementById("app")!);
