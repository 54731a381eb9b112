/**
 * Template build routes on a real node (SQLite, orchestrator, API listener; no VM is booted):
 * v3 registration, rebuild keeping the template id, names and tags, the files/upload flow with
 * its self-authorising URL, builds that fail before any VM (unknown registry, unsupported step,
 * files never uploaded) ending in `error` with the step named, status log paging, aliases,
 * tags, delete.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { api, startNodeNoVm, type TestNode } from "./helpers.ts";

let node: TestNode;
beforeAll(async () => {
  node = await startNodeNoVm();
});
afterAll(async () => {
  await node?.dispose();
});

/** JSON body of a response (tests read loosely typed bodies). */
const J = async (p: Promise<Response> | Response): Promise<any> => (await p).json();
const json = (body: unknown) => ({ method: "POST", body: JSON.stringify(body) });

async function waitStatus(tid: string, bid: string, want: string[]): Promise<any> {
  for (let i = 0; i < 600; i++) {
    const s = await J(api(node, `/templates/${tid}/builds/${bid}/status`));
    if (want.includes(s.status)) return s;
    await Bun.sleep(50);
  }
  throw new Error(`build ${bid} never reached ${want}`);
}

test("POST /v3/templates registers a build; the same name keeps its templateID with a new buildID", async () => {
  const r = await api(node, "/v3/templates", json({ name: "my-app" }));
  expect(r.status).toBe(202);
  const a = await J(r);
  expect(a.templateID).toMatch(/^[a-z][a-z0-9]{19}$/);
  expect(a.buildID).toMatch(/^[0-9a-f-]{36}$/);
  expect(a.names).toEqual(["my-app"]);
  expect(a.aliases).toEqual(["my-app"]);
  expect(a.tags).toEqual(["default"]);
  const b = await J(api(node, "/v3/templates", json({ name: "my-app:v2", tags: ["prod"] })));
  expect(b.templateID).toBe(a.templateID);
  expect(b.buildID).not.toBe(a.buildID);
  expect(b.tags).toEqual(["v2", "prod"]);
  // older SDKs send alias instead of name
  const c = await J(api(node, "/v3/templates", json({ alias: "older-sdk" })));
  expect(c.names).toEqual(["older-sdk"]);

  const st = await J(api(node, `/templates/${a.templateID}/builds/${a.buildID}/status`));
  expect(st).toMatchObject({ templateID: a.templateID, buildID: a.buildID, status: "waiting", logEntries: [] });
  const t = await J(api(node, `/templates/${a.templateID}`));
  expect(t.builds.map((x: any) => [x.buildID, x.status])).toEqual([[a.buildID, "waiting"], [b.buildID, "waiting"]]);
  expect(t.builds[0].cpuCount).toBe(2);
  expect(t.builds[0].memoryMB).toBe(1024);
  const tags = await J(api(node, `/templates/${a.templateID}/tags`));
  expect(tags.map((x: any) => [x.tag, x.buildID])).toEqual([["default", a.buildID], ["prod", b.buildID], ["v2", b.buildID]]);
  const alias = await api(node, "/templates/aliases/my-app");
  expect(alias.status).toBe(200);
  expect(await J(alias)).toEqual({ templateID: a.templateID, public: false });
  const listed = (await J(api(node, "/templates"))).find((x: any) => x.templateID === a.templateID);
  expect(listed).toMatchObject({ aliases: ["my-app"], buildStatus: "waiting" });
});

test("bad names, bad sizes, unknown builds and a second start are refused with typed errors", async () => {
  for (const body of [{ name: "Bad Name" }, { name: "ok:bad tag" }, {}, { name: "x", cpuCount: 0 }, { name: "x", memoryMB: 64 }]) {
    const r = await api(node, "/v3/templates", json(body));
    expect(r.status).toBe(400);
    expect((await J(r)).code).toBe(400);
  }
  const a = await J(api(node, "/v3/templates", json({ name: "twice" })));
  const unknown = await api(node, `/templates/${a.templateID}/builds/00000000-0000-0000-0000-000000000000/status`);
  expect(unknown.status).toBe(404);
  expect((await J(unknown)).error_code).toBe("template.build_not_found");
  const bad = await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json({ steps: "RUN x" }));
  expect(bad.status).toBe(400);
  const body = { fromImage: "127.0.0.1:1/none:latest", steps: [{ type: "HEALTHCHECK", args: ["x"] }] };
  const first = await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json(body));
  expect(first.status).toBe(202);
  expect(first.headers.get("content-length")).toBe("2");
  const second = await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json(body));
  expect(second.status).toBe(409);
  const st = await waitStatus(a.templateID, a.buildID, ["error"]);
  expect(st.reason.step).toBe("1");
  expect(st.reason.message).toContain("HEALTHCHECK is not supported");
});

