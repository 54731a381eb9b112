/**
 * `/secrets` through the unmodified SDK's `Secret` class against a real node (SQLite store, key
 * file in its data dir), and the create/update network checks that depend on secrets: a rule
 * naming an unknown secret, a bare `*`, a malformed rule or a bad egress proxy is a 400 naming the
 * field, and nothing of the sandbox is made. `getInfo` shows rules with values masked and an egress
 * proxy without its password. No answer or error carries a secret's value (node logs: test/e2e/egress.test.ts).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { statSync } from "node:fs";
import { join } from "node:path";
import { Sandbox, Secret, SecretNotFoundError } from "e2b";
import { api, createLoopback, startNodeNoVm, type TestNode } from "./helpers.ts";

let node: TestNode;
const VALUE = "sk-test-VALUE-1f2e3d4c5b6a";

beforeAll(async () => {
  node = await startNodeNoVm({}, undefined, {});
});
afterAll(async () => {
  await node?.dispose();
});

const opts = () => ({ apiUrl: node.url, apiKey: node.apiKey });

test("the SDK's Secret: create, getInfo by id and name, exists, update, list pages, destroy; the value never comes back", async () => {
  const a = await Secret.create("Stripe-Key", VALUE, { ...opts(), metadata: { env: "test" } });
  expect(a.name).toBe("stripe-key");
  expect(a.secretId).toMatch(/^sec_[0-9a-z]{26}$/);
  expect([a.version, a.metadata]).toEqual([1, { env: "test" }]);
  expect(a.createdAt).toBeInstanceOf(Date);
  expect((await Secret.getInfo(a.secretId, opts())).name).toBe("stripe-key");
  expect((await Secret.getInfo("STRIPE-KEY", opts())).secretId).toBe(a.secretId);
  expect(await Secret.exists("stripe-key", opts())).toBe(true);
  expect(await Secret.exists("nope", opts())).toBe(false);
  const u = await Secret.update("stripe-key", `${VALUE}-2`, opts());
  expect([u.version, u.metadata]).toEqual([2, { env: "test" }]);
  await Secret.create("second", "v2", opts());
  await Secret.create("third", "v3", opts());
  const pager = Secret.list({ ...opts(), limit: 2 });
  const first = await pager.nextItems();
  expect([first.map((s) => s.name), pager.hasNext]).toEqual([["stripe-key", "second"], true]);
  const rest = await pager.nextItems();
  expect([rest.map((s) => s.name), pager.hasNext]).toEqual([["third"], false]);
  await expect(Secret.update("nope", "x", opts())).rejects.toBeInstanceOf(SecretNotFoundError);
  await expect(Secret.getInfo("nope", opts())).rejects.toBeInstanceOf(SecretNotFoundError);
  expect(await Secret.destroy("third", opts())).toBe(true);
  expect(await Secret.destroy("third", opts())).toBe(false);
  expect(Secret.fill("stripe-key")).toBe("${e2b.secrets.stripe-key}");
  // encrypted with a key made in the data dir, mode 0600
  expect(statSync(join(node.home, "secrets.key")).mode & 0o777).toBe(0o600);
});

test("raw API: no-store on every answer, strict bodies, 400s naming the field, 409 for a taken name, never the value", async () => {
  const answers: string[] = [];
  const call = async (path: string, init: RequestInit = {}) => {
    const r = await api(node, path, init);
    answers.push(await r.clone().text());
    expect(r.headers.get("cache-control")).toBe("no-store");
    return r;
  };
  const created = await call("/secrets", { method: "POST", body: JSON.stringify({ name: "raw", value: VALUE }) });
  expect(created.status).toBe(201);
  const cases: [string, RequestInit, number, string][] = [
    ["/secrets", { method: "POST", body: JSON.stringify({ name: "raw", value: VALUE }) }, 409, "secrets.conflict"],
    ["/secrets", { method: "POST", body: JSON.stringify({ name: "x", value: VALUE, extra: 1 }) }, 400, "extra"],
    ["/secrets", { method: "POST", body: JSON.stringify({ name: "bad name", value: VALUE }) }, 400, "name"],
    ["/secrets", { method: "POST", body: JSON.stringify({ name: "x", value: 7 }) }, 400, "value"],
    ["/secrets", { method: "POST", body: `{"name":"x","value":"${VALUE}"` }, 400, "body"],
    // JSON sent as text/plain: refused for its content type, as every JSON route refuses it
    ["/secrets", { method: "POST", body: JSON.stringify({ name: "plain", value: VALUE }), headers: { "content-type": "text/plain" } }, 400, 'this route takes a JSON body (content-type: application/json); the request sent content-type "text/plain"'],
    ["/secrets/raw", { method: "POST", body: JSON.stringify({ value: VALUE }), headers: { "content-type": "application/x-www-form-urlencoded" } }, 400, "application/x-www-form-urlencoded"],
    ["/secrets/raw", { method: "POST", body: JSON.stringify({ value: VALUE, name: "no" }) }, 400, "name"],
    ["/secrets/sec_bad", { method: "GET" }, 400, "secretID"],
    ["/secrets?limit=0", { method: "GET" }, 400, "limit"],
    ["/secrets?limit=5&foo=1", { method: "GET" }, 400, "foo"],
    ["/secrets/absent", { method: "DELETE" }, 404, "secrets.not_found"],
  ];
  for (const [path, init, status, word] of cases) {
    const r = await call(path, init);
    const b = (await r.json()) as { code: number; message: string; error_code: string };
    expect([path, r.status, b.code]).toEqual([path, status, status]);
    expect(`${b.error_code} ${b.message}`).toContain(word);
  }
  expect((await call("/secrets?limit=100")).status).toBe(200);
  for (const a of answers) expect(a.includes("VALUE-1f2e")).toBe(false);
});

test("create: rules naming an unknown secret, a bare *, malformed rules, a bad egress proxy are 400s naming the field; no sandbox is made", async () => {
  await Secret.create("k", VALUE, opts());
  const before = ((await (await api(node, "/v2/sandboxes?state=running,paused")).json()) as unknown[]).length;
  const rule = (headers: Record<string, string>) => ({ "api.example.com": [{ transform: { headers } }] });
  const cases: [Record<string, unknown>, string][] = [
    [{ rules: rule({ Authorization: "Bearer ${e2b.secrets.unknown}" }) }, 'network.rules["api.example.com"][0].transform.headers["Authorization"]: secret "unknown" does not exist'],
    [{ rules: { "*": [{ transform: { headers: { A: "b" } } }] } }, 'network.rules["*"]'],
    [{ rules: { "api.example.com": [{ transform: { headers: { "Bad Name": "b" } } }] } }, 'headers["Bad Name"]'],
    [{ rules: { "api.example.com": [{ transform: { headers: { A: "${e2b.secrets.k" } } }] } }, "malformed E2B placeholder"],
    [{ rules: { "api.example.com": [{ transform: { headers: { A: "x" } }, extra: true }] } }, 'network.rules["api.example.com"][0].extra: unknown field'],
    [{ rules: { "a.example.com": [{}, {}] } }, "at most 1 rule per domain"],
    [{ egressProxy: { address: "ftp://proxy:21" } }, "network.egressProxy.address"],
    [{ egressProxy: { address: "proxy" } }, "network.egressProxy.address"],
    [{ egressProxy: { address: "1.2.3.4:1080", password: "p" } }, "network.egressProxy.password: a password needs a username"],
    [{ egressProxy: { address: "user:pw@1.2.3.4:1080" } }, "network.egressProxy.address"],
    [{ maskRequestHost: "bad host!" }, "network.maskRequestHost"],
    [{ httpsPorts: [49983] }, "network.httpsPorts[0]"],
    [{ unknownThing: 1 }, "unknown field \"network.unknownThing\""],
  ];
  for (const [network, field] of cases) {
    const r = await api(node, "/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", network }) });
    const b = (await r.json()) as { message: string };
    expect([JSON.stringify(network), r.status]).toEqual([JSON.stringify(network), 400]);
    expect(b.message).toContain(field);
    expect(b.message.includes("VALUE-1f2e")).toBe(false);
  }
  expect(((await (await api(node, "/v2/sandboxes?state=running,paused")).json()) as unknown[]).length).toBe(before);
});

test("getInfo shows rules with values masked and the egress proxy without its password; a network update keeps the ingress settings and refuses them in its body", async () => {
  const rules = { "api.example.com": [{ transform: { headers: { Authorization: "Bearer ${e2b.secrets.k}", "X-Literal": "plain-credential" } } }], "*.example.org": [{}] };
  const sbx = await createLoopback(node, { network: { rules, egressProxy: { address: "socks5://203.0.113.7:1080", username: "u", password: "PROXY-PASSWORD" }, maskRequestHost: "app.internal:${PORT}" } });
  const info = await Sandbox.getInfo(sbx.id, opts());
  const raw = (await (await api(node, `/sandboxes/${sbx.id}`)).json()) as { network: Record<string, any> };
  expect(raw.network.rules["api.example.com"][0].transform.headers).toEqual({ Authorization: "***${e2b.secrets.k}", "X-Literal": "***" });
  expect(raw.network.egressProxy).toEqual({ address: "socks5://203.0.113.7:1080", username: "u" });
  expect(JSON.stringify(raw).includes("PROXY-PASSWORD")).toBe(false);
  expect(JSON.stringify(info).includes("PROXY-PASSWORD")).toBe(false);
  expect(JSON.stringify(info).includes("plain-credential")).toBe(false);
  // the update replaces the egress part; maskRequestHost stays
  const put = await api(node, `/sandboxes/${sbx.id}/network`, { method: "PUT", body: JSON.stringify({ allowOut: ["1.1.1.1"] }) });
  expect(put.status).toBe(204);
  const after = (await (await api(node, `/sandboxes/${sbx.id}`)).json()) as { network: Record<string, unknown> };
  expect(after.network).toEqual({ maskRequestHost: "app.internal:${PORT}", allowOut: ["1.1.1.1"] });
  const refused = await api(node, `/sandboxes/${sbx.id}/network`, { method: "PUT", body: JSON.stringify({ maskRequestHost: "x" }) });
  expect(refused.status).toBe(400);
  expect(((await refused.json()) as { message: string }).message).toContain("maskRequestHost");
  const badRule = await api(node, `/sandboxes/${sbx.id}/network`, { method: "PUT", body: JSON.stringify({ rules: { "api.example.com": [{ transform: { headers: { A: "${e2b.secrets.gone}" } } }] } }) });
  expect(badRule.status).toBe(400);
  // nothing half-applied: the stored network is still the previous one
  expect(((await (await api(node, `/sandboxes/${sbx.id}`)).json()) as { network: unknown }).network).toEqual(after.network);
});
