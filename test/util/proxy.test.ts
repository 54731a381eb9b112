/**
 * The proxy decision of the node's outbound requests (src/util/proxy.ts): explicit settings over
 * the environment, NO_PROXY entries as Go reads them, loopback never proxied, the variables a
 * child gets, and what Bun's own fetch does with the variables installProxyEnv sets (a real
 * listener standing in for the proxy records the requests it receives).
 */
import { expect, test } from "bun:test";
import { installProxyEnv, proxyEnv, proxyFor, proxySettings, redactUrl } from "../../src/util/proxy.ts";

test("explicit [image] proxy wins over the environment; else HTTPS_PROXY / HTTP_PROXY / NO_PROXY, upper case first", () => {
  const env = { HTTPS_PROXY: "http://env:1", http_proxy: "http://low:2", NO_PROXY: "corp.example" };
  expect(proxySettings({ proxy: "http://cfg:3128", noProxy: ["a.example"] }, env)).toEqual({ httpsProxy: "http://cfg:3128", httpProxy: "http://cfg:3128", noProxy: ["a.example", "localhost", "127.0.0.0/8", "::1"] });
  expect(proxySettings({ proxy: "", noProxy: [] }, env)).toEqual({ httpsProxy: "http://env:1", httpProxy: "http://low:2", noProxy: ["corp.example", "localhost", "127.0.0.0/8", "::1"] });
  expect(proxySettings({ proxy: "", noProxy: [] }, { https_proxy: "http://low:1", HTTPS_PROXY: "http://up:1" }).httpsProxy).toBe("http://up:1");
  expect(proxySettings({ proxy: "", noProxy: [] }, {}, ["10.11.0.0/16"])).toEqual({ httpsProxy: "", httpProxy: "", noProxy: ["localhost", "127.0.0.0/8", "::1", "10.11.0.0/16"] });
  expect(() => proxySettings({ proxy: "socks5://x:1", noProxy: [] }, {})).toThrow("must be http://host:port");
  expect(() => proxySettings({ proxy: "not a url", noProxy: [] }, {})).toThrow("is not a URL");
  // a bad proxy's message never shows its password
  expect(() => proxySettings({ proxy: "ftp://u:hunter2@x:1", noProxy: [] }, {})).toThrow("ftp://u:***@x:1");
});

test("proxyFor: scheme picks the proxy; loopback, NO_PROXY hosts, suffixes, IPs, CIDRs, ports and * go directly", () => {
  const s = proxySettings({ proxy: "", noProxy: [] }, { HTTPS_PROXY: "http://p:3128", HTTP_PROXY: "http://hp:80", NO_PROXY: "corp.example,.internal,10.0.0.0/8,192.0.2.7,mirror.example:5000,[fd00::1]" });
  const f = (u: string) => proxyFor(u, s);
  expect(f("https://registry-1.docker.io/v2/")).toBe("http://p:3128");
  expect(f("http://registry.example/v2/")).toBe("http://hp:80");
  for (const u of ["https://127.0.0.1:5000/", "https://localhost/", "https://x.localhost/", "https://[::1]:5000/", "https://127.9.9.9/"]) expect([u, f(u)]).toEqual([u, null]);
  expect(f("https://corp.example/")).toBeNull();
  expect(f("https://a.b.corp.example/")).toBeNull(); // a host entry covers its subdomains
  expect(f("https://notcorp.example/")).toBe("http://p:3128");
  expect(f("https://x.internal/")).toBeNull();
  expect(f("https://10.200.3.4:443/")).toBeNull();
  expect(f("https://11.0.0.1/")).toBe("http://p:3128");
  expect(f("https://192.0.2.7/")).toBeNull();
  expect(f("https://mirror.example:5000/")).toBeNull();
  expect(f("https://mirror.example/")).toBe("http://p:3128"); // the entry names port 5000 only
  expect(f("https://[fd00::1]:443/")).toBeNull();
  expect(f("https://[fd00::2]:443/")).toBe("http://p:3128");
  expect(proxyFor("https://anything/", proxySettings({ proxy: "http://p:1", noProxy: ["*"] }, {}))).toBeNull();
  expect(proxyFor("https://x/", proxySettings({ proxy: "", noProxy: [] }, {}))).toBeNull();
});

