/**
 * envd process lifecycle: SIGTERM to `agentenv envd` stops it cleanly, killing and reaping the
 * processes it started (no orphans left running). Real envd child, real processes.
 */
import { expect, test } from "bun:test";
import { ensureUserAccount, initEnvd, procState, startEnvdChild } from "./harness.ts";
import { waitFor } from "../helpers/wait.ts";

test("SIGTERM stops envd and takes its processes with it", async () => {
  const envd = await startEnvdChild();
  try {
    expect((await initEnvd(envd.url, { defaultUser: "root" })).status).toBe(204);
    const envelope = (msg: unknown) => {
      const b = Buffer.from(JSON.stringify(msg));
      const f = Buffer.alloc(5 + b.length);
      f.writeUInt32BE(b.length, 1);
      b.copy(f, 5);
      return f;
    };
    const pids: number[] = [];
    for (const pty of [false, true]) {
      const ac = new AbortController();
      const res = await fetch(`${envd.url}/process.Process/Start`, {
        method: "POST",
        headers: { "content-type": "application/connect+json", "connect-protocol-version": "1" },
        body: envelope({ process: { cmd: "/bin/sleep", args: ["60"] }, ...(pty ? { pty: { size: { cols: 80, rows: 24 } } } : {}) }),
        signal: ac.signal,
      });
      const reader = res.body!.getReader();
      const first = (await reader.read()).value!;
      const msg = JSON.parse(Buffer.from(first.subarray(5, 5 + Buffer.from(first).readUInt32BE(1))).toString());
      pids.push(msg.event.start.pid);
      ac.abort();
    }
    for (const pid of pids) {
      expect(procState(pid)).toMatch(/^[RSD]$/); // alive, not a zombie
    }
    envd.proc.kill("SIGTERM");
    expect(await envd.proc.exited).toBe(0);
    for (const pid of pids) await waitFor("procState(pid) === undefined", () => procState(pid) === undefined, { timeoutMs: 3000 });
  } finally {
    if (envd.proc.exitCode === null) await envd.stop();
  }
}, 30_000);

test("/init caBundle is written to the configured CA dir and the update command runs", async () => {
  const { mkdtempSync, readFileSync, rmSync, existsSync } = await import("node:fs");
  const { join } = await import("node:path");
  const tmp = mkdtempSync("/tmp/envd-ca-");
  // a real self-signed certificate, made by openssl
  const gen = Bun.spawnSync(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", join(tmp, "k.pem"), "-out", join(tmp, "c.pem"), "-days", "1", "-subj", "/CN=agentenv-test"]);
  expect(gen.exitCode).toBe(0);
  const pem = readFileSync(join(tmp, "c.pem"), "utf8");
  // the "update command" records that it ran
  const marker = join(tmp, "updated");
  const envd = await startEnvdChild(undefined, {
    AENV__envd__ca_dir: join(tmp, "cas"),
    AENV__envd__ca_update_command: `touch ${marker}`,
  });
  try {
    expect((await initEnvd(envd.url, { caBundle: `junk before\n${pem}junk after` })).status).toBe(204);
    expect(readFileSync(join(tmp, "cas/agentenv-init.crt"), "utf8")).toBe(pem.replace(/\r\n/g, "\n").trim() + "\n");
    expect(existsSync(marker)).toBe(true);
    const bad = await initEnvd(envd.url, { caBundle: "not a certificate" });
    expect(bad.status).toBe(400);
  } finally {
    await envd.stop();
    rmSync(tmp, { recursive: true, force: true });
  }
}, 30_000);

test("[envd] enforce_permissions = true: the user's rights are checked (403 / permission_denied)", async () => {
  const { mkdirSync, rmSync, existsSync } = await import("node:fs");
  ensureUserAccount();
  const envd = await startEnvdChild(undefined, { AENV__envd__enforce_permissions: "true" });
  const priv = "/root/envd-enforce-test";
  mkdirSync(priv, { recursive: true, mode: 0o700 });
  try {
    expect((await initEnvd(envd.url, { defaultUser: "user" })).status).toBe(204);
    const asUser = { "content-type": "application/json", authorization: `Basic ${btoa("user:")}` };
    const mk = await fetch(`${envd.url}/filesystem.Filesystem/MakeDir`, { method: "POST", headers: asUser, body: JSON.stringify({ path: `${priv}/x` }) });
    expect(mk.status).toBe(403);
    expect(((await mk.json()) as { code: string }).code).toBe("permission_denied");
    const ls = await fetch(`${envd.url}/filesystem.Filesystem/ListDir`, { method: "POST", headers: asUser, body: JSON.stringify({ path: priv }) });
    expect(ls.status).toBe(403);
    const up = await fetch(`${envd.url}/files?path=${priv}/y.txt`, { method: "POST", headers: { "content-type": "application/octet-stream" }, body: "no" });
    expect(up.status).toBe(403);
    expect(existsSync(`${priv}/y.txt`)).toBe(false);
    // root may
    const asRoot = { "content-type": "application/json", authorization: `Basic ${btoa("root:")}` };
    expect((await fetch(`${envd.url}/filesystem.Filesystem/MakeDir`, { method: "POST", headers: asRoot, body: JSON.stringify({ path: `${priv}/x` }) })).status).toBe(200);
    expect((await fetch(`${envd.url}/files?path=${priv}/y.txt&username=root`, { method: "POST", headers: { "content-type": "application/octet-stream" }, body: "ok" })).status).toBe(200);
    // and the user keeps full rights in its own home
    expect((await fetch(`${envd.url}/files?path=enforce-ok.txt`, { method: "POST", headers: { "content-type": "application/octet-stream" }, body: "ok" })).status).toBe(200);
    rmSync("/home/user/enforce-ok.txt", { force: true });
  } finally {
    await envd.stop();
    rmSync(priv, { recursive: true, force: true });
  }
}, 30_000);
