import { expect, test } from "bun:test";
import { loadConfig } from "../../src/config/index.ts";
import { orchestratorConfig } from "../../src/orchestrator/config.ts";

test("[orchestrator] defaults load and AENV__ overrides apply", () => {
  const c = orchestratorConfig(loadConfig({ env: { AENV__orchestrator__max_sandboxes: "3" } }));
  expect(c.maxSandboxes).toBe(3);
  expect(c.defaultTimeoutSecs).toBe(300);
  expect(c.shutdownAction).toBe("kill");
  expect(c.maxConcurrentStarts).toBe(2);
});

test("out-of-range values are orchestrator.bad_config naming the key", () => {
  expect(() => orchestratorConfig(loadConfig({ env: { AENV__orchestrator__max_sandboxes: "0" } }))).toThrow(
    expect.objectContaining({ code: "orchestrator.bad_config", details: { key: "max_sandboxes", value: 0 } }),
  );
  expect(() => orchestratorConfig(loadConfig({ env: { AENV__orchestrator__shutdown_action: "explode" } }))).toThrow(expect.objectContaining({ code: "orchestrator.bad_config" }));
  expect(() => orchestratorConfig(loadConfig({ env: { AENV__metrics__history_samples: "0" } }))).toThrow(
    expect.objectContaining({ code: "orchestrator.bad_config", message: "metrics.history_samples must be an integer >= 1, got 0" }),
  );
});

test("AENV_SANDBOX_PROXY_DOMAINS and AENV_NODE_ID are aliases", () => {
  const cfg = loadConfig({ env: { AENV_SANDBOX_PROXY_DOMAINS: "a.local, b.local", AENV_NODE_ID: "n1" } }) as { sandbox_proxy: { domains: string[] }; node: { id: string } };
  expect(cfg.sandbox_proxy.domains).toEqual(["a.local", "b.local"]);
  expect(cfg.node.id).toBe("n1");
});
