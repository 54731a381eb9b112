/**
 * Registry trust and credentials with real parts: Debian's docker-registry behind TLS (a
 * certificate signed by a throw-away openssl CA, for an address that is not loopback, so TLS is
 * verified) and htpasswd basic auth, in a network namespace this test makes; the pulls run there
 * too (./fixtures/pull-in-netns.ts, the node's settings path). The CA comes from `[image] ca_path`
 * (a file or a directory), the credentials from `[image] auth_file` (a Docker config.json) or
 * from the build (the SDK's fromImage(ref, {username, password})); a wrong password is a clear
 * `image.auth`; no password shows in any progress line (the build log), error or log line of the
 * pulling process (pino at debug). Identity tokens: a registry with token auth on loopback whose
 * token server accepts an OAuth2 refresh-token grant, the token from the auth file.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { plainRegistrySettings, pullImage } from "../../src/image/index.ts";
import { TestNet } from "./netns.ts";
import { makeTestCa, pushImage, startRegistry, type TestRegistry } from "./registry.ts";

const ADDR = "10.233.0.1";
const creds = { username: "alice", password: "pw-Zq7-never-logged" };
const wrong = "wrong-pw-Xk3-never-logged";
const b64 = (s: string) => Buffer.from(s).toString("base64");

const net = new TestNet();
let ns: string;
let reg: TestRegistry;
let tokenReg: TestRegistry;
let work: string;
let ca: { ca: string; cert: string; key: string };
let digest: string;
let tokenDigest: string;

function authFile(name: string, entries: Record<string, unknown>): string {
  const p = join(work, name);
  writeFileSync(p, JSON.stringify({ auths: entries }));
  return p;
}

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), "aenv-trust-"));
  ns = net.netns("t", [`${ADDR}/32`]);
  ca = makeTestCa(work, [ADDR]);
  reg = await startRegistry({ netns: ns, addr: ADDR, tls: { cert: ca.cert, key: ca.key }, auth: creds });
  const l = join(work, "l");
  mkdirSync(join(l, "etc"), { recursive: true });
  writeFileSync(join(l, "etc/private"), "from the private registry\n");
  const img = await pushImage(reg.host, "private/app:v1", [{ dir: l, compression: "gzip" }], {}, creds, ns);
  digest = img.digest;
  rmSync(img.dir, { recursive: true, force: true });
  tokenReg = await startRegistry({ auth: creds, token: true, identityToken: "idtok-Hq2-never-logged" });
  const t = await pushImage(tokenReg.host, "private/app:v1", [{ dir: l, compression: "gzip" }], {}, creds);
  tokenDigest = t.digest;
  rmSync(t.dir, { recursive: true, force: true });
}, 90_000);

afterAll(async () => {
  await reg?.stop();
  await tokenReg?.stop();
  net.dispose();
  rmSync(work, { recursive: true, force: true });
});

let homes = 0;
const home = () => join(work, `home${++homes}`);
const ref = () => `${reg.host}/private/app:v1`;

/** Every secret given: none may show in the pull's output or its process's log. */
function expectNoSecret(r: { progress: string[]; stderr: string; error?: unknown }): void {
  const text = JSON.stringify(r.progress) + JSON.stringify(r.error ?? null) + r.stderr;
  for (const s of [creds.password, wrong, b64(`${creds.username}:${creds.password}`), b64(`${creds.username}:${wrong}`)]) expect([s, text.includes(s)]).toEqual([s, false]);
}

test("TLS with a private CA: refused without ca_path (image.tls, saying so); with it the credentials are asked for (image.auth)", async () => {
  const noCa = await net.pull(ns, { home: home(), ref: ref() });
  expect(noCa.error?.code).toBe("image.tls");
  expect(noCa.error?.message).toContain("[image] ca_path");
  const noCreds = await net.pull(ns, { home: home(), ref: ref(), image: { ca_path: ca.ca } });
  expect(noCreds.error?.code).toBe("image.auth");
}, 120_000);

