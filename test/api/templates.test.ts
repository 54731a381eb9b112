/**
 * Template build routes on a real node (SQLite, orchestrator, API listener; no VM is booted):
 * v3 registration, rebuild keeping the template id, names and tags, the files/upload flow with
 * its self-authorising URL, builds that fail before any VM (unknown registry, a layer whose digest
 * does not match and a registry refusing credentials — Debian's docker-registry on 127.0.0.1 —,
 * unsupported step, files never uploaded) ending in `error` with the step named and nothing half
 * made, status log paging, aliases,
 * tags (moved to a build when it is ready), delete; builds that need no VM (ENV steps over a
 * build-base template) ending ready; a registry that never answers; the build queue; a log or
 * status that cannot be written; a node killed mid-build and started again.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pushImage, registryBlobPath, startRegistry } from "../image/registry.ts";
import { api, startNodeNoVm, testPrefix, type TestNode } from "./helpers.ts";
import { waitFor } from "../helpers/wait.ts";

const MAX_UPLOAD = 4 * 1048576;
let node: TestNode;
// these nodes boot no VM: builds end in their disk layers, with no snapshot (test/e2e/template.test.ts
// has builds that end in one)
const NO_SNAPSHOT = { AENV__template_build__snapshot: "false" };
beforeAll(async () => {
  node = await startNodeNoVm({ ...NO_SNAPSHOT, AENV__template_build__max_upload_bytes: String(MAX_UPLOAD), AENV__template_build__manifest_timeout_ms: "5000" });
  legacyBase(node.home);
});
afterAll(async () => {
  await node?.dispose();
});

/**
 * A `build-base` template named base in `home` (its manifest only: builds of ENV steps over it
 * need no VM and no disk, they end ready with its layer as their lowest).
 */
function legacyBase(home: string): void {
  mkdirSync(join(home, "templates", "base"), { recursive: true });
  const m = { name: "base", rootfs: "rootfs.ext4", layers: ["rootfs-k-1.layer"], bootArgs: "", diskBytes: 1 << 30, buildKey: "k", createdAt: new Date().toISOString() };
  writeFileSync(join(home, "templates", "base", "manifest.json"), JSON.stringify(m));
}

/** A TCP server on 127.0.0.1 that accepts and never answers (a registry that hangs). */
function silentRegistry() {
  return Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
}

/** JSON body of a response (tests read loosely typed bodies). */
const J = async (p: Promise<Response> | Response): Promise<any> => (await p).json();
const json = (body: unknown) => ({ method: "POST", body: JSON.stringify(body) });

/** The status of build `bid` once it is one of `want` (polled; at most 30 s). */
function waitStatus(tid: string, bid: string, want: string[]): Promise<any> {
  return waitFor(`build ${bid} to reach ${want.join(" or ")}`, async () => {
    const s = await J(api(node, `/templates/${tid}/builds/${bid}/status`));
    return want.includes(s.status) && s;
  }, { timeoutMs: 30_000 });
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
  // tags point at builds once they are ready: none yet
  expect(await J(api(node, `/templates/${a.templateID}/tags`))).toEqual([]);
  const alias = await api(node, "/templates/aliases/my-app");
  expect(alias.status).toBe(200);
  expect(await J(alias)).toEqual({ templateID: a.templateID, public: false });
  const listed = (await J(api(node, "/templates"))).find((x: any) => x.templateID === a.templateID);
  expect(listed).toMatchObject({ aliases: ["my-app"], buildStatus: "waiting" });
});

