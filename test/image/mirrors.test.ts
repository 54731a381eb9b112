/**
 * Registry mirrors with real parts: Debian's docker-registry instances on 127.0.0.1 serving a
 * small image the test makes, pushed as `library/ubuntu:22.04` (what `ubuntu:22.04` names on
 * Docker Hub) — standing in for a pull-through cache of Docker Hub. With docker.io mirror-only, every
 * spelling of the name pulls from the mirror and Docker Hub is never asked (this machine cannot
 * reach it: a try would fail the test); a dead first mirror falls through to the second with a
 * progress line naming it; a Harbor-style path prefix; a registry that is not mirror-only is
 * reached after its mirrors fail; every endpoint failing names each one. A mirror that serves
 * another manifest for a pinned @sha256: digest (a test proxy in front of a real registry,
 * answering the pinned digest with another image's manifest) fails the pull naming both digests;
 * through the same mirror a tag it resolves honestly fails when the copy by that digest gets the lie.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { plainRegistrySettings, pullImage, type PullOptions, type RegistrySettings } from "../../src/image/index.ts";
import { pushImage, startRegistry, type TestRegistry } from "./registry.ts";

let mirror: TestRegistry;
let prefixed: TestRegistry;
let origin: TestRegistry;
let liar: ReturnType<typeof Bun.serve>;
let work: string;
let ubuntu: { digest: string };
let other: { digest: string };
let prefixedImage: { digest: string; dir: string };

/** A port nothing listens on (a dead mirror). */
async function deadPort(): Promise<number> {
  const s = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const p = s.port;
  s.stop(true);
  return p;
}

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), "aenv-mirrors-"));
  [mirror, prefixed, origin] = await Promise.all([startRegistry(), startRegistry(), startRegistry()]);
  const l = join(work, "l");
  mkdirSync(join(l, "etc"), { recursive: true });
  writeFileSync(join(l, "etc/os-release"), 'NAME="Ubuntu (test image)"\nVERSION_ID="22.04"\n');
  writeFileSync(join(l, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n");
  const o = join(work, "o");
  mkdirSync(join(o, "etc"), { recursive: true });
  writeFileSync(join(o, "etc/os-release"), 'NAME="another image"\n');
  const pushed = await pushImage(mirror.host, "library/ubuntu:22.04", [{ dir: l, compression: "gzip" }]);
  ubuntu = pushed;
  const pushedOther = await pushImage(mirror.host, "library/ubuntu:other", [{ dir: o, compression: "gzip" }]);
  other = pushedOther;
  prefixedImage = await pushImage(prefixed.host, "dockerhub-proxy/library/ubuntu:22.04", [{ dir: l, compression: "gzip" }]);
  rmSync(prefixedImage.dir, { recursive: true, force: true });
  await pushImage(origin.host, "team/app:v1", [{ dir: l, compression: "gzip" }]);
  for (const d of [pushed.dir, pushedOther.dir]) rmSync(d, { recursive: true, force: true });
  // a mirror that answers the pinned digest of library/ubuntu with the manifest of :other
  liar = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      const u = new URL(req.url);
      const path = u.pathname === `/v2/library/ubuntu/manifests/${ubuntu.digest}` ? "/v2/library/ubuntu/manifests/other" : u.pathname;
      const r = await fetch(`http://${mirror.host}${path}${u.search}`, { method: req.method, headers: req.headers, redirect: "manual" });
      return new Response(req.method === "HEAD" ? null : await r.arrayBuffer(), { status: r.status, headers: r.headers });
    },
  });
}, 60_000);

afterAll(async () => {
  liar?.stop(true);
  await Promise.all([mirror?.stop(), prefixed?.stop(), origin?.stop()]);
  rmSync(work, { recursive: true, force: true });
});

let homes = 0;
function opts(ref: string, registries: RegistrySettings, lines: string[] = []): PullOptions {
  return { homePath: join(work, `home${++homes}`), ref, registries, headroomMiB: 16, minDiskMiB: 32, toolTimeoutMs: 120_000, manifestTimeoutMs: 20_000, onProgress: (l) => lines.push(l) };
}

test("docker.io mirror-only: ubuntu:22.04 (and its other spellings) pull from the loopback mirror; Docker Hub is never asked", async () => {
  const s = plainRegistrySettings({ mirrors: { "docker.io": [mirror.host] }, mirrorOnly: ["docker.io"] });
  const lines: string[] = [];
  const p = await pullImage(opts("ubuntu:22.04", s, lines));
  expect(p.digest).toBe(ubuntu.digest);
  expect(p.ref).toBe("docker.io/library/ubuntu:22.04");
  expect(p.pulled).toBe(true);
  expect(lines).toContain(`resolving docker.io/library/ubuntu:22.04 on mirror ${mirror.host}`);
  expect(lines.some((l) => l.startsWith(`pulling docker.io/library/ubuntu:22.04 from mirror ${mirror.host} (`))).toBe(true);
  for (const ref of ["docker.io/library/ubuntu:22.04", "index.docker.io/library/ubuntu:22.04", "registry-1.docker.io/ubuntu:22.04", `ubuntu@${ubuntu.digest}`]) {
    expect([ref, (await pullImage(opts(ref, s))).digest]).toEqual([ref, ubuntu.digest]);
  }
}, 120_000);

