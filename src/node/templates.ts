/**
 * Wiring of template builds (composition root): the catalog the VM runtime owns, uploaded files,
 * the builder (build VMs from the VM runtime, booted through the tools drive; base images pulled
 * by src/image) and the service the API calls, from `[template_build]`.
 */
import { join } from "node:path";
import type { Config } from "../config/index.ts";
import { pullImage, reapPullLeftovers } from "../image/index.ts";
import type { SandboxRuntime } from "../orchestrator/index.ts";
import { VmRuntime } from "../sandbox/index.ts";
import { TOOLS_MOUNT } from "../tools/index.ts";
import { BASE_BOOT_ARGS, BuildFiles, TemplateBuilder, TemplateCatalog, TemplateError, TemplateService, type BuildVmLauncher } from "../template/index.ts";

/** The template service of a node whose runtime is `runtime` (builds need the VM runtime). */
export function createTemplateService(cfg: Config, runtime: SandboxRuntime): TemplateService {
  const home = cfg.home_path;
  const k = cfg.template_build;
  const vmRuntime = runtime instanceof VmRuntime ? runtime : null;
  const catalog = vmRuntime?.catalog ?? new TemplateCatalog(home);
  const vms: BuildVmLauncher = vmRuntime
    ? vmRuntime.buildVmLauncher(k.vm_boot_timeout_ms)
    : {
        boot: () => {
          throw new TemplateError("template.build_failed", `runtime ${runtime.name} cannot boot build VMs`);
        },
      };
  reapPullLeftovers(home);
  const files = new BuildFiles(catalog.dir);
  const builder = new TemplateBuilder({
    homePath: home,
    catalog,
    files,
    vms,
    settings: { stepTimeoutMs: k.step_timeout_ms, readyTimeoutMs: k.ready_timeout_ms, readyPollMs: k.ready_poll_ms, bootArgs: BASE_BOOT_ARGS },
    async pullBase(ref, credentials, progress, signal) {
      const img = await pullImage({
        homePath: home,
        ref,
        credentials,
        insecureRegistries: k.insecure_registries,
        headroomMiB: k.image_headroom_mib,
        minDiskMiB: k.image_min_disk_mib,
        toolTimeoutMs: k.tool_timeout_ms,
        onProgress: progress,
        signal,
      });
      // the tools drive's programs last on PATH, for images without them (steps and sandboxes see it)
      const path = `${img.config.env.PATH ?? "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}:${TOOLS_MOUNT}/bin`;
      return { digest: img.digest, layerPath: img.layerPath, diskBytes: img.diskBytes, env: { ...img.config.env, PATH: path }, workdir: img.config.workdir };
    },
  });
  return new TemplateService(catalog, files, builder, {
    uploadTtlSecs: k.upload_url_ttl_secs,
    maxUploadBytes: k.max_upload_bytes,
    defaultBase: k.default_base,
    defaultCpuCount: k.default_cpu_count,
    defaultMemoryMB: k.default_memory_mb,
    maxConcurrentBuilds: k.max_concurrent_builds,
  });
}

/** Where the template catalog of `home` lives (for tools that read it). */
export const catalogDir = (home: string) => join(home, "catalog");
