/**
 * Egress rules, secrets and the egress proxy end to end: `agentenv server` in a private namespace,
 * the unmodified SDK, real QEMU guests, an HTTPS upstream (certificate from a test CA the node is
 * told to trust: `[network.egress] upstream_ca_path`) and microsocks (SOCKS5 with credentials) in
 * a namespace of their own behind a veth. A rule for api.test that sets
 * `Authorization: Bearer ${e2b.secrets.k}` makes the guest's plain `curl https://api.test:8443/`
 * (port 8443 via `intercept_ports`) arrive with the header, while the secret's bytes are nowhere in
 * the guest (env, files, envd's log lines, QEMU's whole memory), in the node's log or in an API
 * answer; another host gets no header (its TLS passes untouched); plain HTTP gets no header;
 * `Secret.update` applies to the next request; a deleted secret fails the request with a clear
 * 502 and nothing sent; pause and resume keep the rule. The egress proxy carries the sandbox's
 * connections (seen from the proxy's address), wrong credentials fail closed, and clearing it
 * sends traffic directly again.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { EgressWorld, NODE_SIDE, UP } from "./egress-world.ts";
import { pidsNaming, vmPrerequisites, type NodeWorld } from "./world.ts";

const missing = vmPrerequisites();
const VALUE = `sk-live-${crypto.randomUUID()}`;
const VALUE2 = `sk-rotated-${crypto.randomUUID()}`;
let ew: EgressWorld | undefined;
let world: NodeWorld | undefined;
const seen = () => ew!.seen();

beforeAll(async () => {
  if (missing) return;
  ew = new EgressWorld();
  world = ew.world;
  await ew.start({ AENV_LOG_LEVEL: "info" });
}, 180_000);

afterAll(async () => {
  await ew?.dispose();
}, 60_000);

const client = <T = any>(...args: string[]) => world!.client<T>("egress.ts", args);

/** Count of `needle` in the whole readable memory of process `pid` (its guest RAM included). */
function memoryHits(pid: number, needle: Buffer): number {
  const maps = readFileSync(`/proc/${pid}/maps`, "utf8").trim().split("\n");
  const fd = require("node:fs").openSync(`/proc/${pid}/mem`, "r");
  let hits = 0;
  const CHUNK = 8 * 1024 * 1024;
  const buf = Buffer.alloc(CHUNK + needle.length);
  try {
    for (const line of maps) {
      const m = /^([0-9a-f]+)-([0-9a-f]+) r/.exec(line);
      if (!m || line.includes("[vvar]") || line.includes("[vsyscall]")) continue;
      const start = parseInt(m[1]!, 16);
      const end = parseInt(m[2]!, 16);
      for (let a = start; a < end; a += CHUNK) {
        const len = Math.min(CHUNK + needle.length, end - a);
        let got = 0;
        try {
          got = require("node:fs").readSync(fd, buf, 0, len, a);
        } catch {
          break;
        }
        let i = buf.subarray(0, got).indexOf(needle);
        while (i >= 0 && i < Math.min(got, CHUNK)) {
          hits++;
          i = buf.subarray(0, got).indexOf(needle, i + 1);
        }
      }
    }
  } finally {
    require("node:fs").closeSync(fd);
  }
  return hits;
}

let box = "";

test("a rule's header reaches the upstream with the secret; another host and plain HTTP get none; the guest trusts the node CA", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  const r = await client("setup", VALUE, readFileSync(ew!.caFile, "utf8"));
  box = r.id;
  expect(r.api).toEqual({ exit: 0, stdout: "ok /one status=200", stderr: "" });
  expect(r.other).toMatchObject({ exit: 0, stdout: "ok /two status=200" });
  expect(r.plain).toMatchObject({ exit: 0, stdout: "ok /plain status=200" });
  expect(r.python).toMatchObject({ exit: 0, stdout: "ok /py" });
  const log = seen();
  expect(log.map((l) => [l.path, l.authorization])).toEqual([
    ["/one", `Bearer ${VALUE}`],
    ["/two", null],
    ["/plain", null],
    ["/py", `Bearer ${VALUE}`],
  ]);
  // the intercepted requests left from the node's side of the veth; the others too (masquerade)
  expect(log.every((l) => l.remote === NODE_SIDE)).toBe(true);
}, 300_000);

