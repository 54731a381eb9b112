/**
 * Node configuration: one typed tree whose defaults are `config/default.toml` (embedded in the
 * binary), overridden by an operator file (`--config` / `AENV_CONFIG_PATH`) and then by
 * environment variables. Every key must exist in the defaults and keep its type.
 */
import { parse } from "smol-toml";
import defaultToml from "../../config/default.toml" with { type: "text" };
import { AgentEnvError } from "../errors.ts";

/** Thrown for unreadable files, bad TOML, unknown keys and values of the wrong type. */
export class ConfigError extends AgentEnvError {}

/** A TOML table as plain data. */
export type ConfigTable = { [key: string]: ConfigValue };
/** Any value a config key may hold. */
export type ConfigValue = string | number | boolean | ConfigValue[] | ConfigTable;

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
};

/** The embedded defaults, parsed once. */
export function defaultConfig(): ConfigTable {
  return parse(defaultToml) as ConfigTable;
}

/**
 * Load the configuration.
 * @param opts.path operator TOML file; falls back to `env.AENV_CONFIG_PATH`; none when both are absent.
 * @param opts.env environment to read overrides from (default `process.env`).
 * @throws ConfigError naming the file, key and value at fault.
 */
export function loadConfig(opts: { path?: string; env?: Record<string, string | undefined> } = {}): ConfigTable {
  const env = opts.env ?? process.env;
  const cfg = defaultConfig();
  const path = opts.path ?? env.AENV_CONFIG_PATH;
  if (path) {
    let text: string;
    try {
      text = require("node:fs").readFileSync(path, "utf8");
    } catch (e) {
      throw new ConfigError("config.unreadable", `cannot read config file ${path}: ${(e as Error).message}`, { path });
    }
    let user: ConfigTable;
    try {
      user = parse(text) as ConfigTable;
    } catch (e) {
      throw new ConfigError("config.bad_toml", `config file ${path} is not valid TOML: ${(e as Error).message}`, { path });
    }
    merge(cfg, user, "", path);
  }
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined) continue;
    let key: string | undefined = ENV_ALIASES[name];
    if (!key && name.startsWith("AENV__")) key = name.slice(6).split("__").join(".");
    if (!key) continue;
    setFromString(cfg, key, value, name);
  }
  return cfg;
}

/**
 * Read a typed value by dotted path, e.g. `get<number>(cfg, "pool.low_watermark")`.
 * @throws ConfigError when the key does not exist.
 */
export function get<T extends ConfigValue>(cfg: ConfigTable, key: string): T {
  let cur: ConfigValue = cfg;
  for (const part of key.split(".")) {
    if (typeof cur !== "object" || Array.isArray(cur) || !(part in cur)) {
      throw new ConfigError("config.unknown_key", `unknown config key ${key}`, { key });
    }
    cur = (cur as ConfigTable)[part]!;
  }
  return cur as T;
}

function kind(v: ConfigValue): string {
  return Array.isArray(v) ? "array" : typeof v;
}

function merge(into: ConfigTable, from: ConfigTable, prefix: string, source: string): void {
  for (const [k, v] of Object.entries(from)) {
    const key = prefix + k;
    if (!(k in into)) throw new ConfigError("config.unknown_key", `${source}: unknown config key ${key}`, { key, source });
    const cur = into[k]!;
    if (kind(cur) !== kind(v)) {
      throw new ConfigError("config.bad_type", `${source}: ${key} must be ${kind(cur)}, got ${kind(v)}`, { key, source });
    }
    if (kind(cur) === "object") merge(cur as ConfigTable, v as ConfigTable, key + ".", source);
    else into[k] = v;
  }
}

function setFromString(cfg: ConfigTable, key: string, raw: string, source: string): void {
  const parts = key.split(".");
  const last = parts.pop()!;
  let table = cfg;
  for (const p of parts) {
    const next = table[p];
    if (next === undefined || kind(next) !== "object") {
      throw new ConfigError("config.unknown_key", `${source}: unknown config key ${key}`, { key, source });
    }
    table = next as ConfigTable;
  }
  if (!(last in table)) throw new ConfigError("config.unknown_key", `${source}: unknown config key ${key}`, { key, source });
  const cur = table[last]!;
  let value: ConfigValue;
  switch (kind(cur)) {
    case "string":
      value = raw;
      break;
    case "number":
      value = Number(raw);
      if (raw.trim() === "" || !Number.isFinite(value)) {
        throw new ConfigError("config.bad_type", `${source}: ${key} must be a number, got ${JSON.stringify(raw)}`, { key, source });
      }
      break;
    case "boolean":
      if (raw !== "true" && raw !== "false") {
        throw new ConfigError("config.bad_type", `${source}: ${key} must be true or false, got ${JSON.stringify(raw)}`, { key, source });
      }
      value = raw === "true";
      break;
    case "array":
      value = raw.trim() === "" ? [] : raw.split(",").map((s) => s.trim());
      break;
    default:
      throw new ConfigError("config.bad_type", `${source}: ${key} is a table and cannot be set from one variable`, { key, source });
  }
  table[last] = value;
}
