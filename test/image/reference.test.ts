/** Image reference parsing as Docker reads names, loopback detection, skopeo error mapping. */
import { expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { classifySkopeo, endpointsFor, formatImageRef, isLoopbackRegistry, parseImageRef, plainRegistrySettings, srcFlags, writeContainersAuth } from "../../src/image/index.ts";

test("parseImageRef: registry, library/ prefix, default tag, digest, bad input", () => {
  expect(parseImageRef("debian")).toEqual({ registry: "docker.io", repository: "library/debian", tag: "latest" });
  expect(parseImageRef("debian:bookworm-slim")).toEqual({ registry: "docker.io", repository: "library/debian", tag: "bookworm-slim" });
  expect(parseImageRef("127.0.0.1:5000/test/img:v1")).toEqual({ registry: "127.0.0.1:5000", repository: "test/img", tag: "v1" });
  expect(parseImageRef("localhost/x")).toEqual({ registry: "localhost", repository: "x", tag: "latest" });
  const d = "sha256:" + "a".repeat(64);
  expect(parseImageRef(`ghcr.io/o/r@${d}`)).toEqual({ registry: "ghcr.io", repository: "o/r", tag: "latest", digest: d });
  expect(formatImageRef(parseImageRef("debian"))).toBe("docker.io/library/debian:latest");
  for (const bad of ["", "UPPER/case", "x@sha256:12", "a/b:c:d", "x:bad tag"]) expect(() => parseImageRef(bad)).toThrow("invalid image reference");
});

test("loopback registries are 127.0.0.0/8, localhost and ::1 only", () => {
  for (const r of ["127.0.0.1:5000", "127.1.2.3", "localhost:80", "[::1]:5000"]) expect(isLoopbackRegistry(r)).toBe(true);
  for (const r of ["10.0.0.1:5000", "docker.io", "128.0.0.1", "localhost.example.com"]) expect(isLoopbackRegistry(r)).toBe(false);
});

test("skopeo failures map to typed codes", () => {
  const c = (err: string) => classifySkopeo("r", "reg", err, 1).code;
  expect(c("reading manifest v1 in reg/r: manifest unknown: manifest unknown")).toBe("image.not_found");
  expect(c("unauthorized: authentication required")).toBe("image.auth");
  expect(c("invalid status code from registry 403 (Forbidden)")).toBe("image.auth");
  // a port holding 401 / 403 is no status code
  expect(c('pinging container registry 10.0.0.1:40312: Get "https://10.0.0.1:40312/v2/": x509: certificate signed by unknown authority')).toBe("image.tls");
  expect(c("dial tcp 10.0.0.1:40113: connect: connection refused")).toBe("image.unreachable");
  expect(c("writing blob: Digest did not match, expected sha256:1, got sha256:2")).toBe("image.digest_mismatch");
  expect(c("http: server gave HTTP response to HTTPS client")).toBe("image.tls");
  // skopeo copy by digest when the endpoint serves another manifest the second time
  expect(c('determining manifest MIME type for docker://m/x@sha256:c8: Manifest does not match provided manifest digest sha256:c8')).toBe("image.digest_mismatch");
  expect(c("dial tcp 127.0.0.1:1: connect: connection refused")).toBe("image.unreachable");
  expect(c('Get "https://reg/v2/": Proxy Authentication Required')).toBe("image.unreachable");
  expect(c("proxyconnect tcp: dial tcp 10.0.0.1:3128: connect: connection refused")).toBe("image.unreachable");
  expect(classifySkopeo("r", "reg", 'time="x" level=fatal msg="reading manifest: \\"quoted\\" unauthorized: authentication required"', 1).message).toBe('registry reg refused access to r: reading manifest: "quoted" unauthorized: authentication required');
  expect(classifySkopeo("r", "reg", "something else", 1).code).toBe("image.pull_failed");
});

test("TLS: verified for every registry but loopback ones and those the config lists; credentials from a 0600 auth file, never argv; extra CAs from a cert dir", () => {
  const f = (ref: string, insecure: string[] = [], authFile?: string, certDir?: string) =>
    srcFlags(endpointsFor(parseImageRef(ref), plainRegistrySettings({ insecure }))[0]!, { ...(authFile ? { authFile } : {}), ...(certDir ? { certDir } : {}) });
  expect(f("127.0.0.1:5000/a")).toEqual(["--src-tls-verify=false", "--src-no-creds"]);
  expect(f("registry.example.com/a")).toEqual(["--src-tls-verify=true", "--src-no-creds"]);
  expect(f("10.0.0.5:5000/a")).toEqual(["--src-tls-verify=true", "--src-no-creds"]);
  expect(f("10.0.0.5:5000/a", ["10.0.0.5:5000"])).toEqual(["--src-tls-verify=false", "--src-no-creds"]);
  expect(f("debian", [], "/x/auth.json")).toEqual(["--src-tls-verify=true", "--src-authfile", "/x/auth.json"]);
  expect(f("debian", [], undefined, "/x/certs")).toEqual(["--src-tls-verify=true", "--src-no-creds", "--src-cert-dir", "/x/certs"]);
  const dir = mkdtempSync(join(tmpdir(), "aenv-auth-"));
  try {
    const p = join(dir, "auth.json");
    writeContainersAuth(p, { "docker.io": { username: "u", password: "p:w" }, "quay.io": { username: "<token>", password: "", identityToken: "idt" } });
    expect(JSON.parse(readFileSync(p, "utf8"))).toEqual({
      auths: { "docker.io": { auth: Buffer.from("u:p:w").toString("base64") }, "quay.io": { auth: Buffer.from("<token>:").toString("base64"), identitytoken: "idt" } },
    });
    expect(statSync(p).mode & 0o777).toBe(0o600);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