test("bad names, bad sizes, unknown builds and a second start are refused with typed errors", async () => {
  // above [orchestrator] max_cpu_count / max_memory_mb (defaults 32 / 16384) too
  for (const body of [{ name: "Bad Name" }, { name: "ok:bad tag" }, {}, { name: "x", cpuCount: 0 }, { name: "x", memoryMB: 64 }, { name: "x", memoryMB: 16385 }, { name: "x", cpuCount: 33 }]) {
    const r = await api(node, "/v3/templates", json(body));
    expect(r.status).toBe(400);
    expect((await J(r)).code).toBe(400);
  }
  const a = await J(api(node, "/v3/templates", json({ name: "twice" })));
  // another template's id is not a name: no build is added to that template
  const byId = await api(node, "/v3/templates", json({ name: a.templateID }));
  expect(byId.status).toBe(400);
  expect((await J(byId)).error_code).toBe("template.bad_name");
  expect((await J(api(node, `/templates/${a.templateID}`))).builds).toHaveLength(1);
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
  expect(up.url.startsWith(`${node.url}/upload/template-files/${hash}?template=${a.templateID}&expires=`)).toBe(true);
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
  // the URL is for one template: another template's id in it breaks the token
  const other = await J(api(node, "/v3/templates", json({ name: "other-files" })));
  expect((await fetch(up.url.replace(`template=${a.templateID}`, `template=${other.templateID}`), { method: "PUT", body })).status).toBe(403);
  // an archive once stored is never replaced (builds of other templates may use it)
  const replace = await fetch(again.url, { method: "PUT", body: new Uint8Array(100).fill(9) });
  expect(replace.status).toBe(201);
  expect(new Uint8Array(await Bun.file(join(node.home, "catalog", "files", `${hash}.tar`)).arrayBuffer())).toEqual(body);
  expect(readdirSync(join(node.home, "catalog", "files")).filter((f) => f.endsWith(".tmp"))).toEqual([]);
  expect((await api(node, `/templates/${a.templateID}/files/not-a-hash`)).status).toBe(400);
  // above [template_build] max_upload_bytes: 413, nothing stored, no temporary file left
  const big = "cd".repeat(32);
  const upBig = await J(api(node, `/templates/${a.templateID}/files/${big}`));
  const tooLarge = await fetch(upBig.url, { method: "PUT", body: new Uint8Array(MAX_UPLOAD + 1) });
  expect(tooLarge.status).toBe(413);
  expect((await J(tooLarge)).error_code).toBe("template.upload_too_large");
  expect(readdirSync(join(node.home, "catalog", "files")).filter((f) => f.startsWith(big) || f.endsWith(".tmp"))).toEqual([]);
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

test("a layer whose digest does not match, and a registry refusing the credentials (401), end the build in error at base with the image's code; nothing half made", async () => {
  const creds = { username: "alice", password: "s3cret" };
  const plain = await startRegistry();
  const locked = await startRegistry({ auth: creds });
  const work = mkdtempSync(join(tmpdir(), "aenv-tplreg-"));
  try {
    writeFileSync(join(work, "file"), "x".repeat(100_000));
    // the registry serves a layer blob with one byte flipped (same size): its digest no longer matches
    const img = await pushImage(plain.host, "test/corrupt:v1", [{ dir: work, compression: "gzip" }]);
    const m = JSON.parse(readFileSync(join(img.dir, "manifest.json"), "utf8")) as { layers: { digest: string }[] };
    const blob = registryBlobPath(plain, m.layers[0]!.digest);
    const bytes = new Uint8Array(await Bun.file(blob).arrayBuffer());
    bytes[bytes.length - 20]! ^= 0xff;
    writeFileSync(blob, bytes);
    rmSync(img.dir, { recursive: true, force: true });
    rmSync((await pushImage(locked.host, "private/tiny:v1", [{ dir: work, compression: "gzip" }], {}, creds)).dir, { recursive: true, force: true });
    const list = (d: string) => (existsSync(join(node.home, d)) ? readdirSync(join(node.home, d)).sort() : []);
    const before = { images: list("images"), layers: list("catalog/layers"), steps: list("catalog/steps") };
    const build = async (name: string, body: Record<string, unknown>) => {
      const a = await J(api(node, "/v3/templates", json({ name })));
      expect((await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json({ ...body, steps: [{ type: "RUN", args: ["echo never"] }] }))).status).toBe(202);
      return waitStatus(a.templateID, a.buildID, ["error", "ready"]);
    };
    const corrupt = await build("corrupt-layer", { fromImage: `${plain.host}/test/corrupt:v1` });
    expect(corrupt.status).toBe("error");
    expect(corrupt.reason).toMatchObject({ step: "base", code: "image.digest_mismatch" });
    expect(corrupt.reason.message).toStartWith(`base image ${plain.host}/test/corrupt:v1: a blob of ${plain.host}/test/corrupt:v1 does not match its digest: `);
    for (const registry of [{ type: "registry", ...creds, password: "wrong" }, undefined]) {
      const denied = await build("wrong-creds", { fromImage: `${locked.host}/private/tiny:v1`, ...(registry ? { fromImageRegistry: registry } : {}) });
      expect(denied.status).toBe("error");
      expect(denied.reason).toMatchObject({ step: "base", code: "image.auth" });
      expect(denied.reason.message).toStartWith(`base image ${locked.host}/private/tiny:v1: `);
      // the step never ran; the log ends in the error
      expect(denied.logEntries.some((l: { message: string }) => l.message.includes("echo never"))).toBe(false);
      expect(denied.logEntries.at(-1).level).toBe("error");
    }
    // nothing half made: no image in the cache, no pull work dir (.pull-*), no layer, no step entry
    expect({ images: list("images"), layers: list("catalog/layers"), steps: list("catalog/steps") }).toEqual(before);
    expect(before.images.filter((f) => f.startsWith(".pull-"))).toEqual([]);
    // the registry with the right credentials is not the problem: the same image pulls (pull.test.ts covers the content)
    const ok = await build("right-creds", { fromImage: `${locked.host}/private/tiny:v1`, fromImageRegistry: { type: "registry", ...creds } });
    expect(ok.logEntries.some((l: { message: string }) => l.message.startsWith("[builder 1/1] RUN echo never"))).toBe(true);
    expect(ok.reason.step).toBe("1"); // it got past base; this node boots no VM for the step
  } finally {
    await plain.stop();
    await locked.stop();
    rmSync(work, { recursive: true, force: true });
  }
}, 120_000);

test("COPY of files never uploaded fails the build at that step", async () => {
  const a = await J(api(node, "/v3/templates", json({ name: "copy-missing" })));
  const steps = [{ type: "RUN", args: ["true"] }, { type: "COPY", args: ["app/", "/opt/app/"], filesHash: "cd".repeat(32) }];
  await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json({ fromImage: "127.0.0.1:1/x:y", steps }));
  const st = await waitStatus(a.templateID, a.buildID, ["error"]);
  expect(st.reason.step).toBe("2");
  expect(st.reason.message).toContain("never uploaded");
});

