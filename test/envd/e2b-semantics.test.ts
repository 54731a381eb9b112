/**
 * envd semantics it used to differ from E2B's on (issue 29), through the unmodified e2b@2.51.0
 * SDK against a real envd child process (`bun src/cli/main.ts envd`, initialised as the node does
 * it: default user `user`, default workdir /home/user, an access token): a relative path resolves
 * against the home of the user the request acts as (files, signed URLs, cwd), the default workdir
 * stands only for an empty path; an expired signed URL is 401 "signature is already expired";
 * `commands.kill` returns once the process is gone from the process table. A stub API answers the
 * SDK's create only (it learns the envd URL and token from it).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, readFileSync, rmSync } from "node:fs";
import { Sandbox } from "e2b";
import { ENVD_VERSION } from "../../src/envd/version.ts";
import { ensureUserAccount, initEnvd, procState, startEnvdChild, type EnvdChild } from "./harness.ts";

const TOKEN = "b".repeat(24) + "0123456789abcdef";
const NAME = `h29-rel-${process.pid}`;
let envd: EnvdChild;
let api: ReturnType<typeof Bun.serve>;
let sbx: Sandbox;

beforeAll(async () => {
  ensureUserAccount();
  envd = await startEnvdChild();
  expect((await initEnvd(envd.url, { accessToken: TOKEN, defaultUser: "user", defaultWorkdir: "/home/user" })).status).toBe(204);
  const body = { sandboxID: "sbxsemantics", templateID: "base", clientID: "6532622b", envdVersion: ENVD_VERSION, envdAccessToken: TOKEN };
  api = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch: (req) => (req.method === "POST" && new URL(req.url).pathname === "/v2/sandboxes" ? Response.json(body, { status: 201 }) : Response.json({ code: 404, message: "stub" }, { status: 404 })),
  });
  sbx = await Sandbox.create({ apiKey: "e2b_0123456789abcdef", apiUrl: `http://127.0.0.1:${api.port}`, sandboxUrl: envd.url, requestTimeoutMs: 20_000 });
}, 30_000);

afterAll(async () => {
  for (const d of ["/root", "/home/user"]) for (const f of [NAME, `${NAME}.signed`]) rmSync(`${d}/${f}`, { force: true });
  rmSync(`/root/${NAME}.d`, { recursive: true, force: true });
  await envd?.stop();
  api?.stop(true);
});

test("a relative path is the acting user's home's (root: /root), for files, signed URLs and cwd; the default workdir stands for an empty path only", async () => {
  await sbx.files.write(NAME, "as root", { user: "root" });
  await sbx.files.write(NAME, "as user", { user: "user" });
  expect(readFileSync(`/root/${NAME}`, "utf8")).toBe("as root");
  expect(readFileSync(`/home/user/${NAME}`, "utf8")).toBe("as user");
  expect(await sbx.files.read(NAME, { user: "root" })).toBe("as root");
  expect(await sbx.files.exists(NAME, { user: "root" })).toBe(true);
  // signed URLs carry the path as given and resolve it the same way
  const up = await sbx.uploadUrl(`${NAME}.signed`, { user: "root" });
  const form = new FormData();
  form.append("file", new Blob(["signed as root"]), "ignored");
  const res = await fetch(up, { method: "POST", body: form });
  expect(res.status).toBe(200);
  expect(((await res.json()) as { path: string }[])[0]!.path).toBe(`/root/${NAME}.signed`);
  expect(await (await fetch(await sbx.downloadUrl(`${NAME}.signed`, { user: "root" }))).text()).toBe("signed as root");
  // cwd: none is the default workdir; a relative one is under the user's home
  await sbx.files.makeDir(`${NAME}.d`, { user: "root" });
  expect(existsSync(`/root/${NAME}.d`)).toBe(true);
  expect((await sbx.commands.run("pwd", { user: "root" })).stdout).toBe("/home/user\n");
  expect((await sbx.commands.run("pwd", { user: "root", cwd: `${NAME}.d` })).stdout).toBe(`/root/${NAME}.d\n`);
});

test("an expired signed URL is 401 with E2B envd's words", async () => {
  await sbx.files.write(`/home/user/${NAME}`, "x");
  const old = await sbx.downloadUrl(`/home/user/${NAME}`, { user: "user", useSignatureExpiration: -10 });
  const r = await fetch(old);
  expect(r.status).toBe(401);
  expect(((await r.json()) as { message: string }).message).toBe("signature is already expired");
  const fresh = await sbx.downloadUrl(`/home/user/${NAME}`, { user: "user", useSignatureExpiration: 60 });
  expect(await (await fetch(fresh)).text()).toBe("x");
});

test("commands.kill returns once the process is gone from the process table (20 runs)", async () => {
  const gone: boolean[] = [];
  for (let i = 0; i < 20; i++) {
    const h = await sbx.commands.run("sleep 300", { background: true });
    expect(procState(h.pid)).toMatch(/^[RSD]$/);
    expect(await sbx.commands.kill(h.pid)).toBe(true);
    // at once, no wait: `kill -0 <pid>` in the guest would fail now
    gone.push(procState(h.pid) === undefined);
    await h.wait().catch(() => {});
  }
  expect(gone).toEqual(Array.from({ length: 20 }, () => true));
});
