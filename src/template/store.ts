/**
 * Local template store: `$home/templates/<name>/manifest.json` plus the files it names
 * (root filesystem image, overlaybd layers). Plain JSON on disk; no database needed.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync } from "node:fs";
import { isAbsolute, join } from "node:path";
import { TemplateError } from "./errors.ts";
import { writeFileDurable } from "../util/durable.ts";
import { errorMessage } from "../util/error.ts";

/** Template names: lowercase letters, digits, `-`, `_`, `.`; 1–64 chars, no leading dot. */
export const TEMPLATE_NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;

/** What `manifest.json` holds (paths relative to the template directory). */
export interface TemplateManifest {
  name: string;
  /** Raw ext4 image of the root filesystem (read-only base; VMs write to their own upper). */
  rootfs: string;
  /** overlaybd layer files, lowest first; empty until imported. */
  layers: string[];
  /** Kernel command line the template needs (root device, init). */
  bootArgs: string;
  /** Size of the root disk in bytes (the image's apparent size). */
  diskBytes: number;
  /** Build cache key: changes when any input of the build changes. */
  buildKey: string;
  createdAt: string;
  /** vCPUs of sandboxes made from it (a create may override); the node's default when absent. */
  cpuCount?: number;
  /**
   * Committed snapshot of the template booted once (id in the node's snapshot repository): a
   * sandbox is created by restoring it (one of another shape cold-boots). Absent: cold boots.
   */
  snapshot?: string;
  /** Guest memory in MiB of sandboxes made from it (a create may override); the node's default when absent. */
  memoryMB?: number;
}

/** A template resolved to absolute paths, ready for the orchestrator to boot. */
export interface ResolvedTemplate {
  name: string;
  dir: string;
  /** Absolute path of the raw ext4 root image. */
  rootfsPath: string;
  /** Absolute overlaybd layer paths, lowest first (empty when not imported). */
  rootLayers: string[];
  bootArgs: string;
  diskBytes: number;
  buildKey: string;
  /** Snapshot id of the template's committed state, or null (cold boot). */
  snapshot: string | null;
  cpuCount: number | null;
  memoryMB: number | null;
}

/** Directory of template `name` under `homePath`. @throws TemplateError `template.bad_name`. */
export function templateDir(homePath: string, name: string): string {
  if (!TEMPLATE_NAME.test(name)) throw new TemplateError("template.bad_name", `invalid template name ${JSON.stringify(name)}`, { name });
  return join(homePath, "templates", name);
}

/** Read and validate a manifest. @throws TemplateError `template.not_found` / `template.bad_manifest`. */
export function readManifest(homePath: string, name: string): TemplateManifest {
  const path = join(templateDir(homePath, name), "manifest.json");
  if (!existsSync(path)) throw new TemplateError("template.not_found", `template ${name} not found`, { name, path });
  let m: TemplateManifest;
  try {
    m = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new TemplateError("template.bad_manifest", `${path}: ${errorMessage(e)}`, { name, path });
  }
  const ok =
    m && m.name === name && typeof m.rootfs === "string" && !isAbsolute(m.rootfs) && !m.rootfs.includes("..") &&
    Array.isArray(m.layers) && m.layers.every((l) => typeof l === "string" && !isAbsolute(l) && !l.includes("..")) &&
    typeof m.bootArgs === "string" && Number.isInteger(m.diskBytes) && m.diskBytes > 0 && typeof m.buildKey === "string" &&
    (m.snapshot === undefined || (typeof m.snapshot === "string" && /^[a-z0-9]{20}$/.test(m.snapshot))) &&
    (m.cpuCount === undefined || (Number.isInteger(m.cpuCount) && m.cpuCount >= 1)) &&
    (m.memoryMB === undefined || (Number.isInteger(m.memoryMB) && m.memoryMB >= 1));
  if (!ok) throw new TemplateError("template.bad_manifest", `${path}: missing or invalid fields`, { name, path });
  return m;
}

/** Write a manifest atomically and durably (src/util/durable.ts). */
export function writeManifest(homePath: string, m: TemplateManifest): void {
  const dir = templateDir(homePath, m.name);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, "manifest.json");
  writeFileDurable(path, JSON.stringify(m, null, 2) + "\n");
}

/**
 * Resolve a template to absolute paths. @throws TemplateError `template.not_found` (no manifest
 * or its rootfs file is missing) or `template.bad_manifest`.
 */
export function resolveTemplate(homePath: string, name: string): ResolvedTemplate {
  const m = readManifest(homePath, name);
  const dir = templateDir(homePath, name);
  const rootfsPath = join(dir, m.rootfs);
  if (!existsSync(rootfsPath)) throw new TemplateError("template.not_found", `template ${name}: ${rootfsPath} missing`, { name, rootfsPath });
  return {
    name,
    dir,
    rootfsPath,
    rootLayers: m.layers.map((l) => join(dir, l)),
    bootArgs: m.bootArgs,
    diskBytes: m.diskBytes,
    buildKey: m.buildKey,
    snapshot: m.snapshot ?? null,
    cpuCount: m.cpuCount ?? null,
    memoryMB: m.memoryMB ?? null,
  };
}

/** Names of every template with a readable manifest, sorted. */
export function listTemplates(homePath: string): TemplateManifest[] {
  const root = join(homePath, "templates");
  if (!existsSync(root)) return [];
  const out: TemplateManifest[] = [];
  for (const name of readdirSync(root).sort()) {
    if (!TEMPLATE_NAME.test(name)) continue;
    try {
      out.push(readManifest(homePath, name));
    } catch {
      // a half-built or foreign directory is not a template
    }
  }
  return out;
}
