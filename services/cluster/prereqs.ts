/**
 * What `agentenv cluster up` needs before it starts nodes: the guest kernel and the base
 * template in the data dir the nodes boot from (`--from-home`). Without them every create would
 * answer 404, so cluster up builds what is missing first (the same `agentenv kernel build` and
 * `agentenv template build-base` that scripts/start.sh runs, their progress on stderr), or with
 * `--no-build` stops with one line saying what to run.
 */
import type { Config } from "../../src/config/index.ts";
import { resolveTemplate } from "../../src/template/index.ts";
import { resolveKernelPath } from "../../src/vmm/index.ts";
import { ClusterError } from "./errors.ts";

/** The template every node creates sandboxes from by default. */
export const BASE_TEMPLATE = "base";

/** What is missing in `fromHome`: the steps to build it, in order (empty: nothing). */
export function missingPrerequisites(cfg: Config, fromHome: string): { what: string; command: string[] }[] {
  const out: { what: string; command: string[] }[] = [];
  try {
    resolveKernelPath({ ...cfg, home_path: fromHome });
  } catch {
    out.push({ what: "guest kernel", command: ["kernel", "build"] });
  }
  try {
    resolveTemplate(fromHome, BASE_TEMPLATE);
  } catch {
    out.push({ what: "base template", command: ["template", "build-base"] });
  }
  return out;
}

/** The one line telling an operator what to run (for `--no-build`). */
export function missingMessage(fromHome: string, missing: { what: string; command: string[] }[]): string {
  const cmds = missing.map((m) => `\`AENV_HOME_PATH=${fromHome} agentenv ${m.command.join(" ")}\``).join(" then ");
  return `no ${missing.map((m) => m.what).join(" and no ")} in ${fromHome}: run ${cmds} (or scripts/start.sh once), or drop --no-build to build them now`;
}

/**
 * Build what is missing, one step after the other, with `self` (this binary) and the home set
 * to `fromHome`; each step's progress goes to stderr.
 * @throws ClusterError `cluster.prerequisite_failed` naming the step that failed and its exit code.
 */
export async function buildPrerequisites(self: string[], fromHome: string, missing: { what: string; command: string[] }[], print: (line: string) => void): Promise<void> {
  for (const m of missing) {
    print(`cluster: building the ${m.what} in ${fromHome} (agentenv ${m.command.join(" ")}; the kernel takes minutes)`);
    const p = Bun.spawn([...self, ...m.command], { env: { ...process.env, AENV_HOME_PATH: fromHome }, stdin: "ignore", stdout: "ignore", stderr: "inherit" });
    const code = await p.exited;
    if (code !== 0) throw new ClusterError("cluster.prerequisite_failed", `building the ${m.what} failed (agentenv ${m.command.join(" ")} exited ${code})`, { step: m.command.join(" "), exitCode: code });
  }
}
