import { AgentEnvError } from "../errors.ts";

/** Stable codes of ConfigError, each with what it means. */
export const CONFIG_ERRORS = {
  "config.unreadable": "the operator's config file cannot be read (details.path)",
  "config.bad_toml": "the operator's config file is not valid TOML (details.path, line, column)",
  "config.unknown_key": "a file key or AENV__ variable names no config key (details.key, source)",
  "config.bad_value": "a value has the wrong type or is out of range (details.key, value, expected, source)",
} as const;
/** A ConfigError code. */
export type ConfigErrorCode = keyof typeof CONFIG_ERRORS;

/** Thrown for unreadable files, bad TOML, unknown keys and values of the wrong type or range. */
export class ConfigError extends AgentEnvError<ConfigErrorCode> {}
