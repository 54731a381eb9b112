import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Value } from "@sinclair/typebox/value";
import { parse } from "smol-toml";
import type { TSchema } from "@sinclair/typebox";
import { envdOptions, readSettings } from "../../src/cli/envd.ts";
import { checkValue } from "../../src/config/check.ts";
import { CONFIG_SCHEMA, ConfigError, defaultConfig, isSection, loadConfig, renderDefaultToml, sectionSchemaJson } from "../../src/config/index.ts";
import { DEFAULT_ENVD_OPTIONS, ENVD_PORT } from "../../src/envd/index.ts";
import { CREATE_DEFAULT_TIMEOUT_SECS } from "../../src/orchestrator/timeouts.ts";

const REPO = join(import.meta.dir, "../..");

// every file of this test lives under one directory, removed at the end
const TMP = mkdtempSync(join(tmpdir(), "cfg-"));
afterAll(() => rmSync(TMP, { recursive: true, force: true }));
let files = 0;

/** A new file under TMP holding `text`. */
function tmpFile(text: string, ext = "toml"): string {
  const p = join(TMP, `c${++files}.${ext}`);
  writeFileSync(p, text);
  return p;
}
const tomlFile = (text: string) => tmpFile(text);

/** The ConfigError `fn` throws (fails the test when it throws nothing or something else). */
function configError(fn: () => unknown): ConfigError {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(ConfigError);
  const e = err as ConfigError;
  expect(e.message).not.toContain("\n"); // one line for the operator
  return e;
}

describe("defaults", () => {
  test("config/default.toml is the schema's rendering and parses back to the defaults", () => {
    const text = readFileSync(join(REPO, "config/default.toml"), "utf8");
    expect(text).toBe(renderDefaultToml()); // stale: run `bun run config:defaults`
    expect(parse(text) as unknown).toEqual(defaultConfig());
  });

  test("every default satisfies its own key's type and range", () => {
    expect([...Value.Errors(CONFIG_SCHEMA, defaultConfig())].map((e) => `${e.path}: ${e.message}`)).toEqual([]);
  });

  test("src/config/envd-section.json is the schema's [envd] section", () => {
    const text = readFileSync(join(REPO, "src/config/envd-section.json"), "utf8");
    expect(text).toBe(sectionSchemaJson("envd")); // stale: run `bun run config:defaults`
    expect(Object.keys(JSON.parse(text).properties)).toEqual(Object.keys(defaultConfig().envd));
  });

  test("the loader's value check agrees with TypeBox's on every key, for values in, at and beyond each bound", () => {
    const keys: [string, TSchema][] = [];
    const walk = (s: TSchema, path: string) => {
      for (const [k, c] of Object.entries(s.properties as Record<string, TSchema>)) isSection(c) ? walk(c, `${path}${k}.`) : keys.push([path + k, c]);
    };
    walk(CONFIG_SCHEMA, "");
    expect(keys.length).toBeGreaterThan(200);
    const common: unknown[] = [null, true, false, 0, 1, -1, 1.5, 2 ** 53, "", "x", "1", "0.0.0.0:80", "a/", [], ["a"], [1], {}, { a: 1 }, { "docker.io": ["127.0.0.1:5000"] }, { "bad key/": ["x"] }, { "docker.io": "x" }, { "docker.io": [1] }];
    let compared = 0;
    for (const [key, s] of keys) {
      const samples = [...common, s.default];
      if (s.type === "integer") {
        for (const b of [s.minimum, s.maximum]) if (b !== undefined) samples.push(b - 1, b, b + 1);
        if (s.multipleOf) samples.push(s.multipleOf, s.multipleOf * 3, s.multipleOf + 1);
      }
      if (s.anyOf) for (const l of s.anyOf as TSchema[]) samples.push(l.const, typeof l.const === "number" ? l.const + 1 : `${l.const}x`);
      if (typeof s.default === "string") samples.push(`${s.default}!`, s.default.slice(1));
      for (const v of samples) {
        expect([key, v, checkValue(s, v)]).toEqual([key, v, Value.Check(s, v)]);
        compared++;
      }
    }
    expect(compared).toBeGreaterThan(5000);
  });

  test("loadConfig without file or variables gives the defaults, typed", () => {
    const cfg = loadConfig({ env: {} });
    expect(cfg).toEqual(defaultConfig());
    expect(cfg.api.addr).toBe("0.0.0.0:8000");
    expect(cfg.home_path).toBe("/var/lib/agentenv");
    expect(cfg.orchestrator.max_sandboxes).toBe(16);
    expect(cfg.network.egress.always_denied_cidrs).toHaveLength(6);
  });

  test("defaultConfig returns a fresh tree each call", () => {
    const a = defaultConfig();
    a.template.packages.push("vim");
    a.api.addr = "x:1";
    expect(defaultConfig().template.packages).not.toContain("vim");
    expect(defaultConfig().api.addr).toBe("0.0.0.0:8000");
  });
});

