/**
 * The cluster's secrets: the gateway keeps the one store (its own database and key file) and
 * serves `/secrets` itself; nodes with `[secrets] gateway_url` ask it for values with the node key
 * (RemoteSecretSource), refuse `/secrets` of their own (403 naming the gateway), and check a
 * create's rules against the gateway's secrets. No scheduler is needed for any of it.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { Secret } from "e2b";
import { loadConfig } from "../../../src/config/index.ts";
import { RemoteSecretSource, SecretsError } from "../../../src/secrets/index.ts";
import { gatewayConfig, startGateway, type RunningGateway } from "../../../services/gateway/index.ts";
import { api, createLoopback, startNodeNoVm, type TestNode } from "../../api/helpers.ts";
import { freePort } from "../helpers.ts";

const KEY = "e2b_" + "cd".repeat(20);
const NODE_KEY = "e2b_" + "ef".repeat(20);
const home = mkdtempSync("/tmp/aenv-gw-secrets-");
let gw: RunningGateway;
let node: TestNode;

beforeAll(async () => {
  gw = startGateway(
    gatewayConfig(
      loadConfig({ env: { AENV_HOME_PATH: home, AENV_API_KEY: KEY, AENV_LOG_LEVEL: "error", AENV__gateway__addr: "127.0.0.1:0", AENV__gateway__node_api_key: NODE_KEY, AENV__cluster__scheduler_endpoint: `127.0.0.1:${freePort()}` } }),
    ),
  );
  node = await startNodeNoVm({ AENV_API_KEY: NODE_KEY, AENV__secrets__gateway_url: gw.url }, undefined, {});
});
afterAll(async () => {
  await node?.dispose();
  await gw?.close();
  rmSync(home, { recursive: true, force: true });
});

test("the gateway serves the SDK's Secret from its own store; nodes resolve values from it with the node key", async () => {
  const o = { apiUrl: gw.url, apiKey: KEY };
  const s = await Secret.create("cluster-k", "value-one", o);
  expect(s.version).toBe(1);
  expect(statSync(join(home, "secrets.key")).mode & 0o777).toBe(0o600);
  const remote = new RemoteSecretSource(gw.url, () => NODE_KEY, 5000);
  expect(await remote.resolve("cluster-k")).toBe("value-one");
  expect(await remote.resolve("CLUSTER-K")).toBe("value-one");
  // the next look-up sees an update at once (no cache)
  await Secret.update("cluster-k", "value-two", o);
  expect(await remote.resolve("cluster-k")).toBe("value-two");
  expect(await remote.resolve("absent")).toBeNull();
  // the client key is not the node key; nothing else answers the resolve path
  const wrong = new RemoteSecretSource(gw.url, () => KEY, 5000);
  const e = await wrong.resolve("cluster-k").then(
    () => null,
    (x) => x as SecretsError,
  );
  expect([e?.code, e?.details.status]).toEqual(["secrets.remote_failed", 401]);
  // the resolve endpoint is not on the client API: /secrets answers never carry a value
  const listed = await fetch(`${gw.url}/secrets`, { headers: { "x-api-key": KEY } });
  expect(listed.headers.get("cache-control")).toBe("no-store");
  expect((await listed.text()).includes("value-two")).toBe(false);
});

test("a node of the cluster refuses /secrets of its own and checks rules against the gateway's store", async () => {
  const r = await api(node, "/secrets", { method: "POST", body: JSON.stringify({ name: "x", value: "y" }) });
  expect(r.status).toBe(403);
  expect(((await r.json()) as { message: string }).message).toContain(gw.url);
  const rules = (name: string) => ({ "api.example.com": [{ transform: { headers: { Authorization: `Bearer \${e2b.secrets.${name}}` } } }] });
  const ok = await createLoopback(node, { network: { rules: rules("cluster-k") } });
  expect(ok.state).toBe("running");
  const bad = await api(node, "/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", network: { rules: rules("nope") } }) });
  expect(bad.status).toBe(400);
  expect(((await bad.json()) as { message: string }).message).toContain('secret "nope" does not exist');
});
