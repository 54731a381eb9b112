/**
 * The webhooks registered through the gateway, kept in its data directory
 * (`$home_path/gateway-webhooks.json`, mode 0600: the bodies hold signing secrets) so that a node
 * that joins later, or comes back, is given every one of them (webhook-sync.ts). Each entry is
 * the registration body as the nodes take it (`PUT /events/webhooks/{id}`: name, url, events,
 * enabled, signatureSecret), with the version (the registry's generation) of its last change; a
 * deleted webhook leaves a tombstone, so a node that was away when it was deleted has it deleted
 * when it is back. The newest MAX_TOMBSTONES tombstones are kept. Every change is written to a
 * temporary file, synced and renamed over the old one: a crash leaves the old or the new file.
 */
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, writeSync } from "node:fs";
import { join } from "node:path";
import { Type as T, type Static } from "@sinclair/typebox";
import { describeProblem, jsonSchema } from "../../src/util/json-check.ts";
import { errorMessage } from "../../src/util/error.ts";
import { GatewayError } from "./errors.ts";

/** Tombstones kept: a node away through more deletes than this keeps the oldest deleted ones. */
export const MAX_TOMBSTONES = 1000;

const REGISTRATION = T.Object({ id: T.String(), body: T.Record(T.String(), T.Unknown()), version: T.Integer({ minimum: 1 }) });
const FILE = jsonSchema(
  T.Object({
    format: T.Literal(1),
    generation: T.Integer({ minimum: 0 }),
    webhooks: T.Array(REGISTRATION),
    deleted: T.Array(T.Object({ id: T.String(), version: T.Integer({ minimum: 1 }) })),
  }),
);

/** A registration: what every node is given under `id`, and the registry generation of its last change. */
export type WebhookRegistration = Static<typeof REGISTRATION>;
/** A deleted webhook, and the generation of its delete. */
export interface WebhookTombstone {
  id: string;
  version: number;
}

/** The registry over one file. One gateway process owns a data directory. */
export class WebhookRegistry {
  readonly path: string;
  private generation = 0;
  private readonly byId = new Map<string, WebhookRegistration>();
  private tombstones: WebhookTombstone[] = [];

  /**
   * Load `gateway-webhooks.json` of `homePath` (none yet: empty; the directory is made), keeping
   * at most `maxTombstones` tombstones.
   * @throws GatewayError gateway.bad_state naming the file when it cannot be read or is not a registry.
   */
  constructor(
    homePath: string,
    private readonly maxTombstones = MAX_TOMBSTONES,
  ) {
    this.path = join(homePath, "gateway-webhooks.json");
    mkdirSync(homePath, { recursive: true });
    if (!existsSync(this.path)) return;
    let text: string;
    try {
      text = readFileSync(this.path, "utf8");
    } catch (e) {
      throw new GatewayError("gateway.bad_state", `cannot read the webhook registry ${this.path}: ${errorMessage(e)}`, { path: this.path });
    }
    const r = FILE.parse(text);
    if (!r.ok) throw new GatewayError("gateway.bad_state", `${this.path} is not a webhook registry (${describeProblem(r.problem)}); move it away to start without the webhooks it held`, { path: this.path });
    this.generation = r.value.generation;
    for (const w of r.value.webhooks) this.byId.set(w.id, w);
    this.tombstones = r.value.deleted;
  }

  /** Registrations, oldest change first. */
  list(): WebhookRegistration[] {
    return [...this.byId.values()].sort((a, b) => a.version - b.version);
  }

  /** Tombstones, oldest first. */
  deleted(): WebhookTombstone[] {
    return [...this.tombstones];
  }

  /** Whether `id` is registered here. */
  has(id: string): boolean {
    return this.byId.has(id);
  }

  /** Register (or replace) webhook `id` with `body` (the nodes accepted it). @throws Error when the file cannot be written */
  put(id: string, body: Record<string, unknown>): WebhookRegistration {
    const w = { id, body, version: ++this.generation };
    this.byId.set(id, w);
    this.tombstones = this.tombstones.filter((t) => t.id !== id);
    this.save();
    return w;
  }

  /**
   * Change fields of registered webhook `id` (a PATCH the nodes accepted), or nothing when the
   * gateway does not hold its registration (made on the nodes directly).
   * @throws Error when the file cannot be written
   */
  patch(id: string, fields: Record<string, unknown>): WebhookRegistration | undefined {
    const cur = this.byId.get(id);
    if (!cur) return undefined;
    return this.put(id, { ...cur.body, ...fields });
  }

  /** Delete webhook `id`: a tombstone takes its place. @throws Error when the file cannot be written */
  remove(id: string): WebhookTombstone {
    this.byId.delete(id);
    const t = { id, version: ++this.generation };
    this.tombstones = [...this.tombstones.filter((x) => x.id !== id), t].slice(-this.maxTombstones);
    this.save();
    return t;
  }

  private save(): void {
    const tmp = `${this.path}.tmp`;
    const fd = openSync(tmp, "w", 0o600);
    try {
      writeSync(fd, JSON.stringify({ format: 1, generation: this.generation, webhooks: this.list(), deleted: this.tombstones }));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, this.path);
  }
}