test("tags move to a build when it is ready: a failed rebuild leaves name and name:tag where they were", async () => {
  const build = async (name: string, body: unknown, tags?: string[]) => {
    const r = await J(api(node, "/v3/templates", json({ name, ...(tags ? { tags } : {}) })));
    expect((await api(node, `/v2/templates/${r.templateID}/builds/${r.buildID}`, json(body))).status).toBe(202);
    return { ...r, st: await waitStatus(r.templateID, r.buildID, ["ready", "error"]) };
  };
  const tagsOf = async (id: string) => (await J(api(node, `/templates/${id}/tags`))).map((x: any) => [x.tag, x.buildID]);
  const env = (v: string) => ({ fromTemplate: "base", steps: [{ type: "ENV", args: ["V", v] }] });
  const b1 = await build("tagged", env("1"), ["one", "two"]);
  expect(b1.st.status).toBe("ready");
  expect(await tagsOf(b1.templateID)).toEqual([["one", b1.buildID], ["two", b1.buildID]]);
  const b2 = await build("tagged", env("2"));
  expect(b2.st.status).toBe("ready");
  expect(await tagsOf(b1.templateID)).toEqual([["default", b2.buildID], ["one", b1.buildID], ["two", b1.buildID]]);
  // a failing rebuild under default and a new tag: neither moves
  const b3 = await build("tagged:v3", { fromTemplate: "base", steps: [{ type: "HEALTHCHECK", args: ["x"] }] }, ["default"]);
  expect(b3.st.status).toBe("error");
  expect(await tagsOf(b1.templateID)).toEqual([["default", b2.buildID], ["one", b1.buildID], ["two", b1.buildID]]);
  const assign = await api(node, "/templates/tags", json({ target: "tagged:v3", tags: ["three"] }));
  expect(assign.status).toBe(400);
  expect((await J(assign)).error_code).toBe("template.not_ready");
  // name alone = the default tag's build
  expect((await api(node, "/templates/tags", json({ target: "tagged", tags: ["three"] }))).status).toBe(201);
  expect(await tagsOf(b1.templateID)).toEqual([["default", b2.buildID], ["one", b1.buildID], ["three", b2.buildID], ["two", b1.buildID]]);
  // the ready builds stack on base's layer
  const rec = JSON.parse(await Bun.file(join(node.home, "catalog", "templates", `${b1.templateID}.json`)).text());
  expect(rec.builds[0].boot).toMatchObject({ layers: ["templates/base/rootfs-k-1.layer"], envs: { V: "1" } });
  expect(rec.builds[2].reason).toMatchObject({ step: "1", code: "template.unsupported_step" });
});

