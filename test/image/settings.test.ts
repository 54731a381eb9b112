/**
 * `[image]` settings: Docker Hub's aliases, the endpoints a reference is pulled from (mirrors in
 * order, path prefixes, mirror-only), the checks at start-up (bad mirror, mirror-only without
 * mirrors, missing files), the deprecated `[template_build] insecure_registries`, and Docker
 * config.json credentials (base64 auth, username/password, identity tokens, key forms, bad files).
 */
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { authFor, endpointsFor, normalizeAuthKey, parseImageRef, readAuthFile, redact, registrySettings, secretsOf } from "../../src/image/index.ts";

const TMP = mkdtempSync(join(tmpdir(), "aenv-imgset-"));
afterAll(() => rmSync(TMP, { recursive: true, force: true }));

const settings = (image: Record<string, unknown>, extra: Record<string, unknown> = {}, warn: (m: string) => void = () => {}) =>
  registrySettings(loadConfig({ env: {}, tree: { image, ...extra } }), warn);

test("Docker Hub's aliases and the implicit library/ read as docker.io/library/<name>", () => {
  for (const r of ["ubuntu:22.04", "docker.io/ubuntu:22.04", "docker.io/library/ubuntu:22.04", "index.docker.io/library/ubuntu:22.04", "registry-1.docker.io/ubuntu:22.04", "INDEX.DOCKER.IO/ubuntu:22.04".replace("INDEX.DOCKER.IO", "index.docker.io")]) {
    expect([r, parseImageRef(r)]).toEqual([r, { registry: "docker.io", repository: "library/ubuntu", tag: "22.04" }]);
  }
});

test("endpoints: mirrors in order (path prefixes kept), then the registry unless mirror-only; plain HTTP for loopback and listed hosts", () => {
  const s = settings({
    registry_mirrors: { "index.docker.io": ["127.0.0.1:5001", "harbor.example/dockerhub-proxy"], "ghcr.io": ["10.0.0.9:5000"] },
    mirror_only: ["docker.io"],
    insecure_registries: ["10.0.0.9:5000"],
  });
  expect(s.mirrors).toEqual({ "docker.io": ["127.0.0.1:5001", "harbor.example/dockerhub-proxy"], "ghcr.io": ["10.0.0.9:5000"] });
  expect(endpointsFor(parseImageRef("ubuntu:22.04"), s)).toEqual([
    { host: "127.0.0.1:5001", repository: "library/ubuntu", mirror: true, insecure: true, label: "mirror 127.0.0.1:5001" },
    { host: "harbor.example", repository: "dockerhub-proxy/library/ubuntu", mirror: true, insecure: false, label: "mirror harbor.example/dockerhub-proxy" },
  ]);
  expect(endpointsFor(parseImageRef("ghcr.io/o/r:1"), s)).toEqual([
    { host: "10.0.0.9:5000", repository: "o/r", mirror: true, insecure: true, label: "mirror 10.0.0.9:5000" },
    { host: "ghcr.io", repository: "o/r", mirror: false, insecure: false, label: "registry ghcr.io" },
  ]);
  expect(endpointsFor(parseImageRef("quay.io/a/b"), s)).toEqual([{ host: "quay.io", repository: "a/b", mirror: false, insecure: false, label: "registry quay.io" }]);
});

