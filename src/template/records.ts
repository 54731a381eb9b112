/**
 * Schemas of what the template subsystem keeps on disk as JSON and reads back (a file another
 * process wrote, an earlier node, or damaged): the catalog's template records (./catalog.ts),
 * the step and finalize cache entries (./builder.ts, ./gc.ts). A file is checked when it is
 * read, never cast; the types it is read into stay in the modules that own them (assigning a
 * checked value to them is the compile-time check that the two agree).
 */
import { Type as T } from "@sinclair/typebox";
import { jsonSchema } from "../util/json-check.ts";

const STRINGS = T.Record(T.String(), T.String());
const MS = T.Number();

/** catalog.ts `BootSpec`. */
const BOOT_SPEC = T.Object({
  layers: T.Array(T.String()),
  bootArgs: T.String(),
  diskBytes: T.Integer({ minimum: 1 }),
  envs: STRINGS,
  workdir: T.String(),
  user: T.String(),
  startCmd: T.String(),
  readyCmd: T.String(),
  snapshot: T.Optional(T.String()),
});

/** catalog.ts `BuildRecord`. */
const BUILD_RECORD = T.Object({
  buildID: T.String(),
  status: T.Union([T.Literal("waiting"), T.Literal("building"), T.Literal("ready"), T.Literal("error")]),
  reason: T.Optional(T.Object({ message: T.String(), step: T.Optional(T.String()), code: T.Optional(T.String()) })),
  cpuCount: T.Integer({ minimum: 0 }),
  memoryMB: T.Integer({ minimum: 0 }),
  diskSizeMB: T.Integer({ minimum: 0 }),
  createdAt: MS,
  updatedAt: MS,
  finishedAt: T.Optional(MS),
  acceptedAt: T.Optional(MS),
  tags: T.Optional(T.Array(T.String())),
  boot: T.Optional(BOOT_SPEC),
});

/** A catalog file (`$home/catalog/templates/<templateID>.json`): catalog.ts `TemplateRecord`. */
export const TEMPLATE_RECORD = jsonSchema(
  T.Object({
    templateID: T.String({ pattern: "^[a-z0-9]{1,64}$" }),
    aliases: T.Array(T.String()),
    public: T.Boolean(),
    createdAt: MS,
    updatedAt: MS,
    builds: T.Array(BUILD_RECORD),
    tags: T.Record(T.String(), T.Object({ buildID: T.String(), createdAt: MS })),
    legacy: T.Optional(T.Boolean()),
  }),
);

/** A step cache entry (`$home/catalog/steps/<key>.json`): builder.ts `StepEntry`. */
export const STEP_ENTRY = jsonSchema(
  T.Object({
    layers: T.Array(T.String()),
    context: T.Object({ envs: STRINGS, workdir: T.String(), user: T.String() }),
    diskBytes: T.Integer({ minimum: 1 }),
  }),
);

/** The part of a step cache entry garbage collection reads: its layers (absent: none). */
export const STEP_LAYERS = jsonSchema(T.Object({ layers: T.Optional(T.Array(T.String())) }));

/** A cached finalize: builder.ts `FinalEntry`. */
export const FINAL_ENTRY = jsonSchema(T.Object({ ready: T.Literal(true), at: T.String(), snapshot: T.Optional(T.String()) }));
