/**
 * Template subsystem: the local template store (`resolveTemplate`, `listTemplates`) and the base
 * template build (`buildBase`). The orchestrator boots a sandbox from `resolveTemplate(home, name)`:
 * `rootfsPath` (raw ext4, never written) or `rootLayers` (overlaybd layers, lowest first) for the
 * root disk, `bootArgs` for the kernel command line; the kernel itself comes from
 * `resolveKernelPath` in `src/vmm/index.ts`.
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
export { BASE_BOOT_ARGS, buildBase, guestInitScript, hostDebianMirror, type BaseBuildOptions, type BaseBuildResult } from "./base.ts";
