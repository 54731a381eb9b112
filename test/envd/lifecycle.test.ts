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

test("/init caBundle goes to the CA dir and into the system bundle (replacing the previous one), the update command runs, and processes get the trust-store variables", async () => {
  const { mkdtempSync, readFileSync, rmSync, existsSync, writeFileSync } = await import("node:fs");
  const { join } = await import("node:path");
  const tmp = mkdtempSync("/tmp/envd-ca-");
  // real self-signed certificates, made by openssl
  const cert = (n: string) => {
    const gen = Bun.spawnSync(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", join(tmp, `${n}.key`), "-out", join(tmp, `${n}.pem`), "-days", "1", "-subj", `/CN=${n}`]);
    expect(gen.exitCode).toBe(0);
    return readFileSync(join(tmp, `${n}.pem`), "utf8");
  };
  const [pem, pem2] = [cert("agentenv-test-1"), cert("agentenv-test-2")];
  const bundle = join(tmp, "ca-certificates.crt");
  writeFileSync(bundle, "SYSTEM ROOTS\n");
  // the "update command" records that it ran
  const marker = join(tmp, "updated");
  const envd = await startEnvdChild(undefined, {
    AENV__envd__ca_dir: join(tmp, "cas"),
    AENV__envd__ca_bundle_path: bundle,
    AENV__envd__ca_update_command: `touch ${marker}`,
  });
  try {
    expect((await initEnvd(envd.url, { caBundle: `junk before\n${pem}junk after` })).status).toBe(204);
    const norm = (p: string) => p.replace(/\r\n/g, "\n").trim() + "\n";
    expect(readFileSync(join(tmp, "cas/agentenv-init.crt"), "utf8")).toBe(norm(pem));
    expect(readFileSync(bundle, "utf8")).toBe(`SYSTEM ROOTS\n${norm(pem)}`);
    expect(existsSync(marker)).toBe(true);
    // the same bundle again changes nothing; another one replaces it in the system bundle
    expect((await initEnvd(envd.url, { caBundle: pem })).status).toBe(204);
    expect(readFileSync(bundle, "utf8")).toBe(`SYSTEM ROOTS\n${norm(pem)}`);
    expect((await initEnvd(envd.url, { caBundle: pem2 })).status).toBe(204);
    expect(readFileSync(bundle, "utf8")).toBe(`SYSTEM ROOTS\n${norm(pem2)}`);
    const env = await runEnv(envd.url);
    expect(env.NODE_EXTRA_CA_CERTS).toBe(join(tmp, "cas/agentenv-init.crt"));
    expect([env.REQUESTS_CA_BUNDLE, env.SSL_CERT_FILE, env.CURL_CA_BUNDLE]).toEqual([bundle, bundle, bundle]);
    const bad = await initEnvd(envd.url, { caBundle: "not a certificate" });
    expect(bad.status).toBe(400);
  } finally {
    await envd.stop();
    rmSync(tmp, { recursive: true, force: true });
  }
}, 30_000);

test("/init entropy: base64 of 32..4096 bytes is mixed into the kernel generator (root); anything else is a 400 naming the field", async () => {
  const { randomBytes } = await import("node:crypto");
  const envd = await startEnvdChild(undefined, { AENV__envd__reseed_random: "true" });
  try {
    expect((await initEnvd(envd.url, { entropy: randomBytes(64).toString("base64") })).status).toBe(204);
    for (const bad of [randomBytes(16).toString("base64"), "not base64!", randomBytes(4097).toString("base64"), 7]) {
      const r = await initEnvd(envd.url, { entropy: bad });
      expect(r.status).toBe(400);
      expect(((await r.json()) as { message: string }).message).toContain("entropy");
    }
  } finally {
    await envd.stop();
  }
}, 30_000);

/** The environment a process envd starts sees (`env -0` through process.Process/Start). */
async function runEnv(url: string): Promise<Record<string, string>> {
  const msg = Buffer.from(JSON.stringify({ process: { cmd: "/usr/bin/env", args: [] } }));
  const f = Buffer.alloc(5 + msg.length);
  f.writeUInt32BE(msg.length, 1);
  msg.copy(f, 5);
  const res = await fetch(`${url}/process.Process/Start`, { method: "POST", headers: { "content-type": "application/connect+json", "connect-protocol-version": "1" }, body: f });
  const buf = Buffer.from(await res.arrayBuffer());
  let out = "";
  for (let o = 0; o + 5 <= buf.length; ) {
    const len = buf.readUInt32BE(o + 1);
    const m = JSON.parse(buf.subarray(o + 5, o + 5 + len).toString());
    if (m.event?.data?.stdout) out += Buffer.from(m.event.data.stdout, "base64").toString();
    o += 5 + len;
  }
  return Object.fromEntries(out.split("\n").filter((l) => l.includes("=")).map((l) => [l.slice(0, l.indexOf("=")), l.slice(l.indexOf("=") + 1)]));
}

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
