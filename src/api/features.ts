/**
 * What `GET /health` says about the node: its version, envd's, whether bodies are strict, and the
 * optional parts of E2B's API it serves (and the E2B request fields it refuses). The SDKs have no
 * capability handshake; a client or an operator reads this instead of probing. (E2B's spec has
 * `GET /health` answer 204 without a body, its server 200 with text; no SDK calls it. This node
 * answers 200 with this JSON.)
 */
import { ENVD_VERSION } from "../envd/version.ts";
import { UNSUPPORTED } from "./unsupported.ts";

/** Optional E2B features, each named by what a client uses. */
export const FEATURE_DOCS = {
  "sandboxes.v2": "POST /v2/sandboxes, /v2/sandboxes/{id}/connect (E2B SDK >= 2.46)",
  "sandboxes.list.v2": "GET /v2/sandboxes with state, metadata, template, startedAfter, order, pagination",
  "pause.memory": "pause keeping memory; connect resumes where it stopped",
  "pause.filesystem": "pause {memory: false}, autoPauseMemory: false: the disk only (a resume boots)",
  "auto_resume": "autoResume: traffic resumes a paused sandbox",
  "network.egress": "network.allowOut / denyOut / allowPublicTraffic on create",
  "network.update": "PUT /sandboxes/{id}/network",
  "network.rules": "network.rules: headers set on outbound HTTPS per host, ${e2b.secrets.NAME} resolved on the node",
  "network.egress_proxy": "network.egressProxy: all TCP egress through a SOCKS5 or HTTP CONNECT proxy",
  "network.mask_request_host": "network.maskRequestHost and httpsPorts on the proxy into the sandbox",
  secrets: "/secrets (values write-only, encrypted at rest)",
  snapshots: "POST /sandboxes/{id}/snapshots, GET /snapshots, create from a snapshot",
  fork: "POST /sandboxes/{id}/fork",
  volumes: "/volumes, /volumecontent, volumeMounts on create",
  metrics: "GET /sandboxes/{id}/metrics, GET /sandboxes/metrics",
  logs: "GET /sandboxes/{id}/logs, GET /v2/sandboxes/{id}/logs",
  "templates.build": "POST /v3/templates, template builds, tags",
  events: "GET /events/sandboxes, /events/sandboxes/{id} (lifecycle events)",
  webhooks: "/events/webhooks (signed lifecycle event delivery)",
} as const;

/** A feature name. */
export type Feature = keyof typeof FEATURE_DOCS;

/** The `GET /health` body. */
export interface HealthBody {
  status: "ok";
  /** This node's version (package.json). */
  version: string;
  /** The envd protocol version its sandboxes report. */
  envdVersion: string;
  /** `[api] strict_bodies`: unknown body fields are refused (true) or ignored and logged. */
  strictBodies: boolean;
  /** Optional E2B features served, sorted. */
  features: Feature[];
  /** E2B request fields refused with `api.unsupported` when asked for (`create.mcp`, ...). */
  unsupported: string[];
}

/** The health body of a node at `version` serving `features`. */
export function healthBody(version: string, strictBodies: boolean, features: readonly Feature[]): HealthBody {
  const unsupported = Object.entries(UNSUPPORTED).flatMap(([route, rules]) => rules.map(([path]) => `${route}.${path}`));
  return { status: "ok", version, envdVersion: ENVD_VERSION, strictBodies, features: [...features].sort(), unsupported };
}