test("files: GET gives a signed upload URL; PUT without the API key stores it; then present", async () => {
  const a = await J(api(node, "/v3/templates", json({ name: "with-files" })));
  const hash = "ab".repeat(32);
  const r = await api(node, `/templates/${a.templateID}/files/${hash}`);
  expect(r.status).toBe(201);
  const up = await J(r);
  expect(up.present).toBe(false);
  expect(up.url.startsWith(`${node.url}/upload/template-files/${hash}?expires=`)).toBe(true);
  const body = new Uint8Array(3 * 1024 * 1024).map((_, i) => i % 251);
  // a wrong token and an expired URL are refused, and leave nothing behind
  const forged = up.url.replace(/token=([0-9a-f])/, (_: string, c: string) => `token=${c === "0" ? "1" : "0"}`);
  expect((await fetch(forged, { method: "PUT", body })).status).toBe(403);
  const expired = up.url.replace(/expires=\d+/, "expires=1000");
  expect((await fetch(expired, { method: "PUT", body })).status).toBe(403);
  const put = await fetch(up.url, { method: "PUT", body }); // no X-API-Key, 3 MiB > max_body_bytes
  expect(put.status).toBe(201);
  expect((await J(put)).bytes).toBe(body.length);
  const again = await J(api(node, `/templates/${a.templateID}/files/${hash}`));
  expect(again.present).toBe(true);
  const stored = Bun.file(join(node.home, "catalog", "files", `${hash}.tar`));
  expect(new Uint8Array(await stored.arrayBuffer())).toEqual(body);
  expect(readdirSync(join(node.home, "catalog", "files")).filter((f) => f.endsWith(".tmp"))).toEqual([]);
  expect((await api(node, `/templates/${a.templateID}/files/not-a-hash`)).status).toBe(400);
  expect((await api(node, `/templates/nosuchtemplate/files/${hash}`)).status).toBe(404);
});

test("a build whose base registry is unreachable ends in error at step base with real log lines; logsOffset pages them", async () => {
  const a = await J(api(node, "/v3/templates", json({ name: "no-registry" })));
  const r = await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json({ fromImage: "127.0.0.1:1/nothing/here:v1", steps: [{ type: "RUN", args: ["true"] }] }));
  expect(r.status).toBe(202);
  const st = await waitStatus(a.templateID, a.buildID, ["error"]);
  expect(st.reason.step).toBe("base");
  expect(st.reason.message).toContain("registry 127.0.0.1:1 unreachable");
  const all = st.logEntries as { message: string; level: string; step?: string }[];
  expect(all[0]!.message).toBe("[base] FROM 127.0.0.1:1/nothing/here:v1");
  expect(all.at(-1)!.level).toBe("error");
  const page = await J(api(node, `/templates/${a.templateID}/builds/${a.buildID}/status?logsOffset=${all.length}`));
  expect(page.logEntries).toEqual([]);
  const tail = await J(api(node, `/templates/${a.templateID}/builds/${a.buildID}/status?logsOffset=1&limit=1`));
  expect(tail.logEntries).toEqual([all[1]]);
  const logs = await J(api(node, `/templates/${a.templateID}/builds/${a.buildID}/logs?level=error`));
  expect(logs.logs.map((l: any) => l.level)).toEqual(["error"]);
  // nothing half made: no image cache entry, no pull work dir
  const images = join(node.home, "images");
  expect(existsSync(images) ? readdirSync(images).filter((f) => !f.startsWith("agentenv-")) : []).toEqual([]);
});

test("COPY of files never uploaded fails the build at that step", async () => {
  const a = await J(api(node, "/v3/templates", json({ name: "copy-missing" })));
  const steps = [{ type: "RUN", args: ["true"] }, { type: "COPY", args: ["app/", "/opt/app/"], filesHash: "cd".repeat(32) }];
  await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json({ fromImage: "127.0.0.1:1/x:y", steps }));
  const st = await waitStatus(a.templateID, a.buildID, ["error"]);
  expect(st.reason.step).toBe("2");
  expect(st.reason.message).toContain("never uploaded");
});

