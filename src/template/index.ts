/**
 * Template subsystem: the local template store of `build-base` templates (`resolveTemplate`,
 * `listTemplates`), the versioned catalog of API-built templates (`TemplateCatalog`: ids,
 * names, builds, tags, logs), uploaded build files (`BuildFiles`), the build runner
 * (`TemplateBuilder`, steps in a build VM behind the `BuildVmLauncher` port) and the service the
 * API calls (`TemplateService`). The orchestrator boots a sandbox from `resolveTemplate(home,
 * name)` or a catalog build's `BootSpec` (overlaybd layers, lowest first; process defaults).
 */
export { TemplateError } from "./errors.ts";
export {
  TEMPLATE_NAME,
  listTemplates,
  readManifest,
  resolveTemplate,
  templateDir,
  writeManifest,
  type ResolvedTemplate,
  type TemplateManifest,
} from "./store.ts";
export { BASE_BOOT_ARGS, buildBase, hostDebianMirror, trimLoginProfiles, type BaseBuildOptions, type BaseBuildResult } from "./base.ts";
export {
  ALIAS_RE,
  DEFAULT_TAG,
  latestReadyBuild,
  parseName,
  shownBuild,
  TAG_RE,
  TemplateCatalog,
  type BootSpec,
  type BuildLogEntry,
  type BuildReason,
  type BuildRecord,
  type BuildStatus,
  type LogLevel,
  type TemplateRecord,
} from "./catalog.ts";
export { BuildFiles, UPLOAD_PATH_RE } from "./files.ts";
export { checkBuildSpec, dockerfileBase, stepKey, baseKey, SUPPORTED_STEPS, IGNORED_STEPS, type BuildSpec, type BuildStep } from "./spec.ts";
export { readyProbe, waitReady, type ReadyOutcome } from "./ready.ts";
export { BuildLogs } from "./build-log.ts";
export { copyScript, expandEnv, extractScript, StepFailure, TemplateBuilder, type BaseImage, type BuildSettings, type BuilderDeps, type StepContext } from "./builder.ts";
export type { BuildVm, BuildVmLauncher, BuildVmSpec, VmCommand } from "./build-vm.ts";
export { TemplateService, type NewBuildRequest, type TemplateServiceOptions } from "./service.ts";
export { collectGarbage, type GcOptions, type GcReport } from "./gc.ts";
