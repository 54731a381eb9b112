import { expect, test } from "bun:test";
import { ConfigError, loadConfig } from "../../src/config/index.ts";
import { orchestratorConfig } from "../../src/orchestrator/config.ts";

test("[orchestrator] defaults load and AENV__ overrides apply", () => {
  const c = orchestratorConfig(loadConfig({ env: { AENV__orchestrator__max_sandboxes: "3" } }));
  expect(c.maxSandboxes).toBe(3);
  expect(c.defaultTimeoutSecs).toBe(300);
  expect(c.shutdownAction).toBe("kill");
  expect(c.maxConcurrentStarts).toBe(2);
});

test("out-of-range values are refused when the config is loaded, naming the key", () => {
  expect(() => loadConfig({ env: { AENV__orchestrator__max_sandboxes: "0" } })).toThrow(
    expect.objectContaining({ code: "config.bad_value", details: expect.objectContaining({ key: "orchestrator.max_sandboxes", value: "0" }) }),
  );
  expect(() => loadConfig({ env: { AENV__orchestrator__shutdown_action: "explode" } })).toThrow(ConfigError);
  expect(() => loadConfig({ env: { AENV__metrics__history_samples: "0" } })).toThrow(
    expect.objectContaining({ code: "config.bad_value", message: 'config: AENV__metrics__history_samples: metrics.history_samples = "0": expected an integer >= 1 (count)' }),
  );
});

test("AENV_SANDBOX_PROXY_DOMAINS and AENV_NODE_ID are aliases", () => {
  const cfg = loadConfig({ env: { AENV_SANDBOX_PROXY_DOMAINS: "a.local, b.local", AENV_NODE_ID: "n1" } });
  expect(cfg.sandbox_proxy.domains).toEqual(["a.local", "b.local"]);
  expect(cfg.node.id).toBe("n1");
});