describe("overrides", () => {
  test("file, then aliases and AENV__section__key variables, each typed", () => {
    const file = tomlFile('home_path = "/x"\n[api]\naddr = "127.0.0.1:9000"\n[network.egress]\ndns_timeout_ms = 500\n');
    const cfg = loadConfig({
      env: {
        AENV_CONFIG_PATH: file,
        AENV_API_ADDR: "127.0.0.1:9001",
        AENV__log__level: "debug",
        AENV__pool__low_watermark: "4",
        AENV__disk__fuse_direct_io: "true",
        AENV__network__egress__dns_upstream: "1.1.1.1, 8.8.8.8:53",
        AENV_SANDBOX_PROXY_DOMAINS: "",
      },
    });
    expect(cfg.home_path).toBe("/x");
    expect(cfg.api.addr).toBe("127.0.0.1:9001");
    expect(cfg.log.level).toBe("debug");
    expect(cfg.pool.low_watermark).toBe(4);
    expect(cfg.disk.fuse_direct_io).toBe(true);
    expect(cfg.network.egress.dns_timeout_ms).toBe(500);
    expect(cfg.network.egress.dns_upstream).toEqual(["1.1.1.1", "8.8.8.8:53"]);
    expect(cfg.sandbox_proxy.domains).toEqual([]);
  });

  test("a map key ([image.registry_mirrors]): a file's table, one entry per variable, keys and values checked", () => {
    const file = tomlFile('[image.registry_mirrors]\n"docker.io" = ["127.0.0.1:5000", "mirror.example/hub"]\n"ghcr.io" = []\n');
    expect(loadConfig({ path: file, env: {} }).image.registry_mirrors).toEqual({ "docker.io": ["127.0.0.1:5000", "mirror.example/hub"], "ghcr.io": [] });
    // a variable sets one entry over the file's
    const cfg = loadConfig({ path: file, env: { "AENV__image__registry_mirrors__quay.io:443": "m1:5000, m2" } });
    expect(cfg.image.registry_mirrors).toEqual({ "docker.io": ["127.0.0.1:5000", "mirror.example/hub"], "ghcr.io": [], "quay.io:443": ["m1:5000", "m2"] });
    expect(defaultConfig().image.registry_mirrors).toEqual({});
    const badKey = configError(() => loadConfig({ env: {}, tree: { image: { registry_mirrors: { "docker.io/x": ["m"] } } } }));
    expect(badKey.code).toBe("config.bad_value");
    expect(badKey.message).toContain("image.registry_mirrors");
    expect(badKey.message).toContain("a table of keys matching");
    expect(configError(() => loadConfig({ env: {}, tree: { image: { registry_mirrors: { "docker.io": "m" } } } })).code).toBe("config.bad_value");
    expect(configError(() => loadConfig({ env: { "AENV__image__registry_mirrors__bad/key": "m" } })).details.key).toBe("image.registry_mirrors.bad/key");
  });

  test("a mirror entry of a registry with a dot: the shell form docs/image-pulls.md gives reaches the node's config; export refuses the name", async () => {
    const doc = readFileSync(join(REPO, "docs/image-pulls.md"), "utf8");
    const section = doc.slice(doc.indexOf("### A mirror entry in the environment"));
    const line = /```sh\n(?:#.*\n)*(env .*) agentenv server\n```/.exec(section)?.[1];
    expect(line).toBeDefined();
    // the documented command, with a config read in place of the node
    const read = `${process.execPath} -e 'const { loadConfig } = await import(${JSON.stringify(join(REPO, "src/config/index.ts"))}); console.log(JSON.stringify(loadConfig({ env: process.env }).image.registry_mirrors))'`;
    const run = (script: string) => Bun.spawnSync(["bash", "-c", script], { env: { PATH: process.env.PATH!, AENV_HOME_PATH: TMP }, stdout: "pipe", stderr: "pipe" });
    const ok = run(`${line} ${read}`);
    expect([ok.exitCode, JSON.parse(ok.stdout.toString())]).toEqual([0, { "docker.io": ["127.0.0.1:5000", "harbor.corp/dockerhub-proxy"] }]);
    // what the page warns about: bash refuses the name
    const refused = run("export AENV__image__registry_mirrors__docker.io=127.0.0.1:5000");
    expect([refused.exitCode, refused.stderr.toString()]).toEqual([1, expect.stringContaining("not a valid identifier")]);
  });

  test("the sandbox lifetime the CLI and console ask for (create and fork) is the default of [orchestrator] default_timeout_secs", () => {
    expect(defaultConfig().orchestrator.default_timeout_secs).toBe(CREATE_DEFAULT_TIMEOUT_SECS);
  });

  test("a tree is checked like a file", () => {
    expect(loadConfig({ env: {}, tree: { pool: { network: { retry_backoff_ms: 7 } } } }).pool.network.retry_backoff_ms).toBe(7);
    const e = configError(() => loadConfig({ env: {}, tree: { pool: { nope: 1 } } }));
    expect(e.code).toBe("config.unknown_key");
    expect(e.details.key).toBe("pool.nope");
  });
});

