/**
 * Wiring of template builds (composition root): the catalog the VM runtime owns, uploaded files,
 * the builder (build VMs from the VM runtime, booted through the tools drive; base images pulled
 * by src/image) and the service the API calls, from `[template_build]`.
 */
import { join } from "node:path";
import type { Config } from "../config/index.ts";
import { ConfigError } from "../config/index.ts";
import { ImageError, pullImage, reapPullLeftovers, registrySettings, type RegistrySettings } from "../image/index.ts";
import { logger } from "../observability/log.ts";
import type { ProxySettings } from "../util/proxy.ts";

/**
 * The node's `[image]` settings (the deprecated `[template_build] insecure_registries` said in the log).
 * @throws ConfigError `config.bad_value` naming the key, for settings that cannot be used (a bad
 *   mirror, a mirror-only registry without mirrors, a missing ca_path or auth_file, a bad proxy)
 */
export function nodeRegistries(cfg: Config, proxy?: ProxySettings): RegistrySettings {
  const log = logger("image");
  try {
    return registrySettings(cfg, (msg) => log.warn(msg), proxy);
  } catch (e) {
    if (!(e instanceof ImageError)) throw e;
    throw new ConfigError("config.bad_value", `config: ${e.message}`, { key: e.details.key, value: e.details.value ?? e.details.path ?? "", expected: "see config/default.toml" });
  }
}
import { LIVE_STATES, type SandboxRuntime, type SandboxService } from "../orchestrator/index.ts";
import { pinnedTemplateLayers, VmRuntime } from "../sandbox/index.ts";
import { TOOLS_MOUNT } from "../tools/index.ts";
import { BASE_BOOT_ARGS, BuildFiles, BuildLogs, TemplateBuilder, TemplateCatalog, TemplateError, TemplateService, type BuildVmLauncher } from "../template/index.ts";

/**
 * The template service of a node whose runtime is `runtime` (builds need the VM runtime).
 * `pinned` names the layers sandboxes and snapshots stack on (garbage collection keeps them);
 * `registries` are the node's `[image]` settings (default: `nodeRegistries(cfg)`).
 * @throws ConfigError for `[image]` settings that cannot be used (see nodeRegistries)
 */
export function createTemplateService(cfg: Config, runtime: SandboxRuntime, pinned: () => Iterable<string> = () => [], registries: RegistrySettings = nodeRegistries(cfg)): TemplateService {
  const home = cfg.home_path;
  const k = cfg.template_build;
  const vmRuntime = runtime instanceof VmRuntime ? runtime : null;
  // one catalog per home: the runtime's when it has one (a runtime wrapping the VM runtime may expose it)
  const own = (runtime as { catalog?: unknown }).catalog;
  const catalog = vmRuntime?.catalog ?? (own instanceof TemplateCatalog ? own : new TemplateCatalog(home));
  const launcher = vmRuntime?.buildVmLauncher({ bootMs: k.vm_boot_timeout_ms, flushMs: k.vm_flush_timeout_ms });
  // without [template_build] snapshot the builder sees a launcher that commits no snapshots
  const vms: BuildVmLauncher = launcher
    ? k.snapshot
      ? launcher
      : { boot: (spec) => launcher.boot(spec) }
    : {
        boot: () => {
          throw new TemplateError("template.build_failed", `runtime ${runtime.name} cannot boot build VMs`);
        },
      };
  reapPullLeftovers(home);
  const files = new BuildFiles(catalog.dir);
  const logs = new BuildLogs(join(catalog.dir, "logs"), k.log_max_bytes);
  const builder = new TemplateBuilder({
    homePath: home,
    catalog,
    logs,
    files,
    vms,
    settings: {
      stepTimeoutMs: k.step_timeout_ms,
      readyTimeoutMs: k.ready_timeout_ms,
      readyPollMs: k.ready_poll_ms,
      readyProbeTimeoutMs: k.ready_probe_timeout_ms,
      errorOutputChars: k.error_output_chars,
      bootArgs: BASE_BOOT_ARGS,
    },
    async pullBase(ref, credentials, progress, signal) {
      const img = await pullImage({
        homePath: home,
        ref,
        credentials,
        registries,
        headroomMiB: k.image_headroom_mib,
        minDiskMiB: k.image_min_disk_mib,
        toolTimeoutMs: k.tool_timeout_ms,
        manifestTimeoutMs: k.manifest_timeout_ms,
        onProgress: progress,
        signal,
      });
      // the tools drive's programs last on PATH, for images without them (steps and sandboxes see it)
      const path = `${img.config.env.PATH ?? "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}:${TOOLS_MOUNT}/bin`;
      return { key: img.key, digest: img.digest, layerPath: img.layerPath, diskBytes: img.diskBytes, env: { ...img.config.env, PATH: path }, workdir: img.config.workdir };
    },
  });
  return new TemplateService(catalog, logs, files, builder, {
    uploadTtlSecs: k.upload_url_ttl_secs,
    maxUploadBytes: k.max_upload_bytes,
    defaultBase: k.default_base,
    defaultCpuCount: k.default_cpu_count,
    defaultMemoryMB: k.default_memory_mb,
    maxCpuCount: cfg.orchestrator.max_cpu_count,
    maxMemoryMB: cfg.orchestrator.max_memory_mb,
    maxConcurrentBuilds: k.max_concurrent_builds,
    gc: { intervalMs: k.gc_interval_ms, cacheMaxBytes: k.cache_max_bytes, minAgeMs: k.gc_min_age_ms, uploadMaxAgeMs: k.upload_max_age_secs * 1000,
      pinned,
      ...(vms.releaseSnapshot ? { releaseSnapshot: (id: string) => vms.releaseSnapshot!(id) } : {}),
    },
  });
}

/** Where the template catalog of `home` lives (for tools that read it). */
export const catalogDir = (home: string) => join(home, "catalog");

/**
 * Layers live sandboxes stack on: what each recorded at start (`template.rootLayers` of its
 * runtime state, parsed by src/sandbox/vm-state.ts), absolute paths.
 * @throws OrchestratorError `orchestrator.bad_runtime_state` when a live sandbox's state does not
 *   parse: template garbage collection then skips its round (logged) rather than remove layers
 *   that sandbox may stack on
 */
export function sandboxLayers(orch: Pick<SandboxService, "inStates">): string[] {
  return orch.inStates(LIVE_STATES).flatMap((r) => pinnedTemplateLayers(r.id, r.runtimeState));
}
