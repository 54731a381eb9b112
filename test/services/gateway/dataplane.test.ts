/** Sandbox host parsing of the gateway: `{port}-{id}.{domain}` with the DNS-label rules. */
import { expect, test } from "bun:test";
import { DNS_LABEL_MAX, dataRoute, hostRoute } from "../../../services/gateway/index.ts";

test("host routes: configured domains only, port 1..65535, lowercase alnum ids, whole label <= 63 chars", () => {
  expect(hostRoute("49983-abc123.sbx.example:8080", ["sbx.example"])).toEqual({ sandboxId: "abc123", port: 49983, via: "host" });
  expect(hostRoute("3000-ABC.SBX.example", ["sbx.example"])).toEqual({ sandboxId: "abc", port: 3000, via: "host" });
  const id58 = "a".repeat(58); // "65535-" (6) + 57 = 63
  expect(hostRoute(`65535-${id58.slice(1)}.d`, ["d"])?.sandboxId).toBe(id58.slice(1));
  expect(`65535-${id58.slice(1)}`.length).toBe(DNS_LABEL_MAX);
  expect(hostRoute(`65535-${id58}.d`, ["d"])).toBeNull(); // 64 characters
  expect(hostRoute("0-abc.d", ["d"])).toBeNull();
  expect(hostRoute("65536-abc.d", ["d"])).toBeNull();
  expect(hostRoute("80-ab-c.d", ["d"])).toBeNull();
  expect(hostRoute("80-abc.x.d", ["d"])).toBeNull();
  expect(hostRoute("80-abc.other", ["d"])).toBeNull();
  expect(hostRoute("abc.d", ["d"])).toBeNull();
});

test("header and path routes; x-agentenv-target-port names the port too; a bad or conflicting port header is reported", () => {
  const req = (h: Record<string, string>, path = "/x") => {
    const r = new Request(`http://gw${path}`, { headers: h });
    return dataRoute(r, new URL(r.url), ["d"]);
  };
  expect(req({ "e2b-sandbox-id": "s1" })).toEqual({ sandboxId: "s1", port: 49983, via: "header" });
  expect(req({ "x-agentenv-sandbox-id": "s1", "x-agentenv-sandbox-port": "8080" })).toEqual({ sandboxId: "s1", port: 8080, via: "header" });
  expect(req({ "e2b-sandbox-id": "s1", "e2b-sandbox-port": "0" })).toBe('invalid sandbox port "0" in header e2b-sandbox-port');
  expect(req({ "x-agentenv-sandbox-id": "s1", "x-agentenv-target-port": "3000" })).toEqual({ sandboxId: "s1", port: 3000, via: "header" });
  expect(req({ "x-agentenv-sandbox-id": "s1", "x-agentenv-target-port": "3000", "e2b-sandbox-port": "3000" })).toEqual({ sandboxId: "s1", port: 3000, via: "header" });
  expect(req({ "x-agentenv-sandbox-id": "s1", "x-agentenv-target-port": "3000", "x-agentenv-sandbox-port": "8080" })).toBe("conflicting sandbox ports (x-agentenv-sandbox-port: 8080, x-agentenv-target-port: 3000): name one port");
  expect(req({ "e2b-sandbox-id": "s1", "x-agentenv-target-port": "70000" })).toBe('invalid sandbox port "70000" in header x-agentenv-target-port');
  expect(req({}, "/proxy/s1/3000/a/b")).toEqual({ sandboxId: "s1", port: 3000, via: "path" });
  expect(req({}, "/sandboxes/s1")).toBeNull();
});
