/**
 * How the node reaches registries (`[image]`, meaning of every key in src/config/schema.ts):
 * mirrors per registry, mirror-only registries, plain-HTTP registries, extra CAs, the
 * credentials file and the proxy; and the ordered endpoints one image reference is pulled from.
 *
 * Mirrors follow Docker's `registry-mirrors` and containers-registries.conf(5) `[[registry.mirror]]`:
 * a mirror serves the same repository paths as the registry (Docker Hub's one-part names as
 * `library/<name>`), optionally under a path prefix (`harbor.example/dockerhub-proxy`, a Harbor
 * proxy-cache project); mirrors are tried in order, then the registry itself unless it is
 * mirror-only.
 */
import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import type { Config } from "../config/index.ts";
import { errorMessage } from "../util/error.ts";
import { proxySettings, type ProxySettings } from "../util/proxy.ts";
import { ImageError } from "./errors.ts";
import { canonicalRegistry, isLoopbackRegistry, type ImageRef } from "./reference.ts";

/** The `[image]` settings, checked and normalised (registry keys canonical: docker.io for its aliases). */
export interface RegistrySettings {
  /** Registry host[:port] -> mirror endpoints (host[:port][/prefix]), in order. */
  mirrors: Record<string, string[]>;
  /** Registries never reached themselves. */
  mirrorOnly: string[];
  /** Hosts (registries and mirrors) reached over plain HTTP / unverified TLS, besides loopback. */
  insecure: string[];
  /** PEM file or directory of extra CAs; "" = the system's only. */
  caPath: string;
  /** Docker config.json of credentials; "" = none. */
  authFile: string;
  /** The proxy of registry requests. */
  proxy: ProxySettings;
}

/** One place an image is pulled from. */
export interface Endpoint {
  /** host[:port] skopeo connects to. */
  host: string;
  /** Repository path on that host (the mirror's prefix included). */
  repository: string;
  /** A mirror of `registry` (false: the registry itself). */
  mirror: boolean;
  /** Plain HTTP allowed / TLS not verified (loopback or listed insecure). */
  insecure: boolean;
  /** How logs name it: `mirror 127.0.0.1:5000` or `registry docker.io`. */
  label: string;
}

const HOST_RE = /^[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$/;
const PREFIX_RE = /^[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:\/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*$/;

/** A mirror endpoint `host[:port][/prefix]` split, or null when it is not one (a scheme is refused: plain HTTP is chosen by insecure_registries). */
export function parseMirror(m: string): { host: string; prefix: string } | null {
  const slash = m.indexOf("/");
  const host = slash < 0 ? m : m.slice(0, slash);
  const prefix = slash < 0 ? "" : m.slice(slash + 1).replace(/\/+$/, "");
  if (!HOST_RE.test(host) || (prefix && !PREFIX_RE.test(prefix))) return null;
  return { host: host.toLowerCase(), prefix };
}

/**
 * The `[image]` settings of `cfg`, checked.
 * @param warn told once about the deprecated `[template_build] insecure_registries` when set
 * @param proxy the node's proxy (default: from `[image] proxy` / `no_proxy` and the environment)
 * @throws ImageError `image.bad_config`: a mirror endpoint that is not host[:port][/prefix], a
 *   mirror-only registry without mirrors, a `ca_path` or `auth_file` that is not there, a bad proxy URL
 */
export function registrySettings(cfg: Config, warn: (msg: string) => void = () => {}, proxy?: ProxySettings): RegistrySettings {
  const img = cfg.image;
  const bad = (key: string, msg: string, details: Record<string, unknown> = {}): never => {
    throw new ImageError("image.bad_config", `[image] ${key}: ${msg}`, { key: `image.${key}`, ...details });
  };
  const mirrors: Record<string, string[]> = {};
  for (const [reg, list] of Object.entries(img.registry_mirrors)) {
    const key = canonicalRegistry(reg.toLowerCase());
    for (const m of list) if (!parseMirror(m)) bad("registry_mirrors", `${JSON.stringify(reg)}: mirror ${JSON.stringify(m)} is not host[:port][/path prefix]`, { value: m });
    mirrors[key] = [...(mirrors[key] ?? []), ...list];
  }
  const mirrorOnly = img.mirror_only.map((r) => canonicalRegistry(r.toLowerCase()));
  for (const r of mirrorOnly) if (!mirrors[r]?.length) bad("mirror_only", `${JSON.stringify(r)} has no mirrors in [image.registry_mirrors]: its images could never be pulled`, { value: r });
  const legacy = cfg.template_build.insecure_registries;
  if (legacy.length > 0) warn("[template_build] insecure_registries is deprecated: read as [image] insecure_registries (move it there)");
  const insecure = [...new Set([...img.insecure_registries, ...legacy].map((h) => canonicalRegistry(h.toLowerCase())))];
  if (img.ca_path && !existsSync(img.ca_path)) bad("ca_path", `${img.ca_path} does not exist`, { path: img.ca_path });
  if (img.auth_file && !existsSync(img.auth_file)) bad("auth_file", `${img.auth_file} does not exist`, { path: img.auth_file });
  let p = proxy;
  if (!p) {
    try {
      p = proxySettings({ proxy: img.proxy, noProxy: img.no_proxy });
    } catch (e) {
      bad("proxy", errorMessage(e));
    }
  }
  return { mirrors, mirrorOnly, insecure, caPath: img.ca_path, authFile: img.auth_file, proxy: p! };
}

/** Settings with no mirrors, no extra trust or credentials, no proxy (tests, tools). */
export function plainRegistrySettings(over: Partial<RegistrySettings> = {}): RegistrySettings {
  return { mirrors: {}, mirrorOnly: [], insecure: [], caPath: "", authFile: "", proxy: { httpsProxy: "", httpProxy: "", noProxy: [] }, ...over };
}

/** Whether `host` is reached over plain HTTP / without TLS verification. */
export function isInsecureHost(host: string, s: Pick<RegistrySettings, "insecure">): boolean {
  return isLoopbackRegistry(host) || s.insecure.includes(host.toLowerCase());
}

/**
 * Where `r` is pulled from, in order: its registry's mirrors, then the registry itself unless
 * it is mirror-only.
 */
export function endpointsFor(r: ImageRef, s: RegistrySettings): Endpoint[] {
  const out: Endpoint[] = [];
  for (const m of s.mirrors[r.registry] ?? []) {
    const { host, prefix } = parseMirror(m)!;
    out.push({ host, repository: prefix ? `${prefix}/${r.repository}` : r.repository, mirror: true, insecure: isInsecureHost(host, s), label: `mirror ${m}` });
  }
  if (!s.mirrorOnly.includes(r.registry)) out.push({ host: r.registry, repository: r.repository, mirror: false, insecure: isInsecureHost(r.registry, s), label: `registry ${r.registry}` });
  return out;
}

/**
 * The CA certificates of `caPath` (a PEM file, or the *.crt / *.pem files of a directory), as
 * file paths.
 * @throws ImageError `image.bad_config` when it holds none
 */
export function caFiles(caPath: string): string[] {
  const files = statSync(caPath).isDirectory()
    ? readdirSync(caPath).filter((f) => /\.(crt|pem)$/.test(f)).sort().map((f) => join(caPath, f))
    : [caPath];
  if (files.length === 0) throw new ImageError("image.bad_config", `[image] ca_path: ${caPath} holds no *.crt or *.pem file`, { key: "image.ca_path", path: caPath });
  return files;
}
