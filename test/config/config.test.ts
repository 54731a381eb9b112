import { describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConfigError, get, loadConfig } from "../../src/config/index.ts";

describe("config", () => {
  test("embedded defaults", () => {
    const cfg = loadConfig({ env: {} });
    expect(get<string>(cfg, "api.addr")).toBe("0.0.0.0:8000");
    expect(get<string>(cfg, "home_path")).toBe("/var/lib/agentenv");
  });

  test("file then env overrides, aliases and generic form", () => {
    const dir = mkdtempSync(join(tmpdir(), "cfg-"));
    const file = join(dir, "c.toml");
    writeFileSync(file, 'home_path = "/x"\n[api]\naddr = "127.0.0.1:9000"\n');
    const cfg = loadConfig({ env: { AENV_CONFIG_PATH: file, AENV_API_ADDR: "127.0.0.1:9001", AENV__log__level: "debug" } });
    expect(get<string>(cfg, "home_path")).toBe("/x");
    expect(get<string>(cfg, "api.addr")).toBe("127.0.0.1:9001");
    expect(get<string>(cfg, "log.level")).toBe("debug");
  });

  test("unknown key, wrong type and bad TOML are typed errors", () => {
    const dir = mkdtempSync(join(tmpdir(), "cfg-"));
    const bad = join(dir, "bad.toml");
    writeFileSync(bad, "[api]\nnope = 1\n");
    expect(() => loadConfig({ path: bad, env: {} })).toThrow(/unknown config key api.nope/);
    writeFileSync(bad, "[api]\naddr = 5\n");
    expect(() => loadConfig({ path: bad, env: {} })).toThrow(ConfigError);
    writeFileSync(bad, "[api\n");
    try {
      loadConfig({ path: bad, env: {} });
      throw new Error("no throw");
    } catch (e) {
      expect((e as ConfigError).code).toBe("config.bad_toml");
    }
    expect(() => loadConfig({ path: join(dir, "missing.toml"), env: {} })).toThrow(/cannot read/);
    expect(() => get(loadConfig({ env: {} }), "api.missing")).toThrow(ConfigError);
  });
});
