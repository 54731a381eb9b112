/**
 * overlaybd's lazy registry reads under the node's `[image]` settings, through `agentenv image
 * cat` of a config.v1.json with a remote lower: the blob URL names a registry nobody serves and
 * its mirror (Debian's docker-registry on 127.0.0.1, holding the real overlaybd layer fixture)
 * serves it; a mirror-only registry is never asked; an https:// blob on a loopback TLS server
 * with a certificate from a test CA is read only when `[image] ca_path` names the CA.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { blobCandidates, plainRegistrySettings } from "../../../src/image/index.ts";
import { makeTestCa, startRegistry, type TestRegistry } from "../../image/registry.ts";
import { HELLO, scratch, sha256 } from "./helpers.ts";

const tmp = scratch();
const blob = new Uint8Array(readFileSync(HELLO));
const digest = "sha256:" + createHash("sha256").update(blob).digest("hex");
const HELLO_SHA = "1ba9757892e20ff13d4dc47e72694349129a92f41f20b65010a4082f3261466c";
let reg: TestRegistry;
let tlsServer: ReturnType<typeof Bun.serve>;
let ca: { ca: string; cert: string; key: string };
let originHits = 0;
let origin: ReturnType<typeof Bun.serve>;

beforeAll(async () => {
  reg = await startRegistry();
  // monolithic blob upload (distribution's POST + PUT ?digest=)
  const start = await fetch(`http://${reg.host}/v2/mirrored/hello/blobs/uploads/`, { method: "POST" });
  const loc = new URL(start.headers.get("location")!, `http://${reg.host}`);
  loc.searchParams.set("digest", digest);
  const put = await fetch(loc, { method: "PUT", body: blob, headers: { "content-type": "application/octet-stream" } });
  if (put.status !== 201) throw new Error(`blob upload: ${put.status}`);
  // the "origin": counts requests, serves nothing
  origin = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => (originHits++, new Response("no", { status: 503 })) });
  ca = makeTestCa(tmp.dir, ["127.0.0.1"]);
  tlsServer = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    tls: { cert: readFileSync(ca.cert, "utf8"), key: readFileSync(ca.key, "utf8") },
    fetch(req) {
      const m = /bytes=(\d+)-(\d+)/.exec(req.headers.get("range") ?? "");
      if (!m) return new Response(blob);
      const [a, b] = [Number(m[1]), Math.min(Number(m[2]), blob.length - 1)];
      return new Response(blob.subarray(a, b + 1), { status: 206, headers: { "content-range": `bytes ${a}-${b}/${blob.length}` } });
    },
  });
}, 60_000);

afterAll(async () => {
  await reg?.stop();
  origin?.stop(true);
  tlsServer?.stop(true);
  tmp.cleanup();
});

async function cat(config: string, env: Record<string, string>): Promise<{ out: Uint8Array; err: string; code: number }> {
  const main = new URL("../../../src/cli/main.ts", import.meta.url).pathname;
  const p = Bun.spawn([process.execPath, main, "image", "cat", config, "--length", "4MiB"], { env: { ...process.env, AENV_LOG_LEVEL: "warn", AENV__overlaybd__registry_retries: "1", ...env }, stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(p.stdout).arrayBuffer(), new Response(p.stderr).text(), p.exited]);
  return { out: new Uint8Array(out), err, code };
}

test("blob URLs: mirrors first (path prefix kept, plain HTTP for loopback), then the URL itself unless mirror-only", () => {
  const url = `https://registry-1.docker.io/v2/library/ubuntu/blobs/${digest}`;
  const s = plainRegistrySettings({ mirrors: { "docker.io": ["127.0.0.1:5000", "harbor.example/hub"] } });
  expect(blobCandidates(url, s)).toEqual([`http://127.0.0.1:5000/v2/library/ubuntu/blobs/${digest}`, `https://harbor.example/v2/hub/library/ubuntu/blobs/${digest}`, url]);
  expect(blobCandidates(url, { ...s, mirrorOnly: ["docker.io"] })).toEqual([`http://127.0.0.1:5000/v2/library/ubuntu/blobs/${digest}`, `https://harbor.example/v2/hub/library/ubuntu/blobs/${digest}`]);
  expect(blobCandidates("https://x.example/not/a/blob", s)).toEqual(["https://x.example/not/a/blob"]);
});

test("a remote lower whose registry is mirror-only is read from its mirror; the registry is never asked", async () => {
  const originHost = `127.0.0.1:${origin.port}`;
  writeFileSync(tmp.path("mirrored.json"), JSON.stringify({ repoBlobUrl: `http://${originHost}/v2/mirrored/hello/blobs`, lowers: [{ digest, size: blob.length }] }));
  const ok = await cat(tmp.path("mirrored.json"), { [`AENV__image__registry_mirrors__${originHost}`]: reg.host, AENV__image__mirror_only: originHost });
  expect(ok.err).toBe("");
  expect(ok.code).toBe(0);
  expect(sha256(ok.out)).toBe(HELLO_SHA);
  expect(originHits).toBe(0);
  // not mirror-only, a dead mirror first: it falls through to the registry (which has nothing: 503)
  const dead = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const deadHost = `127.0.0.1:${dead.port}`;
  dead.stop(true);
  const fallthrough = await cat(tmp.path("mirrored.json"), { [`AENV__image__registry_mirrors__${originHost}`]: deadHost });
  expect(fallthrough.code).toBe(1);
  expect(originHits).toBeGreaterThan(0);
}, 60_000);

test("an https:// remote lower with a private CA: refused by default, read with [image] ca_path", async () => {
  writeFileSync(tmp.path("tls.json"), JSON.stringify({ repoBlobUrl: `https://127.0.0.1:${tlsServer.port}/v2/private/hello/blobs`, lowers: [{ digest, size: blob.length }] }));
  const refused = await cat(tmp.path("tls.json"), {});
  expect(refused.code).toBe(1);
  expect(refused.err).toMatch(/certificate|self.signed|UNABLE_TO_VERIFY|unknown/i);
  const ok = await cat(tmp.path("tls.json"), { AENV__image__ca_path: ca.ca });
  expect(ok.err).toBe("");
  expect(ok.code).toBe(0);
  expect(sha256(ok.out)).toBe(HELLO_SHA);
}, 60_000);