describe("upstream AgentENV's [node_identity] is read as [node]", () => {
  test("node_id, cluster_id and service_instance_id become [node] id, cluster_id, service_instance_id", () => {
    const file = tomlFile('[node_identity]\nnode_id = "node-a"\ncluster_id = "00000000-0000-0000-0000-000000000000"\nservice_instance_id = "service-instance-a"\n');
    expect(loadConfig({ path: file, env: {} }).node).toEqual({ id: "node-a", cluster_id: "00000000-0000-0000-0000-000000000000", service_instance_id: "service-instance-a" });
    // environment variables still win over the file
    expect(loadConfig({ path: file, env: { AENV_NODE_ID: "node-b" } }).node.id).toBe("node-b");
    expect(loadConfig({ env: {}, tree: { node_identity: { node_id: "t" } } }).node.id).toBe("t");
  });

  test("bad input: both sections, an unknown key in it, a wrong type, not a table", () => {
    const both = tomlFile('[node]\nid = "a"\n[node_identity]\nnode_id = "b"\n');
    const e = configError(() => loadConfig({ path: both, env: {} }));
    expect(e.code).toBe("config.unknown_key");
    expect(e.message).toBe(`config: ${both}: [node_identity] (upstream AgentENV's name) and [node] are both set: keep [node] (id, cluster_id, service_instance_id)`);
    const odd = tomlFile('[node_identity]\nzone = "x"\n');
    const u = configError(() => loadConfig({ path: odd, env: {} }));
    expect([u.code, u.details.key]).toEqual(["config.unknown_key", "node_identity.zone"]);
    expect(u.message).toContain("[node_identity] is read as [node]: node_id, cluster_id, service_instance_id");
    const typed = tomlFile("[node_identity]\nnode_id = 7\n");
    expect(configError(() => loadConfig({ path: typed, env: {} })).details).toMatchObject({ key: "node.id", value: 7 });
    const flat = tomlFile('node_identity = "a"\n');
    expect(configError(() => loadConfig({ path: flat, env: {} })).details).toMatchObject({ key: "node_identity", value: "a" });
  });
});