test("a dead first mirror falls through to the second, naming the dead one", async () => {
  const dead = `127.0.0.1:${await deadPort()}`;
  const s = plainRegistrySettings({ mirrors: { "docker.io": [dead, mirror.host] }, mirrorOnly: ["docker.io"] });
  const lines: string[] = [];
  const p = await pullImage(opts("ubuntu:22.04", s, lines));
  expect(p.digest).toBe(ubuntu.digest);
  const fell = lines.filter((l) => l.startsWith(`mirror ${dead} failed (image.unreachable): `));
  expect(fell.length).toBe(1);
  expect(fell[0]).toEndWith(`; trying mirror ${mirror.host}`);
}, 120_000);

test("a Harbor-style mirror with a path prefix; a registry that is not mirror-only is reached after its mirrors fail", async () => {
  const viaPrefix = await pullImage(opts("ubuntu:22.04", plainRegistrySettings({ mirrors: { "docker.io": [`${prefixed.host}/dockerhub-proxy`] }, mirrorOnly: ["docker.io"] })));
  expect(viaPrefix.digest).toBe(prefixedImage.digest);
  // the origin's own mirror does not have team/app: not found there, then the origin serves it
  const lines: string[] = [];
  const p = await pullImage(opts(`${origin.host}/team/app:v1`, plainRegistrySettings({ mirrors: { [origin.host]: [mirror.host] } }), lines));
  expect(p.pulled).toBe(true);
  expect(lines.some((l) => l.startsWith(`mirror ${mirror.host} failed (image.not_found): `) && l.endsWith(`; trying registry ${origin.host}`))).toBe(true);
}, 120_000);

test("every endpoint failing: one error naming each mirror and that the mirror-only registry was not tried; nothing cached", async () => {
  const [d1, d2] = [`127.0.0.1:${await deadPort()}`, `127.0.0.1:${await deadPort()}`];
  const o = opts("ubuntu:22.04", plainRegistrySettings({ mirrors: { "docker.io": [d1, d2] }, mirrorOnly: ["docker.io"] }));
  const err = await pullImage(o).then(() => null, (e) => e);
  expect(err).toMatchObject({ code: "image.unreachable", details: { ref: "docker.io/library/ubuntu:22.04", endpoints: [{ endpoint: `mirror ${d1}`, code: "image.unreachable" }, { endpoint: `mirror ${d2}`, code: "image.unreachable" }] } });
  expect(err.message).toStartWith(`pulling docker.io/library/ubuntu:22.04 failed on every endpoint: mirror ${d1}: registry 127.0.0.1:`);
  expect(err.message).toEndWith("; registry docker.io itself not tried ([image] mirror_only)");
  expect(require("node:fs").readdirSync(join(o.homePath, "images"))).toEqual([]);
}, 120_000);

test("a mirror serving another manifest for a pinned @sha256: digest fails the pull naming both digests, without falling through", async () => {
  expect(other.digest).not.toBe(ubuntu.digest);
  // the honest mirror is listed second: a digest mismatch must not be routed around
  const s = plainRegistrySettings({ mirrors: { "docker.io": [`127.0.0.1:${liar.port}`, mirror.host] }, mirrorOnly: ["docker.io"] });
  const lines: string[] = [];
  const o = opts(`ubuntu@${ubuntu.digest}`, s, lines);
  const err = await pullImage(o).then(() => null, (e) => e);
  expect(err).toMatchObject({ code: "image.digest_mismatch", details: { expected: ubuntu.digest, actual: other.digest, endpoint: `mirror 127.0.0.1:${liar.port}` } });
  expect(err.message).toBe(`mirror 127.0.0.1:${liar.port} served a manifest with digest ${other.digest} for docker.io/library/ubuntu@${ubuntu.digest}, which pins ${ubuntu.digest}`);
  expect(lines.some((l) => l.includes(`trying mirror ${mirror.host}`))).toBe(false);
  expect(require("node:fs").readdirSync(join(o.homePath, "images"))).toEqual([]);
  // a tag: the liar answers it honestly, then serves its lie when the image is copied by that
  // digest; the copy checks the manifest against the digest the tag resolved to, and the pull ends
  const tagged = opts("ubuntu:22.04", s);
  const lied = await pullImage(tagged).then(() => null, (e) => e);
  expect(lied).toMatchObject({ code: "image.digest_mismatch", details: { registry: `127.0.0.1:${liar.port}` } });
  expect(lied.message).toContain(`Manifest does not match provided manifest digest ${ubuntu.digest}`);
  expect(require("node:fs").readdirSync(join(tagged.homePath, "images"))).toEqual([]);
}, 120_000);