test("tags, aliases and delete", async () => {
  const a = await J(api(node, "/v3/templates", json({ name: "tagged2", tags: ["one", "two"] })));
  await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json({ fromTemplate: "base", steps: [{ type: "ENV", args: ["A", "1"] }] }));
  await waitStatus(a.templateID, a.buildID, ["ready"]);
  const del = await api(node, "/templates/tags", { method: "DELETE", body: JSON.stringify({ name: "tagged2", tags: ["one"] }) });
  expect(del.status).toBe(204);
  expect((await J(api(node, `/templates/${a.templateID}/tags`))).map((x: any) => x.tag)).toEqual(["two"]);
  expect((await api(node, "/templates/tags", { method: "DELETE", body: JSON.stringify({ name: "tagged2", tags: ["nope"] }) })).status).toBe(404);
  expect((await api(node, "/templates/aliases/nosuch")).status).toBe(404);
  expect((await api(node, `/templates/${a.templateID}`, { method: "DELETE" })).status).toBe(204);
  expect((await api(node, "/templates/aliases/tagged2")).status).toBe(404);
  expect((await api(node, `/templates/${a.templateID}`)).status).toBe(404);
  expect((await api(node, `/templates/${a.templateID}`, { method: "DELETE" })).status).toBe(404);
  expect(existsSync(join(node.home, "catalog", "templates", `${a.templateID}.json`))).toBe(false);
  expect(existsSync(join(node.home, "catalog", "logs", `${a.buildID}.jsonl`))).toBe(false);
});

test("a registry that accepts and never answers fails the build at base after manifest_timeout_ms (image.timeout)", async () => {
  const silent = silentRegistry();
  try {
    const a = await J(api(node, "/v3/templates", json({ name: "hangs" })));
    await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json({ fromImage: `127.0.0.1:${silent.port}/x/y:v1` }));
    const st = await waitStatus(a.templateID, a.buildID, ["error"]);
    expect(st.reason).toMatchObject({ step: "base", code: "image.timeout" });
    expect(st.reason.message).toContain("took longer than 5000 ms");
  } finally {
    silent.stop(true);
  }
}, 60_000);

test("builds queue for max_concurrent_builds (1); a build whose status cannot be saved reads error, not building", async () => {
  const silent = silentRegistry();
  try {
    const y = await J(api(node, "/v3/templates", json({ name: "slot-holder" })));
    const x = await J(api(node, "/v3/templates", json({ name: "queued" })));
    await api(node, `/v2/templates/${y.templateID}/builds/${y.buildID}`, json({ fromImage: `127.0.0.1:${silent.port}/x/y:v1` }));
    await waitStatus(y.templateID, y.buildID, ["building"]);
    await api(node, `/v2/templates/${x.templateID}/builds/${x.buildID}`, json({ fromTemplate: "base", steps: [{ type: "ENV", args: ["A", "1"] }] }));
    const queued = await J(api(node, `/templates/${x.templateID}/builds/${x.buildID}/status`));
    expect(queued.status).toBe("waiting");
    expect((await J(api(node, `/templates/${y.templateID}/builds/${y.buildID}/status`))).status).toBe("building");
    // the queued build's record can no longer be written (as on a full disk)
    mkdirSync(join(node.home, "catalog", "templates", `${x.templateID}.json.tmp`));
    // free the slot: the registry goes away
    silent.stop(true);
    expect((await waitStatus(y.templateID, y.buildID, ["error"])).reason.step).toBe("base");
    const st = await waitStatus(x.templateID, x.buildID, ["error", "ready"]);
    expect(st.status).toBe("error");
    rmSync(join(node.home, "catalog", "templates", `${x.templateID}.json.tmp`), { recursive: true });
  } finally {
    silent.stop(true);
  }
}, 60_000);

test("a build whose log cannot be written still runs to its end", async () => {
  const a = await J(api(node, "/v3/templates", json({ name: "no-log" })));
  // the log file is a directory: every append fails (EISDIR), as on a full disk
  mkdirSync(join(node.home, "catalog", "logs", `${a.buildID}.jsonl`));
  await api(node, `/v2/templates/${a.templateID}/builds/${a.buildID}`, json({ fromTemplate: "base", steps: [{ type: "ENV", args: ["A", "1"] }] }));
  const st = await waitStatus(a.templateID, a.buildID, ["ready", "error"]);
  expect(st.status).toBe("ready");
  expect(st.logEntries).toEqual([]);
});