test("start-up checks: a bad mirror, mirror_only without mirrors, missing ca_path / auth_file, a bad proxy; the old insecure_registries is read and said deprecated", () => {
  const code = (f: () => unknown) => {
    try {
      f();
    } catch (e) {
      return [(e as { code: string }).code, (e as Error).message];
    }
    return null;
  };
  expect(code(() => settings({ registry_mirrors: { "docker.io": ["https://m.example"] } }))).toEqual(["image.bad_config", '[image] registry_mirrors: "docker.io": mirror "https://m.example" is not host[:port][/path prefix]']);
  expect(code(() => settings({ mirror_only: ["docker.io"] }))).toEqual(["image.bad_config", '[image] mirror_only: "docker.io" has no mirrors in [image.registry_mirrors]: its images could never be pulled']);
  expect(code(() => settings({ ca_path: join(TMP, "nope.pem") }))?.[0]).toBe("image.bad_config");
  expect(code(() => settings({ auth_file: join(TMP, "nope.json") }))?.[0]).toBe("image.bad_config");
  expect(code(() => settings({ proxy: "socks5://p:1" }))?.[0]).toBe("image.bad_config");
  const warned: string[] = [];
  const s = settings({ insecure_registries: ["a.example:5000"] }, { template_build: { insecure_registries: ["b.example"] } }, (m) => warned.push(m));
  expect(s.insecure).toEqual(["a.example:5000", "b.example"]);
  expect(warned).toEqual(["[template_build] insecure_registries is deprecated: read as [image] insecure_registries (move it there)"]);
  settings({ insecure_registries: ["a.example:5000"] }, {}, (m) => warned.push(m));
  expect(warned.length).toBe(1);
});

test("Docker config.json: base64 auth, username/password, identity tokens; key forms normalised; longest key wins; helpers reported; bad files refused without quoting them", () => {
  const b64 = (s: string) => Buffer.from(s).toString("base64");
  const p = join(TMP, "config.json");
  writeFileSync(
    p,
    JSON.stringify({
      auths: {
        "https://index.docker.io/v1/": { auth: b64("hubuser:hub:pass") },
        "registry.example:5443": { username: "alice", password: "s3cret" },
        "https://registry.example:5443/team": { auth: b64("team:teampw") },
        "quay.io": { auth: b64("<token>:"), identitytoken: "idtok-123" },
        "empty.example": {},
      },
      credsStore: "desktop",
    }),
  );
  const { entries, helpers } = readAuthFile(p);
  expect(entries).toEqual({
    "docker.io": { username: "hubuser", password: "hub:pass" },
    "registry.example:5443": { username: "alice", password: "s3cret" },
    "registry.example:5443/team": { username: "team", password: "teampw" },
    "quay.io": { username: "<token>", password: "", identityToken: "idtok-123" },
  });
  expect(helpers).toEqual(["credsStore"]);
  expect(authFor(entries, "registry.example:5443", "team/app")?.username).toBe("team");
  expect(authFor(entries, "registry.example:5443", "other/app")?.username).toBe("alice");
  expect(authFor(entries, "registry-1.docker.io", "library/ubuntu")?.username).toBe("hubuser");
  expect(authFor(entries, "nobody.example")).toBeUndefined();
  expect(normalizeAuthKey("http://LocalHost:5000/")).toBe("localhost:5000");
  // bad files: the message names the file, never its content
  const bad = (text: string) => {
    const f = join(TMP, `bad-${Math.random()}.json`);
    writeFileSync(f, text);
    try {
      readAuthFile(f);
    } catch (e) {
      return [(e as { code: string }).code, (e as Error).message.replace(f, "F")];
    }
    return null;
  };
  expect(bad('{"auths": {"x": {"auth": "hunter2-not-json')).toEqual(["image.bad_config", "[image] auth_file F: not valid JSON"]);
  expect(bad("[]")).toEqual(["image.bad_config", "[image] auth_file F: not a JSON object"]);
  expect(bad(JSON.stringify({ auths: { x: { auth: b64("no-colon-hunter2") } } }))).toEqual(["image.bad_config", '[image] auth_file F: auths entry "x": "auth" is not base64 of user:password']);
  // redaction covers the password, the Basic value and identity tokens
  const secrets = secretsOf(Object.values(entries));
  const line = `Authorization: Basic ${b64("alice:s3cret")} pw=s3cret token=idtok-123`;
  expect(redact(line, secrets)).toBe("Authorization: Basic *** pw=*** token=***");
});
