/**
 * The node's outbound requests through an HTTP proxy, with real parts in network namespaces this
 * test makes: "node" (where the pulls and the S3 client run) and "far" (a TLS docker-registry and
 * an s3rver on an address the node namespace has no route to, and a CONNECT / absolute-form proxy,
 * ./../image/fixtures/connect-proxy.ts, on a veth the node namespace reaches). Registry pulls
 * (skopeo) through HTTPS_PROXY from the environment and through `[image] proxy`, NO_PROXY honoured,
 * a proxy with credentials that appear in no line; the S3 snapshot store through the proxy set up
 * as `agentenv server` does.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { TestNet } from "../image/netns.ts";
import { makeTestCa, pushImage, startRegistry, type TestRegistry } from "../image/registry.ts";
import { S3rver, S3RVER_KEY } from "../helpers/s3rver.ts";

const FAR = "10.235.0.1"; // on far's lo: unreachable from the node namespace but through the proxy
const PROXY_IP = "10.234.0.2";
const PROXY_PW = "proxy-pw-Vb8-never-logged";
const net = new TestNet();
let nodeNs: string;
let farNs: string;
let reg: TestRegistry;
let s3: S3rver;
let work: string;
let ca: { ca: string; cert: string; key: string };
let digest: string;
const proxies: { proc: Subprocess<"ignore", "pipe", "pipe">; lines: string[] }[] = [];

/** Start the test proxy in far on PROXY_IP:port; its request lines are collected. */
async function startProxy(port: number, auth?: string): Promise<{ lines: string[] }> {
  const proc = Bun.spawn(["ip", "netns", "exec", farNs, process.execPath, join(import.meta.dir, "../image/fixtures/connect-proxy.ts"), PROXY_IP, String(port), ...(auth ? [auth] : [])], { stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const p = { proc, lines: [] as string[] };
  proxies.push(p);
  let ready: () => void = () => {};
  const listening = new Promise<void>((r) => (ready = r));
  void (async () => {
    let buf = "";
    for await (const c of proc.stdout) {
      buf += new TextDecoder().decode(c);
      const ls = buf.split("\n");
      buf = ls.pop()!;
      for (const l of ls) l === "listening" ? ready() : p.lines.push(l);
    }
  })();
  await Promise.race([listening, proc.exited.then((c) => Promise.reject(new Error(`proxy exited ${c}`)))]);
  return p;
}

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), "aenv-outbound-"));
  nodeNs = net.netns("n");
  farNs = net.netns("f", [`${FAR}/32`]);
  net.veth(nodeNs, "10.234.0.1/30", farNs, `${PROXY_IP}/30`);
  ca = makeTestCa(work, [FAR]);
  reg = await startRegistry({ netns: farNs, addr: FAR, tls: { cert: ca.cert, key: ca.key } });
  const l = join(work, "l");
  mkdirSync(join(l, "etc"), { recursive: true });
  writeFileSync(join(l, "etc/far"), "pulled through the proxy\n");
  const img = await pushImage(reg.host, "far/app:v1", [{ dir: l, compression: "gzip" }], {}, undefined, farNs);
  digest = img.digest;
  rmSync(img.dir, { recursive: true, force: true });
  s3 = await S3rver.start({ netns: farNs, addr: FAR, bucket: "snapshots" });
  await startProxy(3128);
  await startProxy(3129, `puser:${PROXY_PW}`);
}, 90_000);

afterAll(async () => {
  for (const p of proxies) {
    p.proc.kill("SIGKILL");
    await p.proc.exited;
  }
  await reg?.stop();
  await s3?.stop();
  net.dispose();
  rmSync(work, { recursive: true, force: true });
});

let homes = 0;
const home = () => join(work, `home${++homes}`);
const ref = () => `${reg.host}/far/app:v1`;
const connects = (i: number) => proxies[i]!.lines.map((l) => JSON.parse(l) as { method: string; target: string; status: number }).filter((x) => x.method === "CONNECT" && x.target === reg.host);

test("the registry is unreachable from the node namespace without the proxy", async () => {
  const r = await net.pull(nodeNs, { home: home(), ref: ref(), image: { ca_path: ca.ca } });
  expect(r.error?.code).toBe("image.unreachable");
}, 60_000);

test("HTTPS_PROXY from the environment: the pull tunnels through the proxy (CONNECT to the registry); NO_PROXY sends it directly", async () => {
  const before = connects(0).length;
  const r = await net.pull(nodeNs, { home: home(), ref: ref(), image: { ca_path: ca.ca }, env: { HTTPS_PROXY: `http://${PROXY_IP}:3128` } });
  expect(r.error).toBeUndefined();
  expect(r.digest).toBe(digest);
  expect(connects(0).length).toBeGreaterThan(before);
  expect(connects(0).every((c) => c.status === 200)).toBe(true);
  const n = connects(0).length;
  const direct = await net.pull(nodeNs, { home: home(), ref: ref(), image: { ca_path: ca.ca }, env: { HTTPS_PROXY: `http://${PROXY_IP}:3128`, NO_PROXY: "10.235.0.0/24" } });
  expect(direct.error?.code).toBe("image.unreachable");
  expect(connects(0).length).toBe(n);
}, 120_000);

