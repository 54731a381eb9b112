/**
 * The pure parts of the egress interceptor (src/net/egress): rule parsing and E2B's precedence,
 * placeholders, the egress proxy's fields, a real ClientHello's server name, HTTP/1.1 request
 * framing, the redirect chain, and the node CA's leaves (verified by openssl and by node:tls).
 */
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import tls from "node:tls";
import { EgressCa, maskHeaderValue, matchRule, parseClientHello, parseEgressProxy, parseRules, redirectScript, RequestReader, serializeHead, type Http1Event } from "../../src/net/egress/index.ts";
import { NetError } from "../../src/net/errors.ts";

const dir = mkdtempSync(join(tmpdir(), "egress-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function field(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    if (e instanceof NetError) return String(e.details.field);
    throw e;
  }
  throw new Error("expected a NetError");
}

const rule = (headers: Record<string, string>) => [{ transform: { headers } }];

test("rules: exact beats wildcard, the longest wildcard suffix wins, never the apex; keys lower-cased", () => {
  const rules = parseRules({ "API.Example.com": rule({ A: "exact" }), "*.example.com": rule({ A: "short" }), "*.eu.example.com": rule({ A: "long" }), "*.com": rule({ A: "tld" }) });
  const pick = (h: string) => (matchRule(rules, h)?.headers[0]?.parts[0] as { text: string } | undefined)?.text ?? null;
  expect(pick("api.example.com")).toBe("exact");
  expect(pick("API.EXAMPLE.COM.")).toBe("exact");
  expect(pick("x.example.com")).toBe("short");
  expect(pick("a.b.eu.example.com")).toBe("long");
  expect(pick("eu.example.com")).toBe("short");
  expect(pick("example.com")).toBe("tld");
  expect(pick("example.org")).toBeNull();
  expect(matchRule(parseRules({ "*.example.com": rule({ A: "x" }) }), "example.com")).toBeNull();
});

test("rules: bad keys, too many domains or headers, bad header names and values, unknown fields name their field", () => {
  expect(field(() => parseRules({ "*": rule({ A: "b" }) }))).toBe('network.rules["*"]');
  expect(field(() => parseRules({ "": rule({ A: "b" }) }))).toBe('network.rules[""]');
  expect(field(() => parseRules({ "1.2.3.4": rule({ A: "b" }) }))).toBe('network.rules["1.2.3.4"]');
  expect(field(() => parseRules({ "a.com": rule({ A: "b" }), "A.com": rule({ A: "b" }) }))).toBe('network.rules["A.com"]');
  expect(field(() => parseRules(Object.fromEntries(Array.from({ length: 11 }, (_, i) => [`h${i}.com`, []]))))).toBe("network.rules");
  expect(field(() => parseRules({ "a.com": rule(Object.fromEntries(Array.from({ length: 21 }, (_, i) => [`H${i}`, "v"]))) }))).toBe('network.rules["a.com"][0].transform.headers');
  expect(field(() => parseRules({ "a.com": rule({ "X Y": "v" }) }))).toBe('network.rules["a.com"][0].transform.headers["X Y"]');
  expect(field(() => parseRules({ "a.com": rule({ X: "line\r\nbreak" }) }))).toBe('network.rules["a.com"][0].transform.headers["X"]');
  expect(field(() => parseRules({ "a.com": rule({ X: "v".repeat(2049) }) }))).toBe('network.rules["a.com"][0].transform.headers["X"]');
  expect(field(() => parseRules({ "a.com": [{ transform: { headers: {}, body: 1 } }] }))).toBe('network.rules["a.com"][0].transform.body');
  expect(field(() => parseRules({ "a.com": "x" }))).toBe('network.rules["a.com"]');
  expect(parseRules({ "a.com": [] })[0]!.headers).toEqual([]);
});

test("placeholders: ${e2b.secrets.NAME} (trimmed, lower-cased) among literal text; malformed ones and identity tokens are refused", () => {
  const [r] = parseRules({ "a.com": rule({ Authorization: "Bearer ${e2b.secrets. API-Key }", X: "${e2b.secrets.a}${e2b.secrets.b}-${e2b.other}" }) });
  expect(r!.headers[0]!.parts).toEqual([{ text: "Bearer " }, { secret: "api-key" }]);
  expect(r!.headers[1]!.parts).toEqual([{ secret: "a" }, { secret: "b" }, { text: "-${e2b.other}" }]);
  for (const v of ["${e2b.secrets.k", "${e2b.secrets.}", "${e2b.secrets.sec_0123}", "${e2b.secrets.a b}", "${e2b.identity.tokens.t}"]) {
    expect(field(() => parseRules({ "a.com": rule({ X: v }) }))).toBe('network.rules["a.com"][0].transform.headers["X"]');
  }
  expect(maskHeaderValue("Bearer ${e2b.secrets.K}")).toBe("***${e2b.secrets.k}");
  expect(maskHeaderValue("sk-literal")).toBe("***");
});

