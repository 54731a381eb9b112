/**
 * Gateway replicas sharing the cluster's secrets in Redis (`[secrets] store = "redis"`), as the
 * Kubernetes manifests run them: two gateways on throwaway data directories, one key file, one
 * Debian redis-server started by this test on 127.0.0.1 and killed by pid after. A secret made
 * through one gateway (the SDK's Secret) is seen, resolved for nodes and updated through the
 * other; a gateway started again on a new directory still has it; a gateway with another key
 * answers 500 secrets.key_mismatch and `agentenv gateway` exits on it; a missing key file stops
 * the start; an unreachable Redis is 503.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { Secret } from "e2b";
import { loadConfig } from "../../../src/config/index.ts";
import { RemoteSecretSource, SecretsError } from "../../../src/secrets/index.ts";
import { gatewayConfig, startGateway, type RunningGateway } from "../../../services/gateway/index.ts";
import { freePort, startRedis, type TestRedis } from "../helpers.ts";

const KEY = "e2b_" + "ab".repeat(20);
const ROOT = join(import.meta.dir, "../../..");
const dir = mkdtempSync("/tmp/aenv-gw-secrets-redis-");
const keyFile = join(dir, "secrets.key");
const otherKeyFile = join(dir, "other.key");
let redis: TestRedis;
const started: RunningGateway[] = [];
const spawned: Bun.Subprocess[] = [];

/** The environment of a gateway replica: its own throwaway home, the shared Redis and key. */
const env = (keyPath: string, redisUrl = redis.url) => ({
  AENV_HOME_PATH: mkdtempSync(join(dir, "home-")),
  AENV_API_KEY: KEY,
  AENV_LOG_LEVEL: "error",
  AENV__gateway__addr: "127.0.0.1:0",
  AENV__cluster__scheduler_endpoint: `127.0.0.1:${freePort()}`,
  AENV__secrets__store: "redis",
  AENV__secrets__key_path: keyPath,
  // the cluster's one Redis, named where the scheduler's is
  AENV__scheduler__redis_url: redisUrl,
});
const start = (keyPath = keyFile, redisUrl?: string) => {
  const g = startGateway(gatewayConfig(loadConfig({ env: env(keyPath, redisUrl) })));
  started.push(g);
  return g;
};

beforeAll(async () => {
  redis = await startRedis(["--loglevel", "warning"]);
  writeFileSync(keyFile, randomBytes(32).toString("hex"), { mode: 0o600 });
  writeFileSync(otherKeyFile, randomBytes(32).toString("hex"), { mode: 0o600 });
});
afterAll(async () => {
  for (const g of started) await g.close();
  for (const p of spawned) if (p.exitCode === null) p.kill("SIGKILL");
  await redis?.stop();
  rmSync(dir, { recursive: true, force: true });
});

