/**
 * Test harness: starts a real envd as a child process (`bun src/cli/main.ts envd --port 0`),
 * makes sure the unprivileged `user` account the SDK defaults to exists, and initialises envd
 * through POST /init like the host does.
 */
import { spawnSync, type Subprocess } from "bun";
import { join } from "node:path";

/** Repository root. */
export const ROOT = join(import.meta.dir, "..", "..");

/** Create the `user` account (home /home/user) if missing; idempotent. */
export function ensureUserAccount(): { uid: number; gid: number } {
  if (spawnSync(["id", "-u", "user"]).exitCode !== 0) {
    const r = spawnSync(["useradd", "-m", "-s", "/bin/bash", "user"]);
    if (r.exitCode !== 0 && spawnSync(["id", "-u", "user"]).exitCode !== 0) {
      throw new Error(`useradd user failed: ${r.stderr.toString()}`);
    }
  }
  // a supplementary group, so tests see that processes get the user's full group list
  if (spawnSync(["getent", "group", "envdtest"]).exitCode !== 0) spawnSync(["groupadd", "envdtest"]);
  if (!spawnSync(["id", "-Gn", "user"]).stdout.toString().split(/\s+/).includes("envdtest")) {
    spawnSync(["usermod", "-aG", "envdtest", "user"]);
  }
  const uid = Number(spawnSync(["id", "-u", "user"]).stdout.toString().trim());
  const gid = Number(spawnSync(["id", "-g", "user"]).stdout.toString().trim());
  return { uid, gid };
}

/** A running envd child process. */
export interface EnvdChild {
  url: string;
  port: number;
  proc: Subprocess;
  stop(): Promise<void>;
}

/**
 * Start envd on a free loopback port and wait for its readiness line.
 * @param command how to run the CLI (default: `bun src/cli/main.ts` from source).
 * @param env extra environment, e.g. `AENV__envd__ca_dir` config overrides.
 * @param args extra `agentenv envd` arguments, e.g. `["--settings", file]`.
 * @param listen address and port to bind (default any free port on 127.0.0.1).
 */
export async function startEnvdChild(
  command: string[] = ["bun", join(ROOT, "src/cli/main.ts")],
  env: Record<string, string> = {},
  args: string[] = [],
  listen: { host: string; port: number } = { host: "127.0.0.1", port: 0 },
): Promise<EnvdChild> {
  const proc = Bun.spawn([...command, "envd", "--port", String(listen.port), "--host", listen.host, "--no-clock-sync", ...args], {
    stdout: "pipe",
    stderr: "inherit",
    env: { ...process.env, AENV_LOG_LEVEL: "warn", ...env },
  });
  const reader = proc.stdout.getReader();
  let text = "";
  const deadline = Date.now() + 15_000;
  while (!/envd listening on (\d+)/.test(text)) {
    if (Date.now() > deadline) throw new Error(`envd did not start: ${text}`);
    const r = await reader.read();
    if (r.done) throw new Error(`envd exited before listening: ${text}`);
    text += new TextDecoder().decode(r.value);
  }
  reader.releaseLock();
  const port = Number(/envd listening on (\d+)/.exec(text)![1]);
  return {
    url: `http://${listen.host}:${port}`,
    port,
    proc,
    async stop() {
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 5000);
      await proc.exited;
      clearTimeout(t);
    },
  };
}

/** POST /init as the host does. Returns the HTTP status. */
export async function initEnvd(url: string, body: Record<string, unknown>, token?: string): Promise<Response> {
  return fetch(`${url}/init`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(token ? { "x-access-token": token } : {}) },
    body: JSON.stringify(body),
  });
}

/** State of a pid from /proc (`R`, `S`, `Z`, ...), or undefined when it no longer exists. */
export function procState(pid: number): string | undefined {
  try {
    const s = require("node:fs").readFileSync(`/proc/${pid}/stat`, "utf8") as string;
    return s.slice(s.lastIndexOf(")") + 2).split(" ")[0];
  } catch {
    return undefined;
  }
}

