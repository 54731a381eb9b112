/**
 * The guest's half of a sandbox start, once its VMM runs: envd answers and is initialised with
 * the sandbox's token, env vars, user, workdir, clock and host name; on a cold boot the template's
 * start command runs and its ready command passes.
 */
import { ENVD_PORT, ENVD_VERSION } from "../envd/version.ts";
import { OrchestratorError } from "../orchestrator/errors.ts";
import type { RuntimeStartSpec } from "../orchestrator/runtime.ts";
import { waitReady } from "../template/index.ts";
import { probeCommand } from "../tools/index.ts";
import type { VmHandle } from "../vmm/index.ts";
import { initEnvd, runInGuest } from "./envd-client.ts";
import { waitEnvdHealthy } from "./envd-health.ts";
import type { BootDefaults, VmState } from "./vm-state.ts";

/** envd's base URL at guest address `host`. */
export function envdUrl(host: string): string {
  return `http://${host}:${ENVD_PORT}`;
}

/** How long the guest's steps took, ms. */
export interface GuestTimings {
  /** Until envd's GET /health answered. */
  healthMs: number;
  /** envd's POST /init. */
  initMs: number;
}

/**
 * Wait for envd at `host` (raced against the VM's exit), init it (token, template's user,
 * workdir and env under the request's, clock, host name, the node's egress CA; every /init also
 * reseeds the guest's generator: envd-client.ts), and give the sandbox's state with the envd
 * version it reports.
 * @param currentToken the token envd holds now (a restored envd keeps its snapshot's), or null
 * @throws OrchestratorError `orchestrator.envd_unready` (the VM exited, or `spec.signal` ended
 *   the wait), `orchestrator.envd_init_failed`
 */
export async function initGuest(
  spec: RuntimeStartSpec,
  vm: VmHandle,
  host: string,
  state: VmState,
  currentToken: string | null,
  boot: BootDefaults,
  o: { envdPollMs: number; defaultUser: string; net?: { caBundle(): string | null } },
): Promise<{ state: VmState; timings: GuestTimings }> {
  const base = envdUrl(host);
  const t0 = performance.now();
  await waitEnvdHealthy(base, o.envdPollMs, spec.signal, vm.exited);
  const t1 = performance.now();
  const user = boot?.user ?? o.defaultUser;
  const version = await initEnvd(
    base,
    {
      // "" clears a token a restored envd still holds from its snapshot
      accessToken: spec.envdAccessToken ?? "",
      envVars: { ...(boot?.envs ?? {}), ...spec.envVars },
      defaultUser: user,
      defaultWorkdir: boot?.workdir ?? `/home/${user}`,
      timestamp: new Date().toISOString(),
      hostname: spec.id,
      // the node's egress CA (network.rules: TLS the node terminates), as E2B sends its own
      caBundle: o.net?.caBundle() ?? undefined,
    },
    currentToken,
    spec.signal,
  );
  const timings = { healthMs: Math.round(t1 - t0), initMs: Math.round(performance.now() - t1) };
  return { state: { ...state, envdVersion: version ?? state.envdVersion ?? ENVD_VERSION }, timings };
}

/** Bounds of a template's ready command at sandbox start, ms. */
export interface ReadySettings {
  readyTimeoutMs: number;
  readyPollMs: number;
  readyProbeTimeoutMs: number;
}

/**
 * Cold-boot half of a template's start command: run it in the background as the template's
 * user and poll its ready command (`readyProbe`) every `readyPollMs` until it exits 0.
 * @param base envd's URL
 * @throws OrchestratorError `orchestrator.template_not_ready` when the start command exits
 *   non-zero or the ready command does not pass within `readyTimeoutMs`.
 */
export async function startTemplateProcess(spec: RuntimeStartSpec, base: string, boot: NonNullable<BootDefaults>, o: ReadySettings): Promise<void> {
  const c = { user: boot.user, cwd: boot.workdir, envs: { ...boot.envs, ...spec.envVars }, accessToken: spec.envdAccessToken };
  let failed: string | null = null;
  // the start command's output stream is watched until the ready check passes, then dropped
  // (envd keeps the process running when its stream ends)
  const watch = new AbortController();
  try {
    if (boot.startCmd) {
      void runInGuest(base, { ...c, cmd: "/bin/sh", args: ["-c", boot.startCmd] }, AbortSignal.any([spec.signal, watch.signal])).then(
        (r) => (failed = r.exitCode !== 0 ? `exited with code ${r.exitCode}: ${r.output.slice(-500)}` : failed),
        () => {},
      );
    }
    if (!boot.readyCmd) return;
    const r = await waitReady({
      readyCmd: boot.readyCmd,
      run: (script, timeoutMs) => runInGuest(base, { ...c, ...probeCommand(script) }, AbortSignal.any([spec.signal, AbortSignal.timeout(timeoutMs)])),
      startFailure: () => failed,
      timeoutMs: o.readyTimeoutMs,
      pollMs: o.readyPollMs,
      probeTimeoutMs: o.readyProbeTimeoutMs,
      signal: spec.signal,
    });
    if (r.startFailure) throw new OrchestratorError("orchestrator.template_not_ready", `template start command ${r.startFailure}`, { sandboxId: spec.id });
    if (!r.ok) throw new OrchestratorError("orchestrator.template_not_ready", `template ready command did not pass within ${o.readyTimeoutMs} ms: ${boot.readyCmd}`, { sandboxId: spec.id });
  } finally {
    watch.abort();
  }
}