describe("refusals name the source, key, value and expectation", () => {
  test("unknown key in a file", () => {
    const file = tomlFile("[api]\nnope = 1\n");
    const e = configError(() => loadConfig({ path: file, env: {} }));
    expect(e.code).toBe("config.unknown_key");
    expect(e.details).toEqual({ key: "api.nope", source: file });
    expect(e.message).toBe(`config: ${file}: unknown key api.nope`);
    const top = tomlFile("[nosection]\nx = 1\n");
    expect(configError(() => loadConfig({ path: top, env: {} })).details.key).toBe("nosection");
  });

  test("wrong type in a file", () => {
    const file = tomlFile("[api]\naddr = 5\n");
    const e = configError(() => loadConfig({ path: file, env: {} }));
    expect(e.code).toBe("config.bad_value");
    expect(e.details.key).toBe("api.addr");
    expect(e.details.value).toBe(5);
    expect(e.message).toBe(`config: ${file}: api.addr = 5: expected a string matching /^.+:[0-9]{1,5}$/`);
    const table = tomlFile("api = 1\n");
    expect(configError(() => loadConfig({ path: table, env: {} })).message).toBe(`config: ${table}: api = 1: expected a table`);
    const list = tomlFile('[template]\npackages = "curl"\n');
    expect(configError(() => loadConfig({ path: list, env: {} })).message).toContain('template.packages = "curl": expected a list of strings');
  });

  test("out of range, not a multiple, not one of the allowed values", () => {
    const cases: [string, string][] = [
      ["[disk]\nfuse_threads = 17\n", "disk.fuse_threads = 17: expected an integer in 1..16 (count)"],
      ["[disk]\nfuse_max_write = 5000\n", "disk.fuse_max_write = 5000: expected an integer in 4096..1048576, a multiple of 4096 (bytes)"],
      ["[orchestrator]\nmax_sandboxes = 0\n", "orchestrator.max_sandboxes = 0: expected an integer >= 1 (count)"],
      ["[orchestrator]\nevict_interval_ms = 2.5\n", "orchestrator.evict_interval_ms = 2.5: expected an integer in 10..86400000 (ms)"],
      ['[orchestrator]\nshutdown_action = "explode"\n', 'orchestrator.shutdown_action = "explode": expected one of "kill", "pause", "detach"'],
      ["[overlaybd]\nzfile_block_size = 1000\n", 'overlaybd.zfile_block_size = 1000: expected one of 4096, 8192, 16384, 32768, 65536'],
      ['[network]\nname_prefix = "BAD"\n', 'network.name_prefix = "BAD": expected a string matching /^[a-z][a-z0-9-]{0,9}$/'],
    ];
    for (const [text, want] of cases) {
      const file = tomlFile(text);
      const e = configError(() => loadConfig({ path: file, env: {} }));
      expect(e.code).toBe("config.bad_value");
      expect(e.message).toBe(`config: ${file}: ${want}`);
    }
  });

  test("AENV__ variables: unknown key, wrong type, range, a whole table", () => {
    const cases: [Record<string, string>, string, string][] = [
      [{ AENV__pool__low_watermark: "abc" }, "config.bad_value", 'config: AENV__pool__low_watermark: pool.low_watermark = "abc": expected an integer in 0..32768 (count)'],
      [{ AENV__pool__low_watermark: "" }, "config.bad_value", 'config: AENV__pool__low_watermark: pool.low_watermark = "": expected an integer in 0..32768 (count)'],
      [{ AENV__api__docs: "yes" }, "config.bad_value", 'config: AENV__api__docs: api.docs = "yes": expected true or false'],
      [{ AENV__vm__stop_timeout_ms: "-5" }, "config.bad_value", 'config: AENV__vm__stop_timeout_ms: vm.stop_timeout_ms = "-5": expected an integer in 1..86400000 (ms)'],
      [{ AENV__firecracker__mmds_version: "V3" }, "config.bad_value", 'config: AENV__firecracker__mmds_version: firecracker.mmds_version = "V3": expected one of "V1", "V2"'],
      [{ AENV__overlaybd__cache_block_size: "4097" }, "config.bad_value", 'config: AENV__overlaybd__cache_block_size: overlaybd.cache_block_size = "4097": expected one of 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152, 4194304'],
      [{ AENV__api: "1" }, "config.bad_value", 'config: AENV__api: api = "1": expected a table'],
      [{ AENV__network__egress: "1" }, "config.bad_value", 'config: AENV__network__egress: network.egress = "1": expected a table'],
      [{ AENV__nope__x: "1" }, "config.unknown_key", "config: AENV__nope__x: unknown key nope.x"],
      [{ AENV__api__addr__x: "1" }, "config.unknown_key", "config: AENV__api__addr__x: unknown key api.addr.x"],
      [{ AENV_LOG_LEVEL: "loud" }, "config.bad_value", 'config: AENV_LOG_LEVEL: log.level = "loud": expected one of "trace", "debug", "info", "warn", "error", "fatal", "silent"'],
    ];
    for (const [env, code, message] of cases) {
      const e = configError(() => loadConfig({ env }));
      expect([e.code, e.message]).toEqual([code, message]);
    }
  });

  test("envd's port is E2B's fixed 49983, not a key (a guest on another port would be unreachable)", () => {
    const file = tomlFile("[envd]\nport = 5000\n");
    expect(configError(() => loadConfig({ path: file, env: {} })).message).toBe(`config: ${file}: unknown key envd.port`);
    expect(envdOptions(loadConfig({ env: {} }).envd).port).toBe(ENVD_PORT);
    expect([ENVD_PORT, DEFAULT_ENVD_OPTIONS.port]).toEqual([49983, 49983]);
  });

  test("unreadable file and bad TOML (with its position)", () => {
    const missing = join(TMP, "missing.toml");
    const e1 = configError(() => loadConfig({ path: missing, env: {} }));
    expect(e1.code).toBe("config.unreadable");
    expect(e1.message).toStartWith(`cannot read config file ${missing}: `);
    const bad = tomlFile('[api]\naddr = "x:1"\ndocs = = true\n');
    const e2 = configError(() => loadConfig({ path: bad, env: {} }));
    expect(e2.code).toBe("config.bad_toml");
    expect(e2.details.line).toBe(3);
    expect(e2.message).toStartWith(`config file ${bad} is not valid TOML at line 3, column `);
  });
});