test("egress proxy: host:port is SOCKS5; socks5:// and http:// name the protocol; errors name the field", () => {
  expect(parseEgressProxy({ address: " 203.0.113.5:1080 " })).toEqual({ protocol: "socks5", host: "203.0.113.5", port: 1080 });
  expect(parseEgressProxy({ address: "http://Proxy.Example:3128", username: "u", password: "p" })).toEqual({ protocol: "http", host: "proxy.example", port: 3128, username: "u", password: "p" });
  expect(parseEgressProxy({ address: "socks5h://p.example:1080", username: "u" })).toEqual({ protocol: "socks5", host: "p.example", port: 1080, username: "u" });
  expect(parseEgressProxy(null)).toBeNull();
  for (const [v, f] of [
    [{ address: "ftp://p:1" }, "network.egressProxy.address"],
    [{ address: "p.example" }, "network.egressProxy.address"],
    [{ address: "p.example:0" }, "network.egressProxy.address"],
    [{ address: "p.example:70000" }, "network.egressProxy.address"],
    [{ address: "0.0.0.0:1080" }, "network.egressProxy.address"],
    [{ address: "u:p@p.example:1080" }, "network.egressProxy.address"],
    [{ address: "p.example:1080", password: "p" }, "network.egressProxy.password"],
    [{ address: "p.example:1080", username: "u".repeat(256) }, "network.egressProxy.username"],
    [{ address: "p.example:1080", type: "socks4" }, "network.egressProxy.type"],
    [{}, "network.egressProxy.address"],
    ["socks5://p:1", "network.egressProxy"],
  ] as const) {
    expect(field(() => parseEgressProxy(v))).toBe(f);
  }
});

test("a real ClientHello (node:tls) gives its server name; partial bytes ask for more; other bytes are not TLS", async () => {
  const hello = await new Promise<Buffer>((resolve) => {
    const srv = net.createServer((s) => {
      s.once("data", (d) => {
        resolve(Buffer.from(d));
        s.destroy();
        srv.close();
      });
    });
    srv.listen(0, "127.0.0.1", () => {
      const c = tls.connect({ host: "127.0.0.1", port: (srv.address() as net.AddressInfo).port, servername: "API.Example.com" });
      c.on("error", () => {});
    });
  });
  expect(parseClientHello(hello)).toEqual({ kind: "hello", serverName: "api.example.com" });
  expect(parseClientHello(hello.subarray(0, 40))).toEqual({ kind: "more" });
  expect(parseClientHello(Buffer.from("GET / HTTP/1.1\r\n"))).toEqual({ kind: "not_tls" });
  // a hello split over two records still parses
  const body = hello.subarray(5);
  const split = Buffer.concat([Buffer.from([22, 3, 1, 0, 10]), body.subarray(0, 10), Buffer.from([22, 3, 1, (body.length - 10) >> 8, (body.length - 10) & 255]), body.subarray(10)]);
  expect(parseClientHello(split)).toEqual({ kind: "hello", serverName: "api.example.com" });
});