test("[image] proxy set explicitly (no variable), with proxy credentials that show in no line; a wrong proxy password fails the pull", async () => {
  const before = connects(1).length;
  const r = await net.pull(nodeNs, { home: home(), ref: ref(), image: { ca_path: ca.ca, proxy: `http://puser:${PROXY_PW}@${PROXY_IP}:3129` } });
  expect(r.error).toBeUndefined();
  expect(r.digest).toBe(digest);
  expect(connects(1).length).toBeGreaterThan(before);
  expect(JSON.stringify(r.progress) + r.stderr).not.toContain(PROXY_PW);
  const bad = await net.pull(nodeNs, { home: home(), ref: ref(), image: { ca_path: ca.ca, proxy: `http://puser:wrong-${PROXY_PW}@${PROXY_IP}:3129` } });
  expect(bad.ok).toBe(false);
  expect(bad.error?.code).toBe("image.unreachable");
  expect(JSON.stringify(bad)).not.toContain(PROXY_PW);
}, 120_000);

test("the S3 snapshot store through the proxy the node sets up (HTTP_PROXY for an http endpoint), and unreachable without it", async () => {
  const tree = (image: Record<string, unknown>) => ({ image, snapshot: { s3: { bucket: s3.bucket, endpoint: s3.endpoint, access_key_id: S3RVER_KEY, secret_access_key: S3RVER_KEY, retries: 0 } } });
  const run = async (t: Record<string, unknown>) => {
    const p = Bun.spawn(["ip", "netns", "exec", nodeNs, process.execPath, join(import.meta.dir, "fixtures/s3-in-netns.ts"), JSON.stringify(t)], { stdout: "pipe", stderr: "pipe", env: Object.fromEntries(Object.entries(process.env).filter(([k]) => !/_proxy$/i.test(k))) as Record<string, string> });
    const [out, err] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
    try {
      return JSON.parse(out.trim().split("\n").pop()!) as { ok: boolean; uploaded?: number; stored?: boolean; code?: string };
    } catch {
      throw new Error(`s3-in-netns: ${out}\n${err}`);
    }
  };
  const before = proxies[0]!.lines.length;
  const r = await run(tree({ proxy: `http://${PROXY_IP}:3128` }));
  expect(r).toEqual({ ok: true, uploaded: 3300, stored: true });
  const via = proxies[0]!.lines.slice(before).map((l) => JSON.parse(l) as { method: string; target: string });
  expect(via.length).toBeGreaterThan(0);
  expect(via.every((x) => x.target.startsWith(`http://${FAR}:${s3.port}/`))).toBe(true);
  const direct = await run(tree({}));
  expect(direct.ok).toBe(false);
  expect(direct.code).toBe("snapshot.remote_failed");
}, 120_000);

test("nodeProxy: loopback, the sandbox networks and the scheduler are always direct; a bad proxy is a ConfigError that hides its password", async () => {
  const { loadConfig } = await import("../../src/config/index.ts");
  const { nodeProxy } = await import("../../src/node/outbound.ts");
  const { proxyFor } = await import("../../src/util/proxy.ts");
  const cfg = loadConfig({ env: {}, tree: { image: { proxy: "http://proxy.corp:3128" }, cluster: { scheduler_endpoint: "agentenv-scheduler.agentenv.svc:9090" } } });
  const s = nodeProxy(cfg, {});
  expect(s.noProxy).toEqual(["localhost", "127.0.0.0/8", "::1", "10.11.0.0/16", "10.12.0.0/16", "agentenv-scheduler.agentenv.svc"]);
  expect(proxyFor("http://10.11.0.7:49983/health", s)).toBeNull(); // envd in a sandbox
  expect(proxyFor("http://agentenv-scheduler.agentenv.svc:9090/", s)).toBeNull();
  expect(proxyFor("https://registry-1.docker.io/v2/", s)).toBe("http://proxy.corp:3128");
  // from the environment when [image] proxy is empty
  expect(nodeProxy(loadConfig({ env: {} }), { https_proxy: "http://envproxy:8080" }).httpsProxy).toBe("http://envproxy:8080");
  let err: unknown;
  try {
    nodeProxy(loadConfig({ env: {}, tree: { image: { proxy: "socks5://u:hunter2@p:1080" } } }), {});
  } catch (e) {
    err = e;
  }
  expect(err).toMatchObject({ code: "config.bad_value", details: { key: "image.proxy", value: "socks5://u:***@p:1080" } });
  expect((err as Error).message).not.toContain("hunter2");
});
