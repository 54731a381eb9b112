/**
 * Strict request bodies (issue 29): every body the API takes refuses a field its route does not
 * know with 400 `api.unknown_field` naming it, nested fields included; `[api] strict_bodies =
 * false` accepts the request and logs each unknown field once per route. `GET /health` names the
 * node's version and the optional E2B features it serves. Real node (SQLite, orchestrator, API),
 * no VM: the check runs before any handler, so a missing sandbox still shows it.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import pino from "pino";
import { log } from "../../src/observability/log.ts";
import { unknownFields } from "../../src/api/strict.ts";
import { NewSandboxV2 } from "../../src/api/schemas.ts";
import pkg from "../../package.json" with { type: "json" };
import { api, startNodeNoVm, type TestNode } from "./helpers.ts";

const HOOK = "00000000-0000-4000-8000-000000000001";
const webhook = { name: "w", url: "http://127.0.0.1:9/x", events: ["sandbox.lifecycle.created"], signatureSecret: "s" };

/** [method, path, body with one unknown field, the field's path]: every route with a body. */
const ROUTES: [string, string, Record<string, unknown>, string][] = [
  ["POST", "/v2/sandboxes", { templateID: "base", bogus: 1 }, "bogus"],
  ["POST", "/v2/sandboxes", { templateID: "base", network: { allowOut: [], bogus: true } }, "network.bogus"],
  ["POST", "/v2/sandboxes", { templateID: "base", volumeMounts: [{ name: "v", path: "/v", extra: 1 }] }, "volumeMounts[0].extra"],
  ["POST", "/sandboxes", { templateID: "base", secure: true, autoResume: { enabled: true, when: "x" } }, "autoResume.when"],
  ["POST", "/v2/sandboxes/abc123/connect", { timeout: 10, bogus: 1 }, "bogus"],
  ["POST", "/sandboxes/abc123/connect", { timeout: 10, bogus: 1 }, "bogus"],
  ["POST", "/sandboxes/abc123/resume", { bogus: 1 }, "bogus"],
  ["POST", "/sandboxes/abc123/pause", { memory: true, bogus: 1 }, "bogus"],
  ["POST", "/sandboxes/abc123/timeout", { timeout: 10, bogus: 1 }, "bogus"],
  ["POST", "/sandboxes/abc123/refreshes", { duration: 10, bogus: 1 }, "bogus"],
  ["PUT", "/sandboxes/abc123/network", { allowOut: [], bogus: 1 }, "bogus"],
  ["POST", "/sandboxes/abc123/snapshots", { name: "n", bogus: 1 }, "bogus"],
  ["POST", "/sandboxes/abc123/fork", { count: 1, bogus: 1 }, "bogus"],
  ["POST", "/v3/templates", { name: "strict-t", bogus: 1 }, "bogus"],
  ["POST", "/v2/templates/tpl/builds/b1", { steps: [{ type: "RUN", args: ["true"], bogus: 1 }] }, "steps[0].bogus"],
  ["POST", "/templates/tags", { target: "a:b", tags: ["t"], bogus: 1 }, "bogus"],
  ["DELETE", "/templates/tags", { name: "a", tags: ["t"], bogus: 1 }, "bogus"],
  ["POST", "/volumes", { name: "strict-v", bogus: 1 }, "bogus"],
  ["PATCH", "/volumecontent/vol1/path?path=/x", { mode: 420, bogus: 1 }, "bogus"],
  ["POST", "/events/webhooks", { ...webhook, bogus: 1 }, "bogus"],
  ["PUT", `/events/webhooks/${HOOK}`, { ...webhook, bogus: 1 }, "bogus"],
  ["PATCH", `/events/webhooks/${HOOK}`, { enabled: false, bogus: 1 }, "bogus"],
];

let strict: TestNode;
let lenient: TestNode;
const lines: string[] = [];

beforeAll(async () => {
  strict = await startNodeNoVm();
  lenient = await startNodeNoVm({ AENV__api__strict_bodies: "false" });
  // every logger of the process writes through the root logger's destination: read it
  const dest = (log as unknown as Record<symbol, { write(s: string): boolean }>)[pino.symbols.streamSym]!;
  const write = dest.write.bind(dest);
  dest.write = (s: string) => {
    lines.push(s);
    return write(s);
  };
});

afterAll(async () => {
  await strict.dispose();
  await lenient.dispose();
});

