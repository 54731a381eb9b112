/**
 * Template builds end to end with the real parts: Debian's docker-registry inside the node's
 * network namespace holding a Debian image this test packs (one zstd layer made from the test
 * home's Debian tree), `agentenv server` (API, catalog, image pull with skopeo + umoci, build
 * VMs under QEMU with envd, per-step overlaybd layers), a busybox image without glibc, and the
 * unmodified e2b@2.51.0 SDK's
 * Template builder (test/e2e/fixtures/template-build.ts). One node, one registry.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { debianTree, pushImage, startRegistry, type TestRegistry } from "../image/registry.ts";
import { nodeForFile, qemuPidsUnder, TEST_HOME } from "./world.ts";

// a short ready bound, so the never-ready build fails in seconds (python's server is up well within it);
// garbage collection with no cache budget and no minimum age: the template delete mid-test
// removes every layer only the cache keeps, never the paused sandbox's
const node = nodeForFile({ AENV__template_build__ready_timeout_ms: "20000", AENV__template_build__gc_min_age_ms: "0", AENV__template_build__cache_max_bytes: "0" });
let reg: TestRegistry | undefined;

beforeAll(async () => {
  const world = node();
  reg = await startRegistry({ netns: world.ns });
  const tree = debianTree(TEST_HOME);
  // a busybox image: no glibc, no bash; envd runs from the tools drive on its own glibc
  const bb = mkdtempSync(join(tmpdir(), "aenv-busybox-"));
  mkdirSync(join(bb, "bin"));
  mkdirSync(join(bb, "etc"));
  copyFileSync("/bin/busybox", join(bb, "bin", "busybox"));
  for (const applet of Bun.spawnSync(["/bin/busybox", "--list"]).stdout.toString().split("\n").filter((a) => a && a !== "busybox")) symlinkSync("busybox", join(bb, "bin", applet));
  writeFileSync(join(bb, "etc", "passwd"), "root:x:0:0:root:/root:/bin/sh\n");
  writeFileSync(join(bb, "etc", "group"), "root:x:0:\n");
  rmSync((await pushImage(reg.host, "test/busybox:v1", [{ dir: bb, compression: "gzip" }], {}, undefined, world.ns)).dir, { recursive: true, force: true });
  rmSync(bb, { recursive: true, force: true });
  // a "distroless" image: one static program, no shell, no /bin at all
  const dl = mkdtempSync(join(tmpdir(), "aenv-distroless-"));
  mkdirSync(join(dl, "app"));
  mkdirSync(join(dl, "etc"));
  copyFileSync("/bin/busybox", join(dl, "app", "busybox")); // run by name, no applet links, no /bin
  writeFileSync(join(dl, "etc", "passwd"), "root:x:0:0:root:/root:/sbin/nologin\n");
  rmSync((await pushImage(reg.host, "test/distroless:v1", [{ dir: dl, compression: "gzip" }], { Env: ["PATH=/app"] }, undefined, world.ns)).dir, { recursive: true, force: true });
  rmSync(dl, { recursive: true, force: true });
  const img = await pushImage(reg.host, "test/deb:v1", [{ dir: tree.dir, paths: tree.paths, compression: "zstd" }], { Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"] }, undefined, world.ns);
  rmSync(img.dir, { recursive: true, force: true });
}, 180_000);

afterAll(async () => {
  await reg?.stop();
});

test("e2b SDK Template: fromImage build, create answers at once, warm rebuild cached, failing step, Dockerfile, delete", async () => {
  const world = node();
  const o = await world.client("template-build.ts", [reg!.host], 900_000);
  console.log(`template e2e ms: ${JSON.stringify(o.ms)}`);
  // first build: every step ran, the image was pulled, the ready check passed
  expect(o.b1.templateId).toMatch(/^[a-z0-9]{20}$/);
  expect(o.b1.name).toBe("e2e-app");
  const logs1 = o.logs1 as string[];
  expect(logs1.some((l) => l.startsWith(`[base] FROM ${reg!.host}/test/deb:v1`))).toBe(true);
  expect(logs1.some((l) => l.startsWith("pulling "))).toBe(true);
  for (let i = 1; i <= 5; i++) expect(logs1.some((l) => l.startsWith(`[builder ${i}/5] `))).toBe(true);
  expect(logs1.some((l) => l.startsWith("CACHED"))).toBe(false);
  expect(logs1.some((l) => l.startsWith("[finalize] READY"))).toBe(true);
  expect(logs1.some((l) => /^\[finalize\] SNAPSHOT [a-z0-9]{20} committed \(memory \d+\.\d MiB\)$/.test(l))).toBe(true);
  // sandboxes of the build are restores of its snapshot: the same start command token and pid in two
  const guests = o.guests as string[];
  expect(guests[0]).toMatch(/^[0-9a-f-]{36}\n(\d+\n)+$/);
  expect(guests[1]).toBe(guests[0]);
  // the sandbox: files, owner, env, workdir, user, and the start command answering on 8080
  expect(o.proxied).toEqual({ status: 200, body: "one\n" });
  expect(o.run.exitCode).toBe(0);
  expect(o.run.stdout).toBe("one\nprint('main')\ntwo\nm1 user /opt/app\n/opt/app\nm1\nuser\nuser 644\nrunning\n");
  // warm rebuild: same template, new build, every step from the cache, nothing pulled
  expect(o.b2.templateId).toBe(o.b1.templateId);
  expect(o.b2.buildId).not.toBe(o.b1.buildId);
  const logs2 = o.logs2 as string[];
  for (let i = 1; i <= 5; i++) expect(logs2.some((l) => l.startsWith(`CACHED [builder ${i}/5] `))).toBe(true);
  // the files check: first build absent (an upload URL, uploaded), rebuild present (nothing uploaded);
  // later COPY builds (Dockerfile) follow
  expect((o.filesAnswers as unknown[]).slice(0, 2)).toEqual([
    { status: 201, present: false, url: true },
    { status: 201, present: true, url: true },
  ]);
  expect(logs1).toContain("Uploaded 'app/'");
  expect(logs2).toContain("Skipping upload of 'app/', already cached");
  expect(logs2.some((l) => l.startsWith("pulling "))).toBe(false);
  expect(logs2.some((l) => /: cached$/.test(l))).toBe(true);
  expect(logs2.some((l) => /^CACHED \[finalize\] START cat \/proc\/sys\/kernel\/random\/uuid > \/tmp\/started && python3 -m http.server 8080 READY .* SNAPSHOT [a-z0-9]{20}$/.test(l))).toBe(true);
  expect(logs2.some((l) => l.startsWith("booting the build VM"))).toBe(false);
  // failing step: BuildError with the command's output and the step named
  expect(o.failed.name).toBe("BuildError");
  expect(o.failed.message).toContain("step 2: RUN echo boom >&2; exit 3 failed with exit code 3: boom");
  // Dockerfile: FROM/RUN/COPY/ENV/WORKDIR/USER
  // a cached step, then the same step with skipCache() run again (a new layer beside the old one)
  expect(o.cachedLogs).toEqual([expect.stringMatching(/^CACHED \[builder 1\/1\] RUN echo ok \[/)]);
  expect(o.forcedLogs).toEqual([expect.stringMatching(/^\[builder 1\/1\] RUN echo ok \[/), "ok"]);
  // fromTemplate: the child's sandbox has the parent's files, env and workdir, without the parent's start command
  expect(o.child).toBe("one\nprint('main')\ntwo\nm1 user /opt/app\n/opt/app\nm1\nno start command\n");
  // an unknown image and a ready check that never passes end in error naming base / finalize
  expect(o.unknownImage.name).toBe("BuildError");
  expect(o.unknownImage.message).toContain(`image ${reg!.host}/test/nope:v1 not found`);
  expect(o.neverReady.name).toBe("BuildError");
  expect(o.neverReady.message).toContain('ready command "test -f /nonexistent" did not succeed within 20000 ms');
  expect(o.failedStatus).toEqual({ status: "error", step: "finalize" });
  // distroless (no shell, no tools): steps, start command and ready check run on the tools drive's busybox and ss
  expect(o.distroless).toEqual({ status: 200, body: "static\n" });
  // busybox (no glibc): built and booted with envd running from the tools drive
  expect(o.busybox).toBe("hi from busybox\nno glibc in the image\nuser\n");
  expect(o.docker).toBe("from-dockerfile\nprint('main')\n/srv/app\nhello docker\nroot\n");
  // a paused sandbox resumes on the layers it started with after its template was rebuilt and deleted
  expect(o.pinned).toEqual({ afterRebuild: "kept\nhi from busybox\n", afterDelete: "kept\n", templateGone: true });
  // the CLI's Dockerfile build: the glob's matches only, .dockerignore honoured, USER made a new
  // account (the RUN steps check), ready
  expect(o.cliBuild.code).toBe(0);
  expect(o.cliBuild.stdout).toMatch(/^cli-df ready: template [a-z0-9]{20} build [0-9a-f-]{36}\n$/);
  expect(o.cliBuild.stderr).toMatch(/uploading COPY src\/\*\.py \(/);
  expect(o.cliOutside.code).toBe(1);
  expect(o.cliOutside.stderr).toContain("COPY ../secret.txt: outside the build context");
  expect(o.cliPull.code).toBe(0);
  expect(o.cliPull.stdout).toMatch(/^cli-pulled ready: template [a-z0-9]{20} build [0-9a-f-]{36}\n$/);
  expect(o.cliPull.stderr).toMatch(/\[\s*\d+\.\ds\] \[base\] FROM /);
  expect(o.cliPull.stderr).toMatch(/: cached\n/);
  expect(o.tagsBefore).toEqual(["default"]);
  // the SDK's assignTags / removeTags: tags on the default tag's build (the rebuild), one removed again
  expect(o.assigned).toEqual({ buildId: o.b2.buildId, tags: ["stable", "prod"] });
  expect(o.tagsAssigned).toEqual([["default", o.b2.buildId], ["prod", o.b2.buildId], ["stable", o.b2.buildId]]);
  expect(o.tagsRemoved).toEqual([["default", o.b2.buildId], ["stable", o.b2.buildId]]);
  expect(o.removeMissing).toEqual({ name: "TemplateError", message: "404: template 'e2e-app' has no tag nope" });
  expect(o.existsBefore).toBe(true);
  expect(o.deleted).toBe(true);
  expect(o.existsAfter).toBe(false);
  // nothing left running or half made
  expect(qemuPidsUnder(world.home, world.memDir)).toEqual([]);
  const layers = readdirSync(join(world.home, "catalog", "layers"));
  expect(layers.filter((f) => !/^[0-9a-f]{64}\.[0-9a-f]{8}\.layer$/.test(f))).toEqual([]);
  expect(existsSync(join(world.home, "sandboxes")) ? readdirSync(join(world.home, "sandboxes")).filter((d) => d.startsWith("build-")) : []).toEqual([]);
  // the snapshots of deleted templates' builds were released with them; a kept template's stays
  const manifests = join(world.home, "snapshots", "manifests");
  const snapshotsOf = (templateId: string) =>
    readdirSync(manifests)
      .filter((f) => f.endsWith(".json"))
      .filter((f) => JSON.parse(readFileSync(join(manifests, f), "utf8")).source.templateId === templateId);
  expect(snapshotsOf(o.b1.templateId)).toEqual([]);
  expect(snapshotsOf(o.b3.templateId).length).toBe(1);
}, 1_200_000);