test("HTTP/1.1 framing: pipelined requests, Content-Length and chunked bodies kept byte for byte, an upgrade goes raw, smuggling shapes refused", () => {
  const r = new RequestReader();
  const text = "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nhost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nT: 1\r\n\r\nGET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nRAW BYTES";
  // fed one byte at a time: boundaries anywhere
  const evs: Http1Event[] = [];
  for (const b of Buffer.from(text)) evs.push(...r.push(Uint8Array.of(b)));
  const kinds = evs.map((e) => e.kind).join(",");
  expect(kinds.replace(/(body,)+/g, "body*,").replace(/(raw,?)+/g, "raw")).toBe("head,body*,end,head,body*,end,head,raw");
  const heads = evs.filter((e) => e.kind === "head").map((e) => (e as { head: { method: string; target: string } }).head);
  expect(heads.map((h) => `${h.method} ${h.target}`)).toEqual(["POST /a", "GET /b", "GET /ws"]);
  const bodies = Buffer.concat(evs.filter((e) => e.kind === "body").map((e) => (e as { bytes: Uint8Array }).bytes)).toString();
  expect(bodies).toBe("hello3\r\nabc\r\n0\r\nT: 1\r\n\r\n");
  expect(Buffer.concat(evs.filter((e) => e.kind === "raw").map((e) => (e as { bytes: Uint8Array }).bytes)).toString()).toBe("RAW BYTES");
  for (const bad of ["GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", "GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "NOT HTTP\r\n\r\n", "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n"]) {
    expect(new RequestReader().push(Buffer.from(bad)).at(-1)).toMatchObject({ kind: "error", status: 400 });
  }
  expect(new RequestReader(1024).push(Buffer.from(`GET / HTTP/1.1\r\nX: ${"a".repeat(2000)}`)).at(-1)).toMatchObject({ kind: "error", status: 431 });
  const head = { method: "GET", target: "/", version: "HTTP/1.1", headers: [["Host", "x"], ["authorization", "guest's"], ["Accept", "*/*"]] as [string, string][] };
  expect(serializeHead(head, [["Authorization", "Bearer s"]]).toString()).toBe("GET / HTTP/1.1\r\nHost: x\r\nAccept: */*\r\nAuthorization: Bearer s\r\n\r\n");
});

test("redirect chain: rule slots send their intercepted ports, proxy slots every port, never node-local traffic", () => {
  expect(redirectScript("ae-", 10443, [{ hostVeth: "ae-3", allPorts: false, ports: [8443, 443] }, { hostVeth: "ae-1", allPorts: true, ports: [] }])).toBe(
    ["*nat", ":ae-egr - [0:0]", "-A ae-egr -i ae-1 -p tcp -m addrtype ! --dst-type LOCAL -j REDIRECT --to-ports 10443", "-A ae-egr -i ae-3 -p tcp -m addrtype ! --dst-type LOCAL -m multiport --dports 443,8443 -j REDIRECT --to-ports 10443", "COMMIT", ""].join("\n"),
  );
  expect(redirectScript("ae-", 10443, [])).toBe("*nat\n:ae-egr - [0:0]\nCOMMIT\n");
});

test("the node CA: made once (key 0600), kept across opens, its leaves verify for their host with openssl and node:tls", async () => {
  const caDir = join(dir, "ca");
  const ca = await EgressCa.open(caDir, "node-1");
  expect(statSync(join(caDir, "ca.key")).mode & 0o777).toBe(0o600);
  const again = await EgressCa.open(caDir, "node-1");
  expect(again.certPem).toBe(ca.certPem);
  const leaf = await ca.leaf("API.Example.com");
  expect(await ca.leaf("api.example.com")).toBe(leaf);
  writeFileSync(join(dir, "ca.pem"), ca.certPem);
  writeFileSync(join(dir, "leaf.pem"), leaf.cert);
  const v = Bun.spawnSync(["openssl", "verify", "-CAfile", join(dir, "ca.pem"), "-verify_hostname", "api.example.com", "-purpose", "sslserver", join(dir, "leaf.pem")]);
  expect(v.stdout.toString().trim()).toBe(`${join(dir, "leaf.pem")}: OK`);
  const wrong = Bun.spawnSync(["openssl", "verify", "-CAfile", join(dir, "ca.pem"), "-verify_hostname", "other.example.com", join(dir, "leaf.pem")]);
  expect(wrong.exitCode).not.toBe(0);
  // a TLS server with the leaf: a client trusting only the CA connects and sees the host verified
  const srv = tls.createServer({ key: leaf.key, cert: leaf.cert }, (s) => s.end("ok"));
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const got = await new Promise<string>((resolve, reject) => {
    const c = tls.connect({ host: "127.0.0.1", port: (srv.address() as net.AddressInfo).port, servername: "api.example.com", ca: ca.certPem }, () => c.once("data", (d) => resolve(`${c.authorized} ${d}`)));
    c.on("error", reject);
  });
  srv.close();
  expect(got).toBe("true ok");
  // a key file others may read is refused
  Bun.spawnSync(["chmod", "644", join(caDir, "ca.key")]);
  await expect(EgressCa.open(caDir, "node-1")).rejects.toThrow("chmod 600");
});