test("an unknown field on every route with a body is 400 api.unknown_field naming it", async () => {
  for (const [method, path, body, field] of ROUTES) {
    const r = await api(strict, path, { method, body: JSON.stringify(body) });
    const got = { route: `${method} ${path}`, status: r.status, body: (await r.json()) as Record<string, unknown> };
    expect(got).toMatchObject({ route: `${method} ${path}`, status: 400, body: { code: 400, error_code: "api.unknown_field", message: expect.stringContaining(`unknown field "${field}"`) } });
  }
  // the same bodies without the field are not refused for it
  const r = await api(strict, "/sandboxes/abc123/timeout", { method: "POST", body: JSON.stringify({ timeout: 10 }) });
  expect([r.status, ((await r.json()) as { error_code: string }).error_code]).toEqual([404, "orchestrator.not_found"]);
  // E2B fields this node knows but does not implement stay api.unsupported, not unknown
  const iam = await api(strict, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", iam: { tokens: { a: { audience: "x", tokenType: "y" } } } }) });
  expect(((await iam.json()) as { error_code: string }).error_code).toBe("api.unsupported");
});

test("strict_bodies = false accepts the request and logs each unknown field once per route", async () => {
  for (const [method, path, body, field] of ROUTES) {
    for (let i = 0; i < 2; i++) {
      const r = await api(lenient, path, { method, body: JSON.stringify(body) });
      const b = (await r.json().catch(() => ({}))) as { error_code?: string };
      expect({ route: `${method} ${path}`, field, code: b.error_code ?? null }).not.toMatchObject({ code: "api.unknown_field" });
    }
  }
  const ignored = lines.map((l) => JSON.parse(l) as { msg: string; route?: string; field?: string }).filter((l) => l.msg.startsWith("ignored unknown field"));
  // each (route, field) pair was sent twice and is logged once; routes by their pattern (/sandboxes/:sandboxID/...)
  const pairs = ignored.map((l) => `${l.route}|${l.field}`);
  expect(pairs.length).toBe(ROUTES.length);
  expect(new Set(pairs).size).toBe(ROUTES.length);
  expect(ignored.map((l) => l.field).sort()).toEqual(ROUTES.map(([, , , f]) => f).sort());
  expect(pairs).toContain("POST /sandboxes/:sandboxID/timeout|bogus");
});

/** Routes whose body may be left out (the SDKs send none): an empty body is no body there. */
const OPTIONAL = ["/v2/sandboxes/abc123/connect", "/sandboxes/abc123/resume", "/sandboxes/abc123/pause", "/sandboxes/abc123/refreshes", "/sandboxes/abc123/snapshots", "/sandboxes/abc123/fork", "/volumecontent/vol1/path?path=/x"];

test("a body that is not JSON on every route with a body is 400 naming what was sent: api.not_json for another content type, api.parse for malformed JSON", async () => {
  for (const [method, path, body] of ROUTES) {
    const route = `${method} ${path}`;
    // a JSON text sent as text/plain (curl -d, a form) is refused for its content type, not its fields
    for (const contentType of ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "application/xml"]) {
      const r = await api(strict, path, { method, body: JSON.stringify(body), headers: { "content-type": contentType } });
      expect({ route, status: r.status, body: await r.json() }).toEqual({
        route,
        status: 400,
        body: { code: 400, error_code: "api.not_json", message: `this route takes a JSON body (content-type: application/json); the request sent content-type ${JSON.stringify(contentType)}` },
      });
    }
    const bad = await api(strict, path, { method, body: "{not json", headers: { "content-type": "application/json" } });
    expect({ route, status: bad.status, body: await bad.json() }).toEqual({ route, status: 400, body: { code: 400, error_code: "api.parse", message: expect.stringMatching(/^the request body is not valid JSON: JSON Parse error: /) } });
    // no body: refused where one is required, no body at all where it is optional
    const none = await api(strict, path, { method });
    const b = (await none.json().catch(() => ({}))) as { error_code?: string; message?: string };
    if (OPTIONAL.includes(path)) expect({ route, code: b.error_code }).not.toMatchObject({ code: expect.stringMatching(/^api\./) });
    else expect({ route, status: none.status, body: b }).toMatchObject({ route, status: 400, body: { error_code: "api.validation", message: "this route takes a JSON body (content-type: application/json); the request has none" } });
  }
  // a JSON media type with parameters or a +json suffix is JSON
  for (const contentType of ["application/json; charset=utf-8", "application/merge-patch+json"]) {
    const r = await api(strict, "/sandboxes/abc123/timeout", { method: "POST", body: JSON.stringify({ timeout: 10 }), headers: { "content-type": contentType } });
    expect([contentType, r.status, ((await r.json()) as { error_code: string }).error_code]).toEqual([contentType, 404, "orchestrator.not_found"]);
  }
});

test("unknownFields walks objects, records, unions and arrays", () => {
  expect(unknownFields({ templateID: "t", metadata: { any: "key" }, envVars: null, network: { rules: { "a.com": [{ x: 1 }] }, allowOut: ["x"], zz: 1 }, q: 2 }, NewSandboxV2)).toEqual(["network.zz", "q"]);
  expect(unknownFields(undefined, NewSandboxV2)).toEqual([]);
  expect(unknownFields([1], NewSandboxV2)).toEqual([]);
});

test("GET /health names the version, envd's, strictness and the optional E2B features served", async () => {
  const h = (await (await api(strict, "/health", { key: null })).json()) as Record<string, unknown>;
  expect(h).toMatchObject({ status: "ok", version: pkg.version, strictBodies: true, envdVersion: expect.stringMatching(/^\d+\.\d+\.\d+$/) });
  expect(h.features).toEqual(expect.arrayContaining(["events", "webhooks", "snapshots", "fork", "volumes", "templates.build", "pause.filesystem", "network.rules", "network.egress_proxy", "secrets"]));
  expect(h.unsupported).toEqual(expect.arrayContaining(["create.mcp", "create.iam", "resume.autoPause"]));
  expect(((await (await api(lenient, "/health", { key: null })).json()) as Record<string, unknown>).strictBodies).toBe(false);
});