test("build logs past log_max_bytes end in one truncation line; only errors follow", async () => {
  const { BuildLogs } = await import("../../src/template/index.ts");
  const dir = join(node.home, "log-limit");
  const logs = new BuildLogs(dir, 4096);
  const id = "00000000-0000-4000-8000-000000000001";
  const line = (i: number, level: "info" | "error" = "info") => ({ timestamp: new Date(1000 * i).toISOString(), level, message: `line ${i} ${"x".repeat(100)}` });
  for (let i = 0; i < 100; i++) logs.append(id, [line(i)]);
  logs.append(id, [line(100, "error")]);
  const all = logs.all(id);
  const trunc = all.findIndex((e) => e.message.startsWith("log truncated: more than 4096 bytes"));
  expect(trunc).toBeGreaterThan(20);
  expect(all.slice(trunc + 1).map((e) => e.level)).toEqual(["error"]);
  expect(Bun.file(join(dir, `${id}.jsonl`)).size).toBeLessThan(4096 + 512);
  // read by offset = the same entries as the whole; a torn last line (a crash mid-write) is skipped
  expect(logs.read(id, 5, 3)).toEqual(all.slice(5, 8));
  require("node:fs").appendFileSync(join(dir, `${id}.jsonl`), '{"timestamp":"x","lev');
  const again = new BuildLogs(dir, 4096);
  expect(again.all(id)).toEqual(all);
  expect(again.errors(id).map((e) => e.message)).toEqual([all.at(-1)!.message]);
  again.append(id, [line(101, "error")]);
  expect(new BuildLogs(dir, 4096).all(id).at(-1)!.message).toBe(line(101).message);
});

test("a node killed (SIGKILL) mid-build: at the next start the running and the queued build read error, a registered one stays waiting", async () => {
  const silent = silentRegistry();
  const home = require("node:fs").mkdtempSync(join(require("node:os").tmpdir(), "aenv-kill-"));
  legacyBase(home);
  const prefix = testPrefix();
  const child = Bun.spawn(
    [process.execPath, join(import.meta.dir, "fixtures/hold-node.ts"), home, join(home, "run"), prefix, JSON.stringify({ AENV__template_build__manifest_timeout_ms: "600000" })],
    { stdout: "pipe", stderr: "inherit", env: { ...process.env, AENV_LOG_LEVEL: "error" } },
  );
  let again: TestNode | undefined;
  try {
    const reader = child.stdout.getReader();
    let buf = "";
    while (!buf.includes("\n")) buf += new TextDecoder().decode((await reader.read()).value);
    const held = JSON.parse(buf) as { url: string; key: string };
    const call = (path: string, body?: unknown) => fetch(held.url + path, { method: body ? "POST" : "GET", headers: { "x-api-key": held.key, "content-type": "application/json" }, body: body ? JSON.stringify(body) : undefined }).then((r) => r.json() as Promise<any>);
    const running = await call("/v3/templates", { name: "running" });
    const queued = await call("/v3/templates", { name: "queued" });
    const registered = await call("/v3/templates", { name: "registered" });
    await call(`/v2/templates/${running.templateID}/builds/${running.buildID}`, { fromImage: `127.0.0.1:${silent.port}/x/y:v1` });
    await waitFor("the running build to start", async () => (await call(`/templates/${running.templateID}/builds/${running.buildID}/status`)).status === "building", { timeoutMs: 12_000 });
    await call(`/v2/templates/${queued.templateID}/builds/${queued.buildID}`, { fromTemplate: "base", steps: [{ type: "ENV", args: ["A", "1"] }] });
    expect((await call(`/templates/${queued.templateID}/builds/${queued.buildID}/status`)).status).toBe("waiting");
    const skopeo = () => Bun.spawnSync(["pgrep", "-f", `skopeo inspect .*127.0.0.1:${silent.port}/`], { stdout: "pipe" }).stdout.toString().trim();
    expect(skopeo()).not.toBe("");
    child.kill("SIGKILL");
    await child.exited;
    // the node's skopeo dies with it (parent-death signal), nothing hangs on the dead registry
    await waitFor("the node's skopeo to die", () => skopeo() === "", { timeoutMs: 4000 });
    again = await startNodeNoVm({ AENV__network__name_prefix: prefix }, home);
    const status = async (r: any) => J(api(again!, `/templates/${r.templateID}/builds/${r.buildID}/status`));
    expect((await status(running)).status).toBe("error");
    expect((await status(running)).reason.message).toBe("the node restarted while this build ran");
    // its log ends saying so (what `template build` and the SDK show last)
    const logs = (await J(api(again!, `/templates/${running.templateID}/builds/${running.buildID}/status?logsOffset=0`))).logEntries as { level: string; message: string }[];
    expect(logs.at(-1)).toMatchObject({ level: "error", message: "build failed: the node restarted while this build ran" });
    expect((await status(queued)).status).toBe("error");
    expect((await status(queued)).reason.message).toBe("the node restarted before this queued build ran");
    expect((await status(registered)).status).toBe("waiting");
    // nothing of the interrupted pull is left
    expect(readdirSync(join(home, "images")).filter((f) => f.startsWith(".pull-"))).toEqual([]);
  } finally {
    child.kill("SIGKILL");
    silent.stop(true);
    await again?.dispose();
    rmSync(home, { recursive: true, force: true });
  }
}, 60_000);

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