test("two gateways over one Redis serve one set of secrets; a gateway started again keeps them", async () => {
  const a = start();
  const b = start();
  expect([a.gateway.secrets.kind, b.gateway.secrets.kind]).toEqual(["redis", "redis"]);
  await a.gateway.secrets.check();
  const oa = { apiUrl: a.url, apiKey: KEY };
  const ob = { apiUrl: b.url, apiKey: KEY };
  const made = await Secret.create("shared-k", "value-one", { ...oa, metadata: { env: "prod" } });
  const seen = await Secret.getInfo("shared-k", ob);
  expect(made.secretId).toMatch(/^sec_[0-9a-z]{26}$/);
  expect([seen.secretId, seen.version, seen.metadata]).toEqual([made.secretId, 1, { env: "prod" }]);
  // nodes resolve through either gateway with the node key
  expect(await new RemoteSecretSource(b.url, () => KEY, 5000).resolve("shared-k")).toBe("value-one");
  // an update through b is the value a resolves next
  await Secret.update("shared-k", "value-two", ob);
  expect(await new RemoteSecretSource(a.url, () => KEY, 5000).resolve("shared-k")).toBe("value-two");
  expect((await Secret.getInfo("shared-k", oa)).version).toBe(2);
  // the name is taken for the cluster, not per replica
  const dup = await fetch(`${b.url}/secrets`, { method: "POST", headers: { "x-api-key": KEY, "content-type": "application/json" }, body: JSON.stringify({ name: "shared-k", value: "v" }) });
  expect([dup.status, ((await dup.json()) as { error_code: string }).error_code]).toEqual([409, "secrets.conflict"]);
  await Secret.create("second", "v2", ob);
  const listed = await fetch(`${a.url}/secrets?limit=1`, { headers: { "x-api-key": KEY } });
  const next = listed.headers.get("x-next-token");
  expect(((await listed.json()) as { name: string }[]).map((s) => s.name)).toEqual(["shared-k"]);
  const rest = await fetch(`${b.url}/secrets?limit=1&nextToken=${next}`, { headers: { "x-api-key": KEY } });
  expect(((await rest.json()) as { name: string }[]).map((s) => s.name)).toEqual(["second"]);

  // both replicas go; a new one on a fresh directory has every secret
  for (const g of [a, b]) await g.close();
  started.splice(0);
  const c = start();
  expect((await Secret.getInfo("shared-k", { apiUrl: c.url, apiKey: KEY })).version).toBe(2);
  expect(await new RemoteSecretSource(c.url, () => KEY, 5000).resolve("shared-k")).toBe("value-two");
  expect(await Secret.destroy("second", { apiUrl: c.url, apiKey: KEY })).toBe(true);
});

test("a gateway with another key answers key_mismatch and never reveals or changes a secret", async () => {
  const good = start();
  await Secret.create("guarded", "guarded-value", { apiUrl: good.url, apiKey: KEY });
  const bad = start(otherKeyFile);
  const e = await bad.gateway.secrets.check().then(
    () => null,
    (x) => x as SecretsError,
  );
  expect(e?.code).toBe("secrets.key_mismatch");
  for (const [method, path] of [["GET", "/secrets"], ["GET", "/secrets/guarded"], ["DELETE", "/secrets/guarded"]] as const) {
    const r = await fetch(`${bad.url}${path}`, { method, headers: { "x-api-key": KEY } });
    const body = await r.text();
    expect([path, r.status, (JSON.parse(body) as { error_code: string }).error_code]).toEqual([path, 500, "secrets.key_mismatch"]);
    expect(body.includes("guarded-value")).toBe(false);
  }
  const r = await fetch(`${bad.url}/internal/secrets/resolve`, { method: "POST", headers: { "x-api-key": KEY }, body: JSON.stringify({ name: "guarded" }) });
  expect(r.status).toBe(500);
  expect((await r.text()).includes("guarded-value")).toBe(false);
  expect(await new RemoteSecretSource(good.url, () => KEY, 5000).resolve("guarded")).toBe("guarded-value");
});

test("`agentenv gateway` with another key than the store's exits 1 naming the mismatch", async () => {
  const p = Bun.spawn([process.execPath, join(ROOT, "src/cli/main.ts"), "gateway"], { env: { ...process.env, ...env(otherKeyFile) }, stdout: "pipe", stderr: "pipe" });
  spawned.push(p);
  expect(await p.exited).toBe(1);
  const err = await new Response(p.stderr).text();
  expect(err).toContain("were sealed with another key");
});

test("a missing key file stops the start; an unreachable Redis answers 503 store_failed", async () => {
  let e: unknown;
  try {
    start(join(dir, "nope.key"));
  } catch (x) {
    e = x;
  }
  expect((e as SecretsError).code).toBe("secrets.key_unusable");
  const down = start(keyFile, `redis://127.0.0.1:${freePort()}`);
  const r = await fetch(`${down.url}/secrets`, { headers: { "x-api-key": KEY } });
  expect([r.status, ((await r.json()) as { error_code: string }).error_code]).toEqual([503, "secrets.store_failed"]);
});