describe("envd --settings (the tools drive's [envd] section as JSON)", () => {
  test("a complete file is taken as is; missing keys get their defaults", () => {
    const d = defaultConfig().envd;
    expect(readSettings(tmpFile(JSON.stringify({ ...d, output_event_bytes: 1000 }), "json"))).toEqual({ ...d, output_event_bytes: 1000 });
    expect(readSettings(tmpFile(JSON.stringify({ max_processes: 3 }), "json"))).toEqual({ ...d, max_processes: 3 });
  });

  test("an unknown key, a wrong type, a value out of range or a non-object is refused naming the file and key", () => {
    const cases: [string, ConfigError["code"], string][] = [
      ['{"port": 5000}', "config.unknown_key", "unknown key envd.port"],
      ['{"max_processes": "many"}', "config.bad_value", 'envd.max_processes = "many": expected an integer >= 1 (count)'],
      ['{"output_event_bytes": 65537}', "config.bad_value", "envd.output_event_bytes = 65537: expected an integer in 1..65536 (bytes)"],
      ['{"host": ""}', "config.bad_value", 'envd.host = "": expected a non-empty string'],
      ['{"clock_sync": 1}', "config.bad_value", "envd.clock_sync = 1: expected true or false"],
      ['{"jsc_options": "bad option"}', "config.bad_value", 'envd.jsc_options = "bad option": expected a string matching'],
      ["[1,2]", "config.bad_value", "envd = [1,2]: expected a table"],
      ["null", "config.bad_value", "envd = null: expected a table"],
    ];
    for (const [text, code, message] of cases) {
      const file = tmpFile(text, "json");
      const e = configError(() => readSettings(file));
      expect(e.code).toBe(code);
      expect(e.message).toStartWith(`config: envd settings ${file}: ${message}`);
    }
    const notJson = tmpFile("{oops", "json");
    expect(() => readSettings(notJson)).toThrow(`envd settings ${notJson}: `);
    expect(() => readSettings(join(TMP, "absent.json"))).toThrow(`envd settings ${join(TMP, "absent.json")}: `);
  });
});