test("CLI: template build --dockerfile FROM a template of the node builds on it (no registry asked: the base is in place, the first step runs); a reference with a registry host is the image", async () => {
  const dir = mkdtempSync(join(tmpdir(), "aenv-df-"));
  const cli = async (...args: string[]) => {
    const p = Bun.spawn([process.execPath, join(import.meta.dir, "../../src/cli/main.ts"), "template", ...args, "--url", node.url, "--key", node.apiKey], { stdout: "pipe", stderr: "pipe", env: { ...process.env, AENV_LOG_LEVEL: "error" } });
    const [stdout, stderr, exitCode] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
    return { stdout, stderr, exitCode };
  };
  try {
    // `base` is a build-base template of this node (and an image name on Docker Hub): the template
    writeFileSync(join(dir, "Dockerfile"), "FROM base\nENV GREETING=hi\n");
    const onTemplate = await cli("build", "--dockerfile", join(dir, "Dockerfile"), "--name", "on-base");
    expect(onTemplate.stderr).toContain("[base] FROM TEMPLATE base");
    expect(onTemplate.stderr).toContain("[base] base is a template of this node (FROM docker.io/library/base names the registry image)");
    // the base is in place; the Dockerfile's USER root step then needs a build VM, which this node has not
    expect([onTemplate.exitCode, onTemplate.stderr]).toEqual([1, expect.stringContaining("error: build failed at step 1: ")]);
    // with a registry host it is an image, whatever templates the node has
    writeFileSync(join(dir, "Dockerfile"), "FROM 127.0.0.1:1/base\nENV GREETING=hi\n");
    const onImage = await cli("build", "--dockerfile", join(dir, "Dockerfile"), "--name", "on-image");
    expect(onImage.exitCode).toBe(1);
    expect(onImage.stderr).toContain("[base] FROM 127.0.0.1:1/base");
    expect(onImage.stderr).toContain("error: build failed at step base: base image 127.0.0.1:1/base");
    expect(onImage.stderr).not.toContain("FROM TEMPLATE");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}, 60_000);

test("create of name:tag boots the tagged build; name alone the default tag's; an unknown tag is a 404", async () => {
  const n = await startNodeNoVm(NO_SNAPSHOT, undefined, {});
  try {
    legacyBase(n.home);
    const build = async (name: string, v: string) => {
      const r = await J(api(n, "/v3/templates", json({ name })));
      await api(n, `/v2/templates/${r.templateID}/builds/${r.buildID}`, json({ fromTemplate: "base", steps: [{ type: "ENV", args: ["V", v] }] }));
      await waitFor(`build ${r.buildID} ready`, async () => (await J(api(n, `/templates/${r.templateID}/builds/${r.buildID}/status`))).status === "ready", { timeoutMs: 12_000 });
      return r;
    };
    const one = await build("pinned:one", "1");
    const two = await build("pinned", "2");
    const create = (templateID: string) => api(n, "/sandboxes", json({ templateID, timeout: 60 }));
    const r1 = await create("pinned:one");
    expect(r1.status).toBe(201);
    expect((await J(r1)).templateID).toBe(one.templateID);
    expect(n.runtime!.started.at(-1)!.buildID).toBe(one.buildID);
    expect((await create("pinned")).status).toBe(201);
    expect(n.runtime!.started.at(-1)!.buildID).toBe(two.buildID);
    expect((await create(`${one.templateID}:default`)).status).toBe(201);
    expect(n.runtime!.started.at(-1)!.buildID).toBe(two.buildID);
    const missing = await create("pinned:nope");
    expect(missing.status).toBe(404);
    expect((await J(missing)).error_code).toBe("orchestrator.template_not_found");
  } finally {
    await n.dispose();
  }
});
