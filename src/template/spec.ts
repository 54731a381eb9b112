/**
 * What a build runs (`POST /v2/templates/{id}/builds/{buildID}` body, E2B's TemplateBuildStartV2)
 * as plain checked data, and the cache keys of its steps. Wire facts (step JSON, ready helpers,
 * E2B's step hashing): ../shared/docs/template-build.md §1, §4.
 */
import { createHash } from "node:crypto";
import { TemplateError } from "./errors.ts";

/** One step as the SDK sends it (`{type, args, filesHash?, force?}`). */
export interface BuildStep {
  /** RUN, COPY, ADD, ENV, ARG, WORKDIR, USER (others end the build in `error`). */
  type: string;
  args: string[];
  filesHash?: string;
  force: boolean;
}

/** Credentials for the base image's registry (`fromImageRegistry` of type `registry`). */
export interface RegistryCredentials {
  username: string;
  password: string;
}

/** A checked build request. Exactly one of `fromImage` / `fromTemplate` is set. */
export interface BuildSpec {
  fromImage?: string;
  fromTemplate?: string;
  /** The request's `from` (a Dockerfile's FROM) when it chose the base by dockerfileBase. */
  from?: string;
  credentials?: RegistryCredentials;
  /** Rebuild every step regardless of the cache. */
  force: boolean;
  steps: BuildStep[];
  startCmd: string;
  readyCmd: string;
}

/** Step types a build runs. ADD = COPY and ARG = ENV, as E2B treats them. */
export const SUPPORTED_STEPS = new Set(["RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER"]);
/** Dockerfile metadata instructions accepted and ignored (they change nothing on disk). */
export const IGNORED_STEPS = new Set(["EXPOSE", "LABEL", "MAINTAINER"]);
const HASH_RE = /^[0-9a-f]{64}$/;

function bad(message: string, details: Record<string, unknown> = {}): never {
  throw new TemplateError("template.bad_request", message, details);
}

/**
 * The base a Dockerfile's `FROM <ref>` names on this node, the one rule for every client that
 * sends a Dockerfile's FROM as the build's `from` (`agentenv template build --dockerfile`, the
 * console's build form): a template this node knows (`isTemplate`: its id or alias, either with
 * `:tag`) is built on; anything else is an image reference. A name that is both (a template
 * `ubuntu` here, the image `ubuntu` on Docker Hub) is the template; a reference holding `/` or `@`
 * (`docker.io/library/ubuntu`, `127.0.0.1:5000/app`) is always an image, since no template name
 * holds either. (E2B's CLI always reads FROM as an image; the SDK's `fromImage` / `fromTemplate`
 * say which they mean and are not resolved.)
 */
export function dockerfileBase(ref: string, isTemplate: (ref: string) => boolean): { fromTemplate: string } | { fromImage: string } {
  if (/[/@]/.test(ref) || !isTemplate(ref)) return { fromImage: ref };
  return { fromTemplate: ref };
}

/**
 * Check a build start body. Unknown keys are ignored (later SDKs add some). Step *types* are not
 * checked here: an unsupported one fails the build naming the step (so the SDK shows it).
 * `defaultTemplate` replaces E2B's `e2bdev/base` (what the SDK sends without any `from*`). `from`
 * (this node's addition: a Dockerfile's FROM) is resolved by dockerfileBase with `isTemplate`.
 * @throws TemplateError `template.bad_request` naming the field.
 */