test("tags, aliases and delete", async () => {
  const a = await J(api(node, "/v3/templates", json({ name: "tagged", tags: ["one", "two"] })));
  // no ready build to point a tag at
  const assign = await api(node, "/templates/tags", json({ target: "tagged", tags: ["three"] }));
  expect(assign.status).toBe(400);
  expect((await J(assign)).error_code).toBe("template.not_ready");
  const del = await api(node, "/templates/tags", { method: "DELETE", body: JSON.stringify({ name: "tagged", tags: ["one"] }) });
  expect(del.status).toBe(204);
  expect((await J(api(node, `/templates/${a.templateID}/tags`))).map((x: any) => x.tag)).toEqual(["two"]);
  expect((await api(node, "/templates/tags", { method: "DELETE", body: JSON.stringify({ name: "tagged", tags: ["nope"] }) })).status).toBe(404);
  expect((await api(node, "/templates/aliases/nosuch")).status).toBe(404);
  expect((await api(node, `/templates/${a.templateID}`, { method: "DELETE" })).status).toBe(204);
  expect((await api(node, "/templates/aliases/tagged")).status).toBe(404);
  expect((await api(node, `/templates/${a.templateID}`)).status).toBe(404);
  expect((await api(node, `/templates/${a.templateID}`, { method: "DELETE" })).status).toBe(404);
  expect(existsSync(join(node.home, "catalog", "templates", `${a.templateID}.json`))).toBe(false);
});

test("a build registered and then interrupted by a node restart reads error after it", async () => {
  const a = await J(api(node, "/v3/templates", json({ name: "restart-me" })));
  // mark it building as a running build would, then restart the node on the same home
  const f = join(node.home, "catalog", "templates", `${a.templateID}.json`);
  const rec = JSON.parse(await Bun.file(f).text());
  rec.builds[0].status = "building";
  await Bun.write(f, JSON.stringify(rec));
  const home = node.home;
  await node.close();
  node = await startNodeNoVm({}, home);
  const st = await J(api(node, `/templates/${a.templateID}/builds/${a.buildID}/status`));
  expect(st.status).toBe("error");
  expect(st.reason.message).toContain("restarted");
});

test("CLI: template build --dockerfile streams the log and fails naming an unsupported instruction; template rm", async () => {
  const dir = require("node:fs").mkdtempSync(join(require("node:os").tmpdir(), "aenv-df-"));
  try {
    require("node:fs").mkdirSync(join(dir, "app"));
    require("node:fs").writeFileSync(join(dir, "app", "a.txt"), "a\n");
    require("node:fs").writeFileSync(join(dir, "Dockerfile"), "FROM 127.0.0.1:1/x:y\nCOPY app/ /opt/app/\nHEALTHCHECK CMD true\nRUN true\n");
    // async: the node answers from this very process
    const cli = async (...args: string[]) => {
      const p = Bun.spawn([process.execPath, join(import.meta.dir, "../../src/cli/main.ts"), "template", ...args, "--url", node.url, "--key", node.apiKey], { stdout: "pipe", stderr: "pipe", env: { ...process.env, AENV_LOG_LEVEL: "error" } });
      const [stdout, stderr, exitCode] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
      return { stdout, stderr, exitCode };
    };
    const r = await cli("build", "--dockerfile", join(dir, "Dockerfile"), "--name", "from-cli");
    const err = r.stderr;
    expect(r.exitCode).toBe(1);
    // the COPY's files were uploaded before the build started, then the build failed at step 4
    // (USER root and WORKDIR / come first, as the SDK prepends them)
    expect(err).toMatch(/\[\s*\d+\.\ds\] uploading COPY app\/ \(/);
    expect(err).toContain("error: build failed at step 4: step 4: HEALTHCHECK is not supported");
    expect(readdirSync(join(node.home, "catalog", "files")).filter((f) => f.endsWith(".tar")).length).toBeGreaterThan(0);
    const list = await cli("list", "--json");
    expect(JSON.parse(list.stdout).find((t: any) => t.aliases.includes("from-cli")).buildStatus).toBe("error");
    expect((await cli("rm", "from-cli")).exitCode).toBe(0);
    expect((await api(node, "/templates/aliases/from-cli")).status).toBe(404);
    const missing = await cli("rm", "from-cli");
    expect(missing.exitCode).toBe(1);
    expect(missing.stderr).toContain("404");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 60_000);
