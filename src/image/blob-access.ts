/**
 * The `[image]` settings applied to overlaybd's lazy registry reads (remote lowers of a
 * config.v1.json, src/storage/overlaybd/remote.ts): a blob URL `<scheme>://<registry>/v2/<repo>/blobs/<digest>`
 * is tried on the registry's mirrors first (a blob is content-addressed: any mirror's copy is the
 * same bytes), then on the registry itself unless it is mirror-only; each through the node's
 * proxy, trusting the extra CAs.
 */
import { readFileSync } from "node:fs";
import type { RemoteAccess } from "../storage/overlaybd/index.ts";
import { proxyFor } from "../util/proxy.ts";
import { canonicalRegistry } from "./reference.ts";
import { caFiles, endpointsFor, type RegistrySettings } from "./settings.ts";

const BLOB_PATH = /^\/v2\/(.+)\/blobs\/(sha256:[0-9a-f]{64})$/;

/** The URLs a registry blob is read from, in order (`url` alone when it is not a registry blob URL). */
export function blobCandidates(url: string, s: RegistrySettings): string[] {
  const u = new URL(url);
  const m = BLOB_PATH.exec(u.pathname);
  if (!m) return [url];
  const [, repository, digest] = m as unknown as [string, string, string];
  return endpointsFor({ registry: canonicalRegistry(u.host), repository, tag: "latest" }, s).map((e) =>
    e.mirror ? `${e.insecure ? "http" : "https"}://${e.host}/v2/${e.repository}/blobs/${digest}` : url,
  );
}

/**
 * The overlaybd remote access of `s`.
 * @throws ImageError `image.bad_config` when `ca_path` holds no certificate
 */
export function registryAccess(s: RegistrySettings): RemoteAccess {
  const ca = s.caPath ? caFiles(s.caPath).map((f) => readFileSync(f, "utf8")) : [];
  return { candidates: (url) => blobCandidates(url, s), proxyFor: (url) => proxyFor(url, s.proxy) ?? false, ca };
}