test("the secret is nowhere in the guest (env, files, envd's logs, QEMU's memory, its disk) nor in the node's log or API answers", async () => {
  const g = await client("guest-scan", box, VALUE);
  expect(g.env.lines).toBeGreaterThan(3);
  expect(g.env.hasValue).toBe(false);
  expect(g.marker.stdout).toBe("/home/user/marker.txt");
  expect(g.logs.status).toBe(200);
  expect(g.logs.envd).toBeGreaterThan(0);
  expect(g.logs.hasValue).toBe(false);
  const pids = pidsNaming(box).filter((p) => readFileSync(`/proc/${p}/cmdline`, "utf8").includes("qemu-system"));
  expect(pids.length).toBe(1);
  // positive control: a string the guest holds (a file it wrote) is found by the same scan
  expect(memoryHits(pids[0]!, Buffer.from("MEMSCAN-MARKER-42-PRESENT"))).toBeGreaterThan(0);
  // the whole QEMU process: guest RAM (files in its page cache, every process's environment) and QEMU's own buffers
  expect(memoryHits(pids[0]!, Buffer.from(VALUE))).toBe(0);
  // the guest's disk writes (its upper, served from the host)
  const upper = join(world!.home, "sandboxes", box);
  const files = readdirSync(upper, { recursive: true }).map(String).filter((f) => !f.startsWith("mnt"));
  expect(files.length).toBeGreaterThan(0);
  for (const f of files) {
    let bytes: Buffer;
    try {
      bytes = readFileSync(join(upper, f));
    } catch {
      continue; // a directory or a socket
    }
    expect([f, bytes.includes(Buffer.from(VALUE))]).toEqual([f, false]);
  }
  const info = await client("info", box);
  expect(info.info.includes(VALUE)).toBe(false);
  expect(info.info).toContain("${e2b.secrets.k}");
  expect(world!.log.includes(VALUE)).toBe(false);
  expect(world!.log.length).toBeGreaterThan(0);
}, 300_000);

test("Secret.update applies to the next request; a deleted secret fails the request with a clear 502 and nothing is sent", async () => {
  expect((await client("rotate", VALUE2)).version).toBe(2);
  const r = await client("curl", box, "rotated");
  expect(r.r).toMatchObject({ exit: 0, stdout: "ok /rotated status=200" });
  expect(seen().at(-1)).toMatchObject({ path: "/rotated", authorization: `Bearer ${VALUE2}` });
  expect((await client("drop-secret")).dropped).toBe(true);
  const n = seen().length;
  const f = await client("curl", box, "no-secret");
  expect(f.r.stdout).toContain("status=502");
  expect(f.r.stdout).toContain('secret "k"');
  expect(f.r.stderr.toLowerCase()).toContain("x-agentenv-egress-error: secret_not_found");
  expect(seen().length).toBe(n);
  expect((await client("make-secret", VALUE)).version).toBe(1);
}, 300_000);

test("pause and resume keep the rule", async () => {
  expect((await client("pause-resume", box)).resumed).toBe(true);
  const r = await client("curl", box, "resumed");
  expect(r.r).toMatchObject({ exit: 0, stdout: "ok /resumed status=200" });
  expect(seen().at(-1)).toMatchObject({ path: "/resumed", authorization: `Bearer ${VALUE}` });
  expect(world!.log.includes(VALUE)).toBe(false);
  await client("kill", box);
}, 300_000);

test("egress proxy: connections leave through SOCKS5 with credentials; wrong credentials fail closed; clearing it goes direct", async () => {
  const p = await client("proxy-create", "puser", "ppass", ew!.caFile);
  const via = await client("proxy-curl", p.id, "via-socks");
  expect(via.r).toMatchObject({ exit: 0, stdout: "ok /via-socks status=200" });
  // microsocks connects from its own address
  expect(seen().at(-1)).toMatchObject({ path: "/via-socks", remote: UP });
  await client("proxy-set", p.id, "puser", "wrong");
  const n = seen().length;
  const refused = await client("proxy-curl", p.id, "wrong-creds");
  expect(refused.r.exit).not.toBe(0);
  expect(seen().length).toBe(n);
  await client("proxy-clear", p.id);
  const direct = await client("proxy-curl", p.id, "direct");
  expect(direct.r).toMatchObject({ exit: 0, stdout: "ok /direct status=200" });
  expect(seen().at(-1)).toMatchObject({ path: "/direct", remote: NODE_SIDE });
  const info = await client("info", p.id);
  expect(info.info.includes("ppass")).toBe(false);
  expect(world!.log.includes("ppass")).toBe(false);
  await client("kill", p.id);
}, 300_000);
