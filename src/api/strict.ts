/**
 * Strict request bodies. The E2B SDKs have no capability handshake: a field this node does not
 * know would be dropped silently, and the client would believe it got what it asked for. So every
 * body the API accepts is checked against its route's schema and a field the schema does not name
 * is refused with 400 `api.unknown_field` naming it (`[api] strict_bodies = true`, the default).
 * With `strict_bodies = false` (clients newer than the node) the field is ignored and logged,
 * once per route and field.
 *
 * A route makes its body strict with one spread in its options:
 *
 *   .post("/volumes", handler, { ...strictBody(policy, NewVolume), detail: {...} })
 *
 * The walk follows the schema as JSON Schema: an object with `properties` names its fields (its
 * `additionalProperties` is ignored: the routes keep it `true` so validation never drops what this
 * check must see); an object with `patternProperties` (a `t.Record`: metadata, env vars) or a
 * schema as `additionalProperties` takes any key and checks the values; `anyOf` picks the member
 * of the value's JSON type; arrays check each item; `t.Any()` takes anything.
 */
import type { TSchema } from "elysia";
import { OptionalKind } from "@sinclair/typebox";
import type { Logger } from "pino";
import { errorMessage } from "../util/error.ts";
import { malformedJsonMessage, notJsonReason } from "../util/json-body.ts";
import { ApiError } from "./errors.ts";

type Schema = TSchema & {
  type?: string | string[];
  properties?: Record<string, Schema>;
  patternProperties?: Record<string, Schema>;
  additionalProperties?: boolean | Schema;
  anyOf?: Schema[];
  items?: Schema;
};

function jsonType(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  return typeof v === "number" ? "number" : typeof v;
}

function typeOf(s: Schema): string[] {
  if (s.type !== undefined) return Array.isArray(s.type) ? s.type : [s.type];
  if (s.properties || s.patternProperties) return ["object"];
  return [];
}

/**
 * The dotted paths (`network.foo`, `steps[2].bar`) of the fields in `value` that `schema` does not
 * name, in body order. Values the schema does not describe as objects or arrays are not entered.
 */
export function unknownFields(value: unknown, schema: Schema, path = ""): string[] {
  if (schema.anyOf) {
    const t = jsonType(value);
    const member = schema.anyOf.find((m) => typeOf(m).some((x) => x === t || (x === "integer" && t === "number")));
    return member ? unknownFields(value, member, path) : [];
  }
  if (Array.isArray(value)) {
    if (!schema.items) return [];
    return value.flatMap((v, i) => unknownFields(v, schema.items!, `${path}[${i}]`));
  }
  if (typeof value !== "object" || value === null) return [];
  const out: string[] = [];
  const free = schema.patternProperties ? Object.values(schema.patternProperties)[0] : typeof schema.additionalProperties === "object" ? schema.additionalProperties : undefined;
  for (const [k, v] of Object.entries(value)) {
    const at = path ? `${path}.${k}` : k;
    const known = schema.properties?.[k];
    if (known) out.push(...unknownFields(v, known, at));
    else if (free) out.push(...unknownFields(v, free, at));
    else if (schema.properties) out.push(at);
  }
  return out;
}

/** What the API does with a body field its route's schema does not name (`[api] strict_bodies`). */
export class BodyPolicy {
  /** `METHOD route field` lines already logged (lenient mode logs each once). */
  private readonly logged = new Set<string>();

  /**
   * @param strict refuse unknown fields (true) or ignore and log them (false)
   * @param maxLogged bound on the remembered route/field pairs; beyond it, nothing more is logged
   */
  constructor(
    readonly strict: boolean,
    private readonly log: Logger,
    private readonly maxLogged = 10_000,
  ) {}

  /**
   * Check `body` of `route` (e.g. `POST /v2/sandboxes`) against `schema`.
   * @throws ApiError `api.unknown_field` (400) naming the first unknown field, when strict.
   */
  check(route: string, body: unknown, schema: TSchema): void {
    const unknown = unknownFields(body, schema as Schema);
    if (unknown.length === 0) return;
    if (this.strict) {
      const field = unknown[0]!;
      throw new ApiError(
        "api.unknown_field",
        `unknown field "${field}" in the body of ${route}: this node does not implement it (a node with [api] strict_bodies = false ignores unknown fields)`,
        { field, route, unknown },
      );
    }
    for (const field of unknown) {
      const key = `${route} ${field}`;
      if (this.logged.has(key) || this.logged.size >= this.maxLogged) continue;
      this.logged.add(key);
      this.log.warn({ route, field }, `ignored unknown field "${field}" in the body of ${route} ([api] strict_bodies = false)`);
    }
  }
}

/**
 * The body of a JSON route, read by the route itself instead of Elysia's parsers (which pick one
 * by content type: a `text/plain` body reached validation as a string, "Expected object", or was
 * dropped on routes whose body is optional, and malformed JSON answered "Bad Request"). An empty
 * body is `undefined` where the body is optional (`t.Optional`).
 * @throws ApiError `api.not_json` (a body without a JSON content type), `api.parse` (malformed
 *   JSON), `api.validation` (no body where one is required).
 */
export async function readJsonBody(request: Request, optional: boolean): Promise<unknown> {
  const text = await request.text();
  const contentType = request.headers.get("content-type");
  if (text.trim() === "") {
    if (optional) return undefined;
    throw new ApiError("api.validation", "this route takes a JSON body (content-type: application/json); the request has none", { contentType });
  }
  const notJson = notJsonReason(contentType);
  if (notJson) throw new ApiError("api.not_json", notJson, { contentType });
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ApiError("api.parse", malformedJsonMessage(errorMessage(e)), { contentType });
  }
}

/**
 * What the parse hook hands on for an empty optional body: Elysia falls back to its own parsers
 * (reading the body again) when a parse hook gives `undefined`, so "no body" travels as this and
 * the transform hook (before validation) makes it `undefined`.
 */
const NO_BODY = Symbol("no body");

/**
 * Route options making `schema` the route's JSON body (read by readJsonBody; its ApiError reaches
 * the app's error handler as the `cause` of Elysia's parse error) and checking it for unknown
 * fields with `policy` before the handler runs (after validation). Spread into the route's options.
 */
export function strictBody<S extends TSchema>(policy: BodyPolicy, schema: S) {
  const optional = (schema as { [OptionalKind]?: string })[OptionalKind] === "Optional";
  return {
    body: schema,
    // the "json" after it is never reached (the first always answers): it makes the OpenAPI
    // document list application/json as the one content type of the body
    parse: [async ({ request }: { request: Request }) => (await readJsonBody(request, optional)) ?? NO_BODY, "json" as const],
    transform(ctx: { body: unknown }) {
      if (ctx.body === NO_BODY) ctx.body = undefined;
    },
    beforeHandle({ body, request, route }: { body: unknown; request: Request; route: string }) {
      policy.check(`${request.method} ${route}`, body, schema);
    },
  };
}