describe("start-up", () => {
  test("`agentenv server` with a bad variable exits 1 with one line naming key, value and expectation", () => {
    const r = Bun.spawnSync(["bun", join(REPO, "src/cli/main.ts"), "server"], {
      env: { PATH: process.env.PATH!, HOME: process.env.HOME ?? "/root", AENV__orchestrator__max_sandboxes: "many" },
      stdout: "pipe",
      stderr: "pipe",
    });
    expect(r.exitCode).toBe(1);
    expect(r.stdout.toString()).toBe("");
    expect(r.stderr.toString()).toBe('agentenv: config: AENV__orchestrator__max_sandboxes: orchestrator.max_sandboxes = "many": expected an integer >= 1 (count)\n');
  });

  test("`agentenv server` with [image] settings that cannot be used exits 1 with one line, before touching anything", () => {
    const home = mkdtempSync(join(TMP, "home-"));
    const run = (env: Record<string, string>) =>
      Bun.spawnSync(["bun", join(REPO, "src/cli/main.ts"), "server"], {
        env: { PATH: process.env.PATH!, HOME: process.env.HOME ?? "/root", AENV_HOME_PATH: home, AENV_RUNTIME_PATH: join(home, "run"), AENV_API_ADDR: "127.0.0.1:0", ...env },
        stdout: "pipe",
        stderr: "pipe",
      });
    const missing = run({ AENV__image__ca_path: join(TMP, "no-such-ca.pem") });
    expect(missing.exitCode).toBe(1);
    expect(missing.stderr.toString()).toBe(`agentenv: config: [image] ca_path: ${join(TMP, "no-such-ca.pem")} does not exist\n`);
    const orphan = run({ AENV__image__mirror_only: "docker.io" });
    expect(orphan.exitCode).toBe(1);
    expect(orphan.stderr.toString()).toBe('agentenv: config: [image] mirror_only: "docker.io" has no mirrors in [image.registry_mirrors]: its images could never be pulled\n');
    const proxy = run({ AENV__image__proxy: "socks5://u:hunter2@p:1080" });
    expect(proxy.exitCode).toBe(1);
    expect(proxy.stderr.toString()).toContain("image.proxy");
    expect(proxy.stderr.toString()).not.toContain("hunter2");
    // nothing was made in the data directory
    expect(readdirSync(home)).toEqual([]);
  });

  test("`agentenv config defaults` prints config/default.toml", () => {
    const r = Bun.spawnSync(["bun", join(REPO, "src/cli/main.ts"), "config", "defaults"], { stdout: "pipe", stderr: "pipe" });
    expect(r.exitCode).toBe(0);
    expect(r.stdout.toString()).toBe(readFileSync(join(REPO, "config/default.toml"), "utf8"));
  });
});