test("proxyEnv gives a child both cases, empty where there is no proxy; redactUrl hides passwords", () => {
  const s = proxySettings({ proxy: "", noProxy: [] }, { HTTPS_PROXY: "http://u:pw@p:3128" });
  expect(proxyEnv(s)).toEqual({ HTTPS_PROXY: "http://u:pw@p:3128", https_proxy: "http://u:pw@p:3128", HTTP_PROXY: "", http_proxy: "", NO_PROXY: "localhost,127.0.0.0/8,::1", no_proxy: "localhost,127.0.0.0/8,::1" });
  expect(redactUrl("http://u:pw@p:3128")).toBe("http://u:***@p:3128");
  expect(redactUrl("http://p:3128")).toBe("http://p:3128");
});

test("redactUrl hides a password with an unencoded @ whole (URL parsers end the user info at the last @ before the path)", () => {
  expect(new URL("http://user:p@ss@proxy:3128").hostname).toBe("proxy");
  expect(redactUrl("http://user:p@ss@proxy:3128")).toBe("http://user:***@proxy:3128");
  expect(redactUrl("redis://:pa@ss@h:6379/0")).toBe("redis://:***@h:6379/0");
  // an @ after the authority (path, query) is not part of the password
  expect(redactUrl("http://u:pw@proxy:3128/x@y")).toBe("http://u:***@proxy:3128/x@y");
  expect(redactUrl("http://proxy:3128/x@y")).toBe("http://proxy:3128/x@y");
  expect(redactUrl("http://u:pw@proxy:3128?a=b@c")).toBe("http://u:***@proxy:3128?a=b@c");
  expect(() => proxySettings({ proxy: "", noProxy: [] }, { HTTPS_PROXY: "socks5://u:top@secret@h:1" })).toThrow('proxy "socks5://u:***@h:1" must be');
});

test("installProxyEnv: Bun's fetch then proxies what proxyFor proxies and reaches loopback directly", async () => {
  const seen: string[] = [];
  const proxy = Bun.listen({
    hostname: "127.0.0.1",
    port: 0,
    socket: {
      data(sock, d) {
        seen.push(d.toString().split("\r\n")[0]!);
        sock.write("HTTP/1.1 599 Proxied\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        sock.end();
      },
    },
  });
  const target = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("direct") });
  const env: Record<string, string | undefined> = { ...process.env };
  const saved = { ...process.env };
  try {
    const s = proxySettings({ proxy: `http://127.0.0.1:${proxy.port}`, noProxy: ["direct.invalid"] }, {});
    installProxyEnv(s, process.env);
    expect(process.env.NO_PROXY).toBe("direct.invalid,localhost,127.0.0.0/8,::1");
    // loopback: direct, though a proxy is set
    expect(await (await fetch(`http://127.0.0.1:${target.port}/`)).text()).toBe("direct");
    // another host: through the proxy (it answers 599 itself)
    expect((await fetch(`http://registry.invalid:${target.port}/v2/`)).status).toBe(599);
    expect(seen).toEqual([`GET http://registry.invalid:${target.port}/v2/ HTTP/1.1`]);
    // NO_PROXY: direct (the name does not resolve: a DNS failure, not the proxy's answer)
    await expect(fetch("http://direct.invalid/")).rejects.toThrow();
    expect(seen.length).toBe(1);
    // no proxy: the variables are removed
    installProxyEnv(proxySettings({ proxy: "", noProxy: [] }, {}), env);
    expect(env.HTTPS_PROXY).toBeUndefined();
    expect(env.NO_PROXY).toBe("localhost,127.0.0.0/8,::1");
  } finally {
    for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
    Object.assign(process.env, saved);
    proxy.stop(true);
    target.stop(true);
  }
});
