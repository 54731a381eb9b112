/**
 * `bun run config:defaults`: write the files generated from src/config/schema.ts,
 * config/default.toml and src/config/envd-section.json (test/config/config.test.ts fails while
 * either is stale).
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { renderDefaultToml, sectionSchemaJson } from "../src/config/index.ts";

const REPO = join(import.meta.dir, "..");
writeFileSync(join(REPO, "config/default.toml"), renderDefaultToml());
writeFileSync(join(REPO, "src/config/envd-section.json"), sectionSchemaJson("envd"));