test("basic auth from auth_file (a Docker config.json key with scheme), the CA from a file or a directory", async () => {
  const file = authFile("ok.json", { [`https://${reg.host}`]: { auth: b64(`${creds.username}:${creds.password}`) }, "other.example": { auth: b64("x:y") } });
  const r = await net.pull(ns, { home: home(), ref: ref(), image: { ca_path: ca.ca, auth_file: file } });
  expect(r.error).toBeUndefined();
  expect(r.digest).toBe(digest);
  expectNoSecret(r);
  const dir = join(work, "cas");
  mkdirSync(dir);
  copyFileSync(ca.ca, join(dir, "corp-root.crt"));
  writeFileSync(join(dir, "README"), "not a certificate\n");
  const viaDir = await net.pull(ns, { home: home(), ref: ref(), image: { ca_path: dir, auth_file: file } });
  expect(viaDir.digest).toBe(digest);
}, 120_000);

test("a wrong password is a clear image.auth; the build's own credentials win over the auth file's; no password in any line", async () => {
  const bad = authFile("bad.json", { [reg.host]: { username: creds.username, password: wrong } });
  const r = await net.pull(ns, { home: home(), ref: ref(), image: { ca_path: ca.ca, auth_file: bad } });
  expect(r.ok).toBe(false);
  expect(r.error?.code).toBe("image.auth");
  expect(r.error?.message).toBe(`registry ${reg.host} refused access to ${ref()}: Error parsing image name "docker://${ref()}": reading manifest v1 in ${reg.host}/private/app: unauthorized: authentication required`);
  expect(r.stderr).toContain('"msg":"pull failed"'); // the log was written (at debug), and holds no secret
  expectNoSecret(r);
  // the SDK's per-build credentials, wrong then right, over the file's wrong ones
  const buildWrong = await net.pull(ns, { home: home(), ref: ref(), image: { ca_path: ca.ca, auth_file: bad }, credentials: { username: creds.username, password: wrong } });
  expect(buildWrong.error?.code).toBe("image.auth");
  expectNoSecret(buildWrong);
  const buildRight = await net.pull(ns, { home: home(), ref: ref(), image: { ca_path: ca.ca, auth_file: bad }, credentials: creds });
  expect(buildRight.digest).toBe(digest);
  expectNoSecret(buildRight);
}, 120_000);

test("an unreadable auth_file is image.bad_config naming it, never quoting it", async () => {
  const f = join(work, "broken.json");
  writeFileSync(f, `{"auths": {"${reg.host}": {"auth": "${b64(`${creds.username}:${creds.password}`)}"`);
  const r = await net.pull(ns, { home: home(), ref: ref(), image: { ca_path: ca.ca, auth_file: f } });
  expect(r.error).toEqual({ code: "image.bad_config", message: `[image] auth_file ${f}: not valid JSON`, details: { key: "image.auth_file", path: f } });
  expectNoSecret(r);
}, 60_000);

test("identity token (Docker's identitytoken): exchanged at the token server as an OAuth2 refresh token", async () => {
  const file = authFile("idtok.json", { [tokenReg.host]: { auth: b64("<token>:"), identitytoken: "idtok-Hq2-never-logged" } });
  const before = tokenReg.tokenRequests;
  const lines: string[] = [];
  const p = await pullImage({ homePath: home(), ref: `${tokenReg.host}/private/app:v1`, registries: plainRegistrySettings({ authFile: file }), headroomMiB: 16, minDiskMiB: 32, toolTimeoutMs: 120_000, manifestTimeoutMs: 20_000, onProgress: (l) => lines.push(l) });
  expect(p.digest).toBe(tokenDigest);
  expect(tokenReg.tokenRequests).toBeGreaterThan(before);
  expect(lines.join("\n")).not.toContain("idtok-Hq2");
  // a wrong identity token is refused
  const badFile = authFile("idtok-bad.json", { [tokenReg.host]: { auth: b64("<token>:"), identitytoken: "not-the-token" } });
  await expect(pullImage({ homePath: home(), ref: `${tokenReg.host}/private/app:v1`, registries: plainRegistrySettings({ authFile: badFile }), headroomMiB: 16, minDiskMiB: 32, toolTimeoutMs: 120_000, manifestTimeoutMs: 20_000 })).rejects.toMatchObject({ code: "image.auth" });
}, 120_000);
