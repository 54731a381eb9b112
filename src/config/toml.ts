/**
 * Renders `config/default.toml` from the schema: every key with its default, documentation and
 * accepted values. The checked-in file must equal this output (test/config/config.test.ts);
 * regenerate with `bun run config:defaults`.
 */
import { expectation, isSection, type KeySchema } from "./check.ts";
import { CONFIG_SCHEMA } from "./schema.ts";

const HEADER = `# AgentENV node configuration: every key with its default.
# GENERATED from src/config/schema.ts by \`bun run config:defaults\`: edit the schema, not this file.
# Load order: these defaults (built into the binary), then the file named by --config or
# AENV_CONFIG_PATH, then environment variables: the named aliases (AENV_API_ADDR, AENV_HOME_PATH, ...),
# and the generic form AENV__<section>__<key> (double underscores, e.g. AENV__pool__low_watermark=4;
# lists comma-separated). A key that is not in this file, or a value of another type or outside
# the accepted range, stops start-up with a line naming the key, the value and what is accepted.
`;

const INLINE_MAX = 100;

function comment(text: string): string[] {
  return text ? text.split("\n").map((l) => `# ${l}`) : [];
}

function tomlValue(key: string, v: unknown): string {
  if (Array.isArray(v)) {
    const inline = `[${v.map((x) => JSON.stringify(x)).join(", ")}]`;
    if (`${key} = ${inline}`.length <= INLINE_MAX) return inline;
    return `[\n${v.map((x) => `  ${JSON.stringify(x)},`).join("\n")}\n]`;
  }
  if (typeof v === "object" && v !== null) return `{ ${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)} = ${tomlValue(k, x)}`).join(", ")} }`.replace("{  }", "{}");
  return typeof v === "string" ? JSON.stringify(v) : String(v);
}

function renderTable(out: string[], schema: KeySchema, path: string): void {
  const props = Object.entries(schema.properties ?? {});
  const scalars = props.filter(([, s]) => !isSection(s));
  // a table holding only tables ([observability] above [observability.scheduler_report]) needs no header
  if (path && (scalars.length > 0 || schema.description)) {
    out.push("", `[${path}]`, ...comment(schema.description ?? ""));
  }
  for (const [k, s] of scalars) {
    out.push(...comment(s.description ?? ""));
    if (s.type !== "string" || s.pattern) out.push(`# Accepts ${expectation(s)}.`);
    out.push(`${k} = ${tomlValue(k, s.default)}`);
  }
  for (const [k, s] of props) {
    if (isSection(s)) renderTable(out, s, path ? `${path}.${k}` : k);
  }
}

/** The text of config/default.toml for the current schema. */
export function renderDefaultToml(): string {
  const out: string[] = [HEADER.trimEnd(), ""];
  renderTable(out, CONFIG_SCHEMA, "");
  return out.join("\n") + "\n";
}
