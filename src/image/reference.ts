/**
 * Image references (`[registry/]repository[:tag][@digest]`) as Docker reads them: a first part
 * holding `.` or `:` or equal to `localhost` names the registry, else `docker.io` (with
 * `library/` for one-part names; its aliases index.docker.io and registry-1.docker.io read as
 * docker.io); the tag defaults to `latest`. Loopback registries are reached
 * over plain HTTP as Docker does for 127.0.0.0/8 (../shared/docs/template-build.md §6).
 */
import { ImageError } from "./errors.ts";

/** A parsed image reference. */
export interface ImageRef {
  /** Registry host[:port], e.g. `127.0.0.1:5000`, `docker.io`. */
  registry: string;
  /** Repository path, e.g. `library/debian`. */
  repository: string;
  tag: string;
  /** `sha256:<hex>` when the reference pins one. */
  digest?: string;
}

const REPO_RE = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/;
const TAG_RE = /^[\w][\w.-]{0,127}$/;
const DIGEST_RE = /^sha256:[0-9a-f]{64}$/;

/** Parse `ref`. @throws ImageError `image.bad_reference`. */
export function parseImageRef(ref: string): ImageRef {
  const bad = (why: string): never => {
    throw new ImageError("image.bad_reference", `invalid image reference ${JSON.stringify(ref)}: ${why}`, { ref });
  };
  let rest = ref.trim();
  if (!rest) bad("empty");
  let digest: string | undefined;
  const at = rest.indexOf("@");
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST_RE.test(digest)) bad("digest must be sha256:<64 hex>");
  }
  const slash = rest.indexOf("/");
  let registry = "docker.io";
  if (slash > 0) {
    const first = rest.slice(0, slash);
    if (first.includes(".") || first.includes(":") || first === "localhost") {
      registry = first;
      rest = rest.slice(slash + 1);
    }
  }
  let tag = "latest";
  const colon = rest.lastIndexOf(":");
  if (colon > rest.lastIndexOf("/")) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG_RE.test(tag)) bad(`tag ${JSON.stringify(tag)}`);
  }
  registry = canonicalRegistry(registry);
  if (registry === "docker.io" && !rest.includes("/")) rest = `library/${rest}`;
  if (!REPO_RE.test(rest)) bad(`repository ${JSON.stringify(rest)}`);
  return { registry, repository: rest, tag, ...(digest ? { digest } : {}) };
}

/** `registry/repository:tag` or `registry/repository@digest` (when pinned). */
export function formatImageRef(r: ImageRef): string {
  return `${r.registry}/${r.repository}${r.digest ? `@${r.digest}` : `:${r.tag}`}`;
}

/** Whether `registry` (host[:port]) is a loopback address: localhost, 127.0.0.0/8, ::1. */
export function isLoopbackRegistry(registry: string): boolean {
  const host = registry.startsWith("[") ? registry.slice(1, registry.indexOf("]")) : registry.replace(/:\d+$/, "");
  return host === "localhost" || host === "::1" || /^127(?:\.\d{1,3}){3}$/.test(host);
}

/** Docker Hub's other names, read as `docker.io` (Docker's own normalisation). */
export const DOCKER_HUB_ALIASES = ["index.docker.io", "registry-1.docker.io"];

/** `registry` (host[:port]) in its canonical form: Docker Hub's aliases as `docker.io`, the rest as given. */
export function canonicalRegistry(registry: string): string {
  return DOCKER_HUB_ALIASES.includes(registry.toLowerCase()) ? "docker.io" : registry;
}