export function checkBuildSpec(body: Record<string, unknown>, defaultTemplate: string, isTemplate: (ref: string) => boolean = () => false): BuildSpec {
  const str = (k: string): string | undefined => {
    const v = body[k];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "string") bad(`${k} must be a string`, { field: k });
    return v;
  };
  let fromImage = str("fromImage");
  let fromTemplate = str("fromTemplate");
  if (fromImage && fromTemplate) bad("give either fromImage or fromTemplate, not both", { field: "fromTemplate" });
  const from = str("from");
  if (from !== undefined) {
    if (fromImage || fromTemplate) bad("give from (a Dockerfile's FROM) or fromImage / fromTemplate, not both", { field: "from" });
    if (!from.trim()) bad("from must name a template or an image", { field: "from" });
    ({ fromImage, fromTemplate } = { fromImage: undefined, fromTemplate: undefined, ...dockerfileBase(from, isTemplate) });
  } else if ((!fromImage && !fromTemplate) || fromImage === "e2bdev/base") {
    // the SDK's default base: the node's default template
    fromImage = undefined;
    fromTemplate = defaultTemplate;
  }
  let credentials: RegistryCredentials | undefined;
  const reg = body.fromImageRegistry as Record<string, unknown> | undefined | null;
  if (reg !== undefined && reg !== null) {
    if (typeof reg !== "object" || Array.isArray(reg)) bad("fromImageRegistry must be an object", { field: "fromImageRegistry" });
    if (reg.type === "gcp") {
      // fromGCPRegistry: a service account key, which Google's registries take as the password
      // of the user `_json_key` (Artifact Registry / GCR "JSON key file" authentication)
      const key = reg.serviceAccountJson;
      let parsed: unknown = null;
      try {
        parsed = typeof key === "string" ? JSON.parse(key) : null;
      } catch {
        // reported below without quoting the key
      }
      if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) bad("fromImageRegistry of type gcp needs serviceAccountJson, a service account key (JSON object)", { field: "fromImageRegistry.serviceAccountJson" });
      credentials = { username: "_json_key", password: key as string };
    } else {
      if (reg.type !== "registry") bad(`fromImageRegistry type ${JSON.stringify(reg.type)} is not supported ("registry": username + password; "gcp": serviceAccountJson)`, { field: "fromImageRegistry.type" });
      if (typeof reg.username !== "string" || typeof reg.password !== "string") bad("fromImageRegistry needs username and password strings", { field: "fromImageRegistry" });
      credentials = { username: reg.username, password: reg.password };
    }
  }
  const rawSteps = body.steps ?? [];
  if (!Array.isArray(rawSteps)) bad("steps must be an array", { field: "steps" });
  const steps = rawSteps.map((s, i): BuildStep => {
    const where = `steps[${i}]`;
    if (typeof s !== "object" || s === null) bad(`${where} must be an object`, { field: where });
    const o = s as Record<string, unknown>;
    if (typeof o.type !== "string" || o.type.length === 0) bad(`${where}.type must be a non-empty string`, { field: `${where}.type` });
    const args = o.args ?? [];
    if (!Array.isArray(args) || args.some((a) => typeof a !== "string")) bad(`${where}.args must be an array of strings`, { field: `${where}.args` });
    if (o.filesHash !== undefined && o.filesHash !== null && (typeof o.filesHash !== "string" || !HASH_RE.test(o.filesHash))) {
      bad(`${where}.filesHash must be 64 lowercase hex digits`, { field: `${where}.filesHash` });
    }
    if (o.force !== undefined && o.force !== null && typeof o.force !== "boolean") bad(`${where}.force must be a boolean`, { field: `${where}.force` });
    return { type: o.type.toUpperCase(), args: args as string[], ...(typeof o.filesHash === "string" ? { filesHash: o.filesHash } : {}), force: o.force === true };
  });
  if (body.force !== undefined && body.force !== null && typeof body.force !== "boolean") bad("force must be a boolean", { field: "force" });
  return { fromImage, fromTemplate, ...(from !== undefined ? { from } : {}), credentials, force: body.force === true, steps, startCmd: str("startCmd") ?? "", readyCmd: str("readyCmd") ?? "" };
}

/** sha256 hex over parts separated by NUL. */
export function hashParts(...parts: string[]): string {
  const h = createHash("sha256");
  for (const p of parts) h.update(p).update("\0");
  return h.digest("hex");
}

/**
 * Cache key of the base (before any step): the pulled image's key (its manifest digest and how
 * the node converted it, src/image GUEST_BITS_KEY) or the parent build.
 */
export function baseKey(base: { image: string } | { templateBuildID: string }): string {
  return "image" in base ? hashParts("aenv-template-v2", "image", base.image) : hashParts("aenv-template-v2", "template", base.templateBuildID);
}

/**
 * Cache key of a step: the previous key, the step's type, args (as a JSON array: `["a b"]` and
 * `["a", "b"]` differ) and files hash (E2B's chaining).
 */
export function stepKey(prev: string, step: BuildStep): string {
  return hashParts(prev, step.type, JSON.stringify(step.args), step.filesHash ?? "");
}
