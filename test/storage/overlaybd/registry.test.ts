/**
 * Registry backend against a real Debian `docker-registry` (distribution 2.8) started here on
 * 127.0.0.1 with token auth; the token server is a Bun server in this test issuing RS256 JWTs
 * signed by a throw-away openssl certificate. Redirects and retries use a loopback Bun server.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash, createPrivateKey, randomUUID, sign } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { BlockCache } from "../../../src/storage/overlaybd/cache.ts";
import { openImageConfig, openRoLayer, openStack, OverlaybdError } from "../../../src/storage/overlaybd/index.ts";
import { MemoryBackend } from "../../../src/storage/overlaybd/backend.ts";
import { parseChallenge, RegistryBlob } from "../../../src/storage/overlaybd/registry.ts";
import { HELLO, scratch, sha256 } from "./helpers.ts";
import { waitFor } from "../../helpers/wait.ts";

const tmp = scratch();
const IDENTITY_TOKEN = "idtok-overlaybd";
const USER = "alice", PASS = "s3cret", SERVICE = "agentenv-registry", ISSUER = "agentenv-test", REPO = "test/hello";
const blob = new Uint8Array(readFileSync(HELLO));
const digest = "sha256:" + createHash("sha256").update(blob).digest("hex");
let registry: Bun.Subprocess | null = null;
let tokenServer: ReturnType<typeof Bun.serve> | null = null;
let regUrl = "";
let tokenRequests = 0;

const b64url = (b: Buffer | string) => Buffer.from(b).toString("base64url");

function freePort(): number {
  const s = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const p = s.port;
  s.stop(true);
  return p;
}

beforeAll(async () => {
  const key = tmp.path("key.pem"), cert = tmp.path("cert.pem");
  const gen = Bun.spawnSync(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=agentenv-test-token"]);
  if (gen.exitCode !== 0) throw new Error(`openssl: ${gen.stderr.toString()}`);
  const pk = createPrivateKey(readFileSync(key));
  const der = readFileSync(cert, "utf8").replace(/-----[^-]+-----|\s/g, "");
  tokenServer = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      tokenRequests++;
      const u = new URL(req.url);
      // Basic credentials on a GET, or an OAuth2 refresh-token grant (an identity token) on a POST
      const form = req.method === "POST" ? new URLSearchParams(await req.text()) : null;
      if (form ? form.get("grant_type") !== "refresh_token" || form.get("refresh_token") !== IDENTITY_TOKEN : req.headers.get("authorization") !== "Basic " + Buffer.from(`${USER}:${PASS}`).toString("base64")) {
        return new Response("denied", { status: 401 });
      }
      const params = form ?? u.searchParams;
      const access = params.getAll("scope").flatMap((s) => s.split(" ")).filter(Boolean).map((s) => {
        const [type, name, actions] = s.split(":");
        return { type, name, actions: actions!.split(",") };
      });
      const now = Math.floor(Date.now() / 1000);
      const header = b64url(JSON.stringify({ alg: "RS256", typ: "JWT", x5c: [der] }));
      const claims = b64url(JSON.stringify({ iss: ISSUER, sub: USER, aud: params.get("service"), exp: now + 300, nbf: now - 10, iat: now, jti: randomUUID(), access }));
      const sig = b64url(sign("sha256", Buffer.from(`${header}.${claims}`), pk));
      return Response.json({ token: `${header}.${claims}.${sig}`, expires_in: 300 });
    },
  });
  const port = freePort();
  regUrl = `http://127.0.0.1:${port}`;
  writeFileSync(tmp.path("registry.yml"), [
    "version: 0.1",
    "log:", "  level: error", "  accesslog:", "    disabled: true",
    "storage:", "  filesystem:", `    rootdirectory: ${tmp.path("store")}`,
    "http:", `  addr: 127.0.0.1:${port}`,
    "auth:", "  token:", `    realm: http://127.0.0.1:${tokenServer.port}/token`, `    service: ${SERVICE}`, `    issuer: ${ISSUER}`, `    rootcertbundle: ${cert}`,
  ].join("\n") + "\n");
  registry = Bun.spawn(["docker-registry", "serve", tmp.path("registry.yml")], { stdout: "ignore", stderr: "pipe" });
  // not listening yet: a refused connection, retried
  await waitFor("docker-registry to ask for a token", async () => (await fetch(`${regUrl}/v2/`)).status === 401, { retryErrors: true });
  // push the hello-world blob (monolithic upload) with a push token
  const tok = await (await fetch(`http://127.0.0.1:${tokenServer.port}/token?service=${SERVICE}&scope=repository:${REPO}:pull,push`, { headers: { authorization: "Basic " + Buffer.from(`${USER}:${PASS}`).toString("base64") } })).json() as { token: string };
  const auth = { authorization: `Bearer ${tok.token}` };
  const start = await fetch(`${regUrl}/v2/${REPO}/blobs/uploads/`, { method: "POST", headers: auth });
  if (start.status !== 202) throw new Error(`upload start: ${start.status} ${await start.text()}`);
  const loc = new URL(start.headers.get("location")!, regUrl);
  loc.searchParams.set("digest", digest);
  const put = await fetch(loc, { method: "PUT", headers: { ...auth, "content-type": "application/octet-stream" }, body: blob });
  if (put.status !== 201) throw new Error(`upload: ${put.status} ${await put.text()}`);
}, 60_000);

afterAll(async () => {
  if (registry) {
    registry.kill();
    await registry.exited;
  }
  tokenServer?.stop(true);
  tmp.cleanup();
}, 30_000);

describe("registry blob over a real docker-registry with token auth", () => {
  test("challenge parsing", () => {
    expect(parseChallenge('Bearer realm="http://x/token",service="reg",scope="repository:a/b:pull"')).toEqual({ scheme: "bearer", params: { realm: "http://x/token", service: "reg", scope: "repository:a/b:pull" } });
    expect(parseChallenge('Basic realm="r"')?.scheme).toBe("basic");
    expect(parseChallenge("Negotiate")).toBeNull();
  });

  test("token flow, size, lazy range reads through the block cache", async () => {
    const before = tokenRequests;
    const rb = await RegistryBlob.open(`${regUrl}/v2/${REPO}/blobs/${digest}`, { username: USER, password: PASS }, blob.length);
    expect(rb.size).toBe(blob.length);
    expect(tokenRequests - before).toBe(1);
    const cache = new BlockCache(rb, { blockSize: 65536, capacityBytes: 4 << 20 });
    const layer = await openRoLayer(cache);
    const img = await openStack({ lowers: [layer] });
    const buf = new Uint8Array(4 << 20);
    await img.pread(buf, 0);
    expect(sha256(buf)).toBe("1ba9757892e20ff13d4dc47e72694349129a92f41f20b65010a4082f3261466c");
    expect(rb.stats.rangeReads).toBeGreaterThan(1);
    expect(rb.stats.bytes).toBeLessThanOrEqual(blob.length);
    // a second read of the same range is served by the cache
    const reads = rb.stats.rangeReads;
    await img.pread(buf, 0);
    expect(rb.stats.rangeReads).toBe(reads);
    expect(cache.stats.hits).toBeGreaterThan(0);
    await img.close();
  }, 60_000);

  test("wrong credentials and a missing blob are typed errors", async () => {
    await expect(RegistryBlob.open(`${regUrl}/v2/${REPO}/blobs/${digest}`, { username: USER, password: "nope" })).rejects.toMatchObject({ code: "overlaybd.registry_auth" });
    await expect(RegistryBlob.open(`${regUrl}/v2/${REPO}/blobs/sha256:${"0".repeat(64)}`, { username: USER, password: PASS })).rejects.toMatchObject({ code: "overlaybd.registry_http", details: { status: 404 } });
    await expect(RegistryBlob.open(`${regUrl}/v2/${REPO}/blobs/${digest}`, { username: USER, password: PASS }, 5)).rejects.toMatchObject({ code: "overlaybd.registry_size" });
  }, 30_000);

  test("config.v1.json with a remote lower (repoBlobUrl + digest)", async () => {
    writeFileSync(tmp.path("config.v1.json"), JSON.stringify({ repoBlobUrl: `${regUrl}/v2/${REPO}/blobs`, lowers: [{ digest, size: blob.length, dir: tmp.path("nolocal") }] }));
    const img = await openImageConfig(tmp.path("config.v1.json"), {
      remote: async (url, size) => new BlockCache(await RegistryBlob.open(url, { username: USER, password: PASS }, size), { blockSize: 262144, capacityBytes: 8 << 20 }),
    });
    const buf = new Uint8Array(8 << 20);
    await img.pread(buf, 0);
    expect(sha256(buf)).toBe("6747a26dcb4c5000cbda3c13f8ca26b0132048eb2df88fef59504e304f2938ed");
    await img.close();
  }, 60_000);
});

test("an identity token (Docker's identitytoken) is exchanged at the token server as an OAuth2 refresh token; a wrong one is refused", async () => {
  const url = `${regUrl}/v2/${REPO}/blobs/${digest}`;
  const before = tokenRequests;
  const b = await RegistryBlob.open(url, { identityToken: IDENTITY_TOKEN });
  expect(b.size).toBe(blob.length);
  expect(tokenRequests).toBe(before + 1);
  const head = new Uint8Array(512);
  await b.pread(head, 0);
  expect(head).toEqual(blob.subarray(0, 512));
  await expect(RegistryBlob.open(url, { identityToken: "wrong" })).rejects.toMatchObject({ code: "overlaybd.registry_auth" });
});

describe("redirects and retries (loopback servers)", () => {
  test("307 to a storage server: later reads go there without auth; a failed read is retried", async () => {
    let storageHits = 0, failNext = 1, sawAuthAtStorage = false;
    const storage = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch(req) {
        storageHits++;
        if (req.headers.get("authorization")) sawAuthAtStorage = true;
        const m = /bytes=(\d+)-(\d+)/.exec(req.headers.get("range") ?? "");
        if (!m) return new Response(blob);
        if (Number(m[1]) > 0 && failNext-- > 0) return new Response("boom", { status: 500 });
        const a = Number(m[1]), b = Math.min(Number(m[2]), blob.length - 1);
        return new Response(blob.subarray(a, b + 1), { status: 206, headers: { "content-range": `bytes ${a}-${b}/${blob.length}` } });
      },
    });
    const front = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch(req) {
        if (req.headers.get("authorization") !== "Basic " + Buffer.from("bob:pw").toString("base64")) return new Response("", { status: 401, headers: { "www-authenticate": 'Basic realm="front"' } });
        return new Response(null, { status: 307, headers: { location: `http://127.0.0.1:${storage.port}/blob?sig=1` } });
      },
    });
    try {
      const rb = await RegistryBlob.open(`http://127.0.0.1:${front.port}/v2/x/blobs/${digest}`, { username: "bob", password: "pw" });
      expect(rb.size).toBe(blob.length);
      const b = new Uint8Array(100_000);
      expect(await rb.pread(b, 1000)).toBe(100_000);
      expect(Buffer.compare(b, blob.subarray(1000, 101_000))).toBe(0);
      expect(failNext).toBeLessThan(1); // the injected 500 happened and was retried
      expect(storageHits).toBeGreaterThan(2);
      expect(sawAuthAtStorage).toBe(false);
      await expect(RegistryBlob.open(`http://127.0.0.1:${front.port}/v2/x/blobs/${digest}`, {})).rejects.toBeInstanceOf(OverlaybdError);
    } finally {
      front.stop(true);
      storage.stop(true);
    }
  }, 30_000);
});

describe("block cache", () => {
  test("concurrent misses share fetches and all read the right bytes", async () => {
    const data = new Uint8Array(1 << 20);
    for (let i = 0; i < data.length; i++) data[i] = (i * 13 + (i >> 10)) & 0xff;
    const mem = new MemoryBackend(data);
    let fetched = 0;
    const slow = {
      name: "slow", size: data.length, close: async () => {},
      async pread(b: Uint8Array, off: number) {
        await Bun.sleep(5);
        fetched += b.length;
        return mem.preadSync(b, off);
      },
    };
    const c = new BlockCache(slow, { blockSize: 65536, capacityBytes: 1 << 20 });
    const reqs = Array.from({ length: 64 }, (_, i) => ({ off: (i * 37_123) % (data.length - 9000), buf: new Uint8Array(9000) }));
    await Promise.all(reqs.map((r) => c.pread(r.buf, r.off)));
    for (const r of reqs) expect(Buffer.compare(r.buf, data.subarray(r.off, r.off + 9000))).toBe(0);
    expect(fetched).toBeLessThanOrEqual(data.length); // no block fetched twice
  });

  test("LRU bound, hits, and byte-exact reads across block edges", async () => {
    const data = new Uint8Array(1 << 20);
    for (let i = 0; i < data.length; i++) data[i] = (i * 31 + (i >> 9)) & 0xff;
    const c = new BlockCache(new MemoryBackend(data), { blockSize: 4096, capacityBytes: 16384 });
    const b = new Uint8Array(10_000);
    for (const off of [0, 5000, 4095, 1_040_000, 3]) {
      const n = await c.pread(b, off);
      expect(Buffer.compare(b.subarray(0, n), data.subarray(off, off + n))).toBe(0);
      expect(c.stats.cachedBytes).toBeLessThanOrEqual(16384);
    }
    expect(c.stats.evictions).toBeGreaterThan(0);
    const hits = c.stats.hits;
    await c.pread(b.subarray(0, 100), 3);
    expect(c.stats.hits).toBe(hits + 1);
    expect(() => new BlockCache(new MemoryBackend(data), { blockSize: 3000, capacityBytes: 1 << 20 })).toThrow(OverlaybdError);
    expect(() => new BlockCache(new MemoryBackend(data), { blockSize: 4096, capacityBytes: 100 })).toThrow(OverlaybdError);
  });
});

describe("remote opener from config", () => {
  test("credentials lookup by host and path prefix", async () => {
    const { findCredentials } = await import("../../../src/storage/overlaybd/remote.ts");
    const doc = { auths: { "reg.example:5000": { username: "a", password: "1" }, "reg.example:5000/team": { auth: Buffer.from("b:2:x").toString("base64") } } };
    expect(findCredentials(doc, "http://reg.example:5000/v2/other/blobs/sha256:1")).toEqual({ username: "a", password: "1" });
    expect(findCredentials(doc, "http://reg.example:5000/team/v2/x")).toEqual({ username: "b", password: "2:x" }); // longest prefix wins
    expect(findCredentials({ auths: { "reg.example:5000/v2/team": { auth: Buffer.from("b:2:x").toString("base64") } } }, "http://reg.example:5000/v2/team/app/blobs/d")).toEqual({ username: "b", password: "2:x" });
    expect(findCredentials({}, "http://x/")).toBeNull();
  });

  test("agentenv image cat of a config.v1.json with a remote lower, credentials from an auths file", async () => {
    const host = new URL(regUrl).host;
    writeFileSync(tmp.path("auths.json"), JSON.stringify({ auths: { [host]: { auth: Buffer.from(`${USER}:${PASS}`).toString("base64") } } }));
    writeFileSync(tmp.path("remote.json"), JSON.stringify({ repoBlobUrl: `${regUrl}/v2/${REPO}/blobs`, lowers: [{ digest, size: blob.length }] }));
    const main = new URL("../../../src/cli/main.ts", import.meta.url).pathname;
    // async spawn: the token server lives in this process's event loop
    const run = async (env: Record<string, string>, ...args: string[]) => {
      const p = Bun.spawn([process.execPath, main, "image", "cat", tmp.path("remote.json"), ...args], { env: { ...process.env, AENV_LOG_LEVEL: "warn", ...env }, stdout: "pipe", stderr: "pipe" });
      const [out, err, code] = await Promise.all([new Response(p.stdout).arrayBuffer(), new Response(p.stderr).text(), p.exited]);
      return { out: new Uint8Array(out), err, code };
    };
    const ok = await run({ AENV_REGISTRY_AUTH_FILE: tmp.path("auths.json"), AENV__overlaybd__cache_block_size: "65536" }, "--length", "4MiB");
    expect(ok.err).toBe("");
    expect(ok.code).toBe(0);
    expect(sha256(ok.out)).toBe("1ba9757892e20ff13d4dc47e72694349129a92f41f20b65010a4082f3261466c");
    const bad = await run({ AENV_REGISTRY_AUTH_FILE: "/nonexistent/auths.json" }, "--length", "512");
    expect(bad.code).toBe(1);
    expect(bad.err).toMatch(/cannot read credentials/);
    const noauth = await run({}, "--length", "512");
    expect(noauth.code).toBe(1);
    expect(noauth.err).toMatch(/Basic credentials|token server .* 401/);
  }, 60_000);

  test("a corrupted fetch behind the cache is evicted and refetched (ZFile CRC retry)", async () => {
    const { ZFileReader } = await import("../../../src/storage/overlaybd/zfile.ts");
    const { openTarMember } = await import("../../../src/storage/overlaybd/tar.ts");
    let corruptLeft = 1;
    const flaky = new MemoryBackend(blob);
    const inner = {
      name: "flaky", size: blob.length, close: async () => {},
      async pread(b: Uint8Array, off: number) {
        const n = flaky.preadSync(b, off);
        // corrupt one fetch that covers the data area (past the headers and jump table reads)
        if (off >= 65536 && off < 500_000 && corruptLeft-- > 0) b[100] ^= 0xff;
        return n;
      },
    };
    const cache = new BlockCache(inner, { blockSize: 65536, capacityBytes: 4 << 20 });
    const z = await ZFileReader.open((await openTarMember(cache))!);
    const out = new Uint8Array(z.size);
    await z.pread(out, 0);
    expect(corruptLeft).toBeLessThan(1);
    expect(sha256(out)).toBe("39195424aa10572fe002262190877b4306a66be9c62c8f1594141b01dc79c2ea");
  }, 30_000);
});
