/**
 * Schemas of the registry documents the image puller reads (OCI image spec / Docker distribution:
 * a manifest list or index, an image manifest, an image config) and of its own cache records.
 * They come from a registry through skopeo, or from a file an earlier node wrote: checked when
 * read, never cast. A digest must be `sha256:` and 64 hex digits, since it names a file.
 */
import { type Static, type TSchema, Type as T } from "@sinclair/typebox";
import { describeProblem, jsonSchema, type JsonSchema } from "../util/json-check.ts";
import { ImageError } from "./errors.ts";

const DIGEST = T.String({ pattern: "^sha256:[0-9a-f]{64}$" });
const SIZE = T.Integer({ minimum: 0 });
const STRINGS_OR_NULL = T.Optional(T.Union([T.Null(), T.Array(T.String())]));

/** A manifest list / image index, or an image manifest (what `skopeo inspect --raw` prints). */
export const MANIFEST_OR_LIST = jsonSchema(
  T.Object({
    manifests: T.Optional(T.Array(T.Object({ digest: DIGEST, platform: T.Optional(T.Object({ os: T.Optional(T.String()), architecture: T.Optional(T.String()) })) }))),
    layers: T.Optional(T.Array(T.Object({ size: T.Optional(SIZE) }))),
  }),
);

/** The image manifest of skopeo's `dir:` copy. */
export const DIR_MANIFEST = jsonSchema(
  T.Object({
    config: T.Object({ digest: DIGEST, size: SIZE }),
    layers: T.Array(T.Object({ digest: DIGEST, size: SIZE, mediaType: T.String() })),
  }),
);

/** The image config blob: what a sandbox of the image runs with. */
export const IMAGE_CONFIG = jsonSchema(
  T.Object({
    config: T.Optional(
      T.Union([
        T.Null(),
        T.Object({ Env: STRINGS_OR_NULL, WorkingDir: T.Optional(T.String()), User: T.Optional(T.String()), Entrypoint: STRINGS_OR_NULL, Cmd: STRINGS_OR_NULL }),
      ]),
    ),
  }),
);

/** A pulled image's cache record (`$home/images/<key>.json`). */
export const CACHE_ENTRY = jsonSchema(
  T.Object({
    /** File name of the layer in the cache directory (`<key>.layer`, or a fresh name when that existed). */
    layer: T.Optional(T.String({ pattern: "^[^/]+$" })),
    ref: T.String(),
    digest: T.String(),
    diskBytes: SIZE,
    config: T.Object({ env: T.Record(T.String(), T.String()), workdir: T.String(), user: T.String(), cmd: T.Array(T.String()) }),
    compressedBytes: SIZE,
  }),
);
export type CacheEntry = Static<typeof CACHE_ENTRY.schema>;

/** The part of a cache record garbage collection reads: the layer it names (absent: `<key>.layer`). */
export const CACHE_ENTRY_LAYER = jsonSchema(T.Object({ layer: T.Optional(T.String({ pattern: "^[^/]+$" })) }));

/**
 * `text` (a registry document of image `ref`, `what` it is) checked against `schema`.
 * @throws ImageError `image.bad_manifest` naming the document and the field at fault.
 */
export function registryDocument<S extends TSchema>(schema: JsonSchema<S>, text: string, what: string, ref: string): Static<S> {
  const r = schema.parse(text);
  if (!r.ok) throw new ImageError("image.bad_manifest", `the ${what} of ${ref} is not what the image spec describes: ${describeProblem(r.problem)}`, { ref, what, field: r.problem.path });
  return r.value;
}
