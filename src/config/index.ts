/**
 * Node configuration: one typed tree (`Config`) defined by `CONFIG_SCHEMA` (src/config/schema.ts,
 * where every key, default, range and unit lives; config/default.toml is generated from it),
 * overridden by an operator file (`--config` / `AENV_CONFIG_PATH`) and then by environment
 * variables (`ENV_ALIASES`, and `AENV__<section>__<key>` for any key).
 *
 * Every value is checked against the schema when it is loaded: an unknown key, a value of the
 * wrong type or out of range stops start-up with one line naming the source, the key, the value
 * and what was expected. Code then reads `cfg.section.key` with its static type.
 * Adding a key: see the doc comment of src/config/schema.ts.
 */
import { readFileSync } from "node:fs";
import { parse, TomlError } from "smol-toml";
import { badValue, checkValue, defaultsOf, isSection, type KeySchema, mergeTable, unknownKey } from "./check.ts";
import { ConfigError } from "./errors.ts";
import { CONFIG_SCHEMA, type Config } from "./schema.ts";

export { CONFIG_SCHEMA, type Config } from "./schema.ts";
export { type ConfigUnit, expectation, isSection, type KeySchema, sectionFrom } from "./check.ts";
export { CONFIG_ERRORS, ConfigError, type ConfigErrorCode } from "./errors.ts";
export { renderDefaultToml } from "./toml.ts";
import { errorMessage } from "../util/error.ts";

const ROOT: KeySchema = CONFIG_SCHEMA;

/** Environment variables with a fixed meaning, mapped to their config key path. */
export const ENV_ALIASES: Record<string, string> = {
  AENV_HOME_PATH: "home_path",
  AENV_RUNTIME_PATH: "runtime_path",
  AENV_API_ADDR: "api.addr",
  AENV_API_KEY: "api.key",
  AENV_LOG_LEVEL: "log.level",
  AENV_SANDBOX_PROXY_DOMAINS: "sandbox_proxy.domains",
  AENV_NODE_ID: "node.id",
  AENV_CLUSTER_ID: "node.cluster_id",
  // scheduler reporting, named as upstream AgentENV names them
  AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED: "observability.scheduler_report.enabled",
  AENV_OBSERVABILITY_SCHEDULER_ENDPOINT: "cluster.scheduler_endpoint",
  AENV_OBSERVABILITY_REPORT_INTERVAL_SECS: "observability.scheduler_report.interval_secs",
  AENV_GATEWAY_SANDBOX_PROXY_DOMAINS: "gateway.sandbox_proxy_domains",
  AENV_SNAPSHOT_S3_ACCESS_KEY_ID: "snapshot.s3.access_key_id",
  AENV_SNAPSHOT_S3_SECRET_ACCESS_KEY: "snapshot.s3.secret_access_key",
};

type Table = Record<string, unknown>;

/** The defaults of every key (a fresh tree on each call). */
export function defaultConfig(): Config {
  return defaultsOf(ROOT) as Config;
}

/** The schema of section `name` as plain JSON without its documentation (src/config/envd-section.json is `sectionSchemaJson("envd")`). */
export function sectionSchemaJson(name: keyof Config & string): string {
  return `${JSON.stringify(ROOT.properties![name], (k, v) => (k === "description" ? undefined : v), 2)}\n`;
}

/**
 * Load the configuration.
 * @param opts.path operator TOML file; falls back to `env.AENV_CONFIG_PATH`; none when both are absent.
 * @param opts.env environment to read overrides from (default `process.env`).
 * @param opts.tree a partial config tree applied after the file and before the environment,
 *   checked like a file (tests and embedders use it instead of writing TOML).
 * @throws ConfigError naming the source (file or variable), key, value and expectation.
 */
export function loadConfig(opts: { path?: string; env?: Record<string, string | undefined>; tree?: Record<string, unknown> } = {}): Config {
  const env = opts.env ?? process.env;
  const cfg = defaultConfig() as unknown as Table;
  const path = opts.path ?? env.AENV_CONFIG_PATH;
  if (path) {
    let text: string;
    try {
      text = readFileSync(path, "utf8");
    } catch (e) {
      throw new ConfigError("config.unreadable", `cannot read config file ${path}: ${errorMessage(e)}`, { path });
    }
    let user: Table;
    try {
      user = parse(text) as Table;
    } catch (e) {
      // smol-toml, not Bun.TOML: Bun 1.4.4's parse errors carry no position in the document (their
      // line and column point into the calling script)
      const where = e instanceof TomlError ? ` at line ${e.line}, column ${e.column}` : "";
      const first = errorMessage(e).split("\n")[0];
      throw new ConfigError("config.bad_toml", `config file ${path} is not valid TOML${where}: ${first}`, {
        path,
        ...(e instanceof TomlError ? { line: e.line, column: e.column } : {}),
      });
    }
    mergeTable(cfg, ROOT, nodeIdentityAlias(user, path), "", path);
  }
  if (opts.tree) mergeTable(cfg, ROOT, nodeIdentityAlias(opts.tree, "config tree"), "", "config tree");
  for (const [name, raw] of Object.entries(env)) {
    if (raw === undefined) continue;
    // the generic form splits on "__" only: a map entry's name may hold dots (a registry host)
    const parts = ENV_ALIASES[name]?.split(".") ?? (name.startsWith("AENV__") ? name.slice(6).split("__") : undefined);
    if (!parts) continue;
    setFromEnv(cfg, parts, raw, name);
  }
  return cfg as unknown as Config;
}

/** Upstream AgentENV's `[node_identity]` keys and the `[node]` keys they are read as. */
export const NODE_IDENTITY_ALIASES: Record<string, string> = { node_id: "id", cluster_id: "cluster_id", service_instance_id: "service_instance_id" };

/**
 * Read upstream AgentENV's `[node_identity]` section (node_id, cluster_id, service_instance_id)
 * as our `[node]` (id, cluster_id, service_instance_id), so an upstream identity section works.
 * @throws ConfigError unknown_key for another key in it, or when the same file also has `[node]`
 *   (one of the two, not both); bad_value when it is not a table.
 */
function nodeIdentityAlias(t: Table, source: string): Table {
  if (!("node_identity" in t)) return t;
  const { node_identity: ni, ...rest } = t;
  const nodeSchema = ROOT.properties!.node!;
  if (typeof ni !== "object" || ni === null || Array.isArray(ni)) throw badValue("node_identity", ni, nodeSchema, source);
  if ("node" in t) {
    throw new ConfigError("config.unknown_key", `config: ${source}: [node_identity] (upstream AgentENV's name) and [node] are both set: keep [node] (id, cluster_id, service_instance_id)`, { key: "node_identity", source });
  }
  const node: Table = {};
  for (const [k, v] of Object.entries(ni as Table)) {
    const ours = NODE_IDENTITY_ALIASES[k];
    if (!ours) throw new ConfigError("config.unknown_key", `config: ${source}: unknown key node_identity.${k} ([node_identity] is read as [node]: node_id, cluster_id, service_instance_id)`, { key: `node_identity.${k}`, source });
    node[ours] = v;
  }
  return { ...rest, node };
}

function setFromEnv(cfg: Table, path: string[], raw: string, source: string): void {
  const key = path.join(".");
  const parts = path.slice(0, -1);
  const last = path[path.length - 1]!;
  let table = cfg;
  let schema = ROOT;
  for (const [i, p] of parts.entries()) {
    const s = schema.properties?.[p];
    if (s && !isSection(s) && s.patternProperties && i === parts.length - 1) {
      // one entry of a map key: AENV__image__registry_mirrors__docker.io=a,b
      const entry = fromString(Object.values(s.patternProperties)[0]!, raw);
      const map = { ...(table[p] as Table), [last]: entry };
      if (!checkValue(s, map)) throw badValue(key, raw, s, source);
      table[p] = map;
      return;
    }
    if (!s || !isSection(s)) throw unknownKey(key, source);
    schema = s;
    table = table[p] as Table;
  }
  const s = schema.properties?.[last];
  if (!s) throw unknownKey(key, source);
  if (s.type === "object") throw badValue(key, raw, s, source);
  const value = fromString(s, raw);
  if (!checkValue(s, value)) throw badValue(key, raw, s, source);
  table[last] = value;
}

/** An environment string as the schema's type; a string that cannot be converted stays a string (and fails the check). */
function fromString(s: KeySchema, raw: string): unknown {
  const numeric = s.type === "integer" || typeof s.anyOf?.[0]?.const === "number";
  if (numeric) return raw.trim() === "" || !Number.isFinite(Number(raw)) ? raw : Number(raw);
  if (s.type === "boolean") return raw === "true" ? true : raw === "false" ? false : raw;
  if (s.type === "array") return raw.trim() === "" ? [] : raw.split(",").map((x) => x.trim());
  return raw;
}
