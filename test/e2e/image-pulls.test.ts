/**
 * Air-gapped and enterprise image pulls end to end, real parts only: `agentenv server` in its
 * network namespace (nothing but loopback and one extra address there: no registry on the
 * internet is reachable), Debian's docker-registry as the node's docker.io mirror on 127.0.0.1
 * holding a small image this test pushes under Docker Hub's name `library/ubuntu:22.04` (a
 * busybox tree with an /etc/os-release; not Ubuntu's own bytes), a dead mirror listed before it,
 * docker.io mirror-only; and a private docker-registry behind TLS (a test CA, `[image] ca_path`)
 * and htpasswd (`[image] auth_file`, a Docker config.json) on a non-loopback address. The
 * unmodified e2b SDK (./fixtures/image-pulls.ts) builds `fromImage('ubuntu:22.04')` and runs a
 * sandbox of it, builds from the private registry, and fails clearly with a wrong password and
 * with a pinned digest a mirror (../image/fixtures/lying-mirror.ts) answers with another manifest;
 * no password shows in the node's log (debug level), the build logs or the node's data directory.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import type { Subprocess } from "bun";
import { join } from "node:path";
import { makeTestCa, pushImage, startRegistry, type TestRegistry } from "../image/registry.ts";
import { logLines, nodeForFile } from "./world.ts";

const PRIV = "10.233.0.1";
const creds = { username: "builder", password: "pw-Rt5-never-logged" };
const WRONG = "wrong-Mz9-never-logged";
const work = mkdtempSync(join(tmpdir(), "aenv-e2e-images-"));
const ca = makeTestCa(work, [PRIV]);
const authFile = join(work, "config.json");
writeFileSync(authFile, JSON.stringify({ auths: { [`https://${PRIV}:5443`]: { auth: Buffer.from(`${creds.username}:${creds.password}`).toString("base64") } } }));

const node = nodeForFile({
  AENV_LOG_LEVEL: "debug",
  // the dead mirror first: every docker.io pull falls through it
  "AENV__image__registry_mirrors__docker.io": "127.0.0.1:5001,127.0.0.1:5000",
  // registry.example's only mirror answers ubuntu's pinned digest with another image's manifest
  "AENV__image__registry_mirrors__registry.example": "127.0.0.1:5002",
  AENV__image__mirror_only: "docker.io,registry.example",
  AENV__image__ca_path: ca.ca,
  AENV__image__auth_file: authFile,
  // builds end in disk layers (no build VM for step-less builds); the sandbox cold-boots once
  AENV__template_build__snapshot: "false",
  AENV__vm__boot_snapshots: "false",
});
let mirror: TestRegistry | undefined;
let priv: TestRegistry | undefined;
let liar: Subprocess<"ignore", "pipe", "inherit"> | undefined;
let ubuntuDigest = "";
let otherDigest = "";

beforeAll(async () => {
  const world = node();
  Bun.spawnSync(["ip", "-n", world.ns, "addr", "add", `${PRIV}/32`, "dev", "lo"]);
  mirror = await startRegistry({ netns: world.ns, port: 5000 });
  priv = await startRegistry({ netns: world.ns, addr: PRIV, port: 5443, tls: { cert: ca.cert, key: ca.key }, auth: creds });
  // "ubuntu:22.04": busybox and an os-release, under Docker Hub's repository name
  const bb = join(work, "ubuntu");
  mkdirSync(join(bb, "bin"), { recursive: true });
  mkdirSync(join(bb, "etc"));
  copyFileSync("/bin/busybox", join(bb, "bin", "busybox"));
  for (const applet of Bun.spawnSync(["/bin/busybox", "--list"]).stdout.toString().split("\n").filter((a) => a && a !== "busybox")) symlinkSync("busybox", join(bb, "bin", applet));
  writeFileSync(join(bb, "etc", "passwd"), "root:x:0:0:root:/root:/bin/sh\n");
  writeFileSync(join(bb, "etc", "group"), "root:x:0:\n");
  writeFileSync(join(bb, "etc", "os-release"), 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\n');
  const ubuntu = await pushImage(mirror.host, "library/ubuntu:22.04", [{ dir: bb, compression: "gzip" }], {}, undefined, world.ns);
  rmSync(ubuntu.dir, { recursive: true, force: true });
  ubuntuDigest = ubuntu.digest;
  writeFileSync(join(bb, "etc", "os-release"), 'NAME="not what was pinned"\n');
  const other = await pushImage(mirror.host, "library/ubuntu:other", [{ dir: bb, compression: "gzip" }], {}, undefined, world.ns);
  rmSync(other.dir, { recursive: true, force: true });
  otherDigest = other.digest;
  liar = Bun.spawn(["nsenter", `--net=/run/netns/${world.ns}`, "--", process.execPath, join(import.meta.dir, "../image/fixtures/lying-mirror.ts"), "5002", mirror.host, `/v2/library/ubuntu/manifests/${ubuntuDigest}`, "/v2/library/ubuntu/manifests/other"], { stdin: "ignore", stdout: "pipe", stderr: "inherit" });
  const reader = liar.stdout.getReader();
  let said = "";
  while (!said.includes("listening")) {
    const r = await reader.read();
    if (r.done) throw new Error("the lying mirror did not start");
    said += new TextDecoder().decode(r.value);
  }
  reader.releaseLock();
  rmSync((await pushImage(priv.host, "private/app:v1", [{ dir: bb, compression: "gzip" }], {}, creds, world.ns)).dir, { recursive: true, force: true });
}, 180_000);

afterAll(async () => {
  liar?.kill("SIGKILL");
  await liar?.exited;
  await mirror?.stop();
  await priv?.stop();
  rmSync(work, { recursive: true, force: true });
});

test("e2b SDK: fromImage('ubuntu:22.04') through the docker.io mirror (a dead one first) builds and runs; a private TLS registry with the node's CA and auth file; a wrong password and a lying mirror are clear BuildErrors; no password anywhere", async () => {
  const world = node();
  const privRef = `${PRIV}:5443/private/app:v1`;
  const o = await world.client("image-pulls.ts", [privRef, creds.username, WRONG, `registry.example/library/ubuntu@${ubuntuDigest}`], 900_000);
  // ubuntu:22.04 came from the mirror, after the dead one was named and skipped
  const ubuntuLogs = o.ubuntuLogs as string[];
  expect(ubuntuLogs).toContain("[base] FROM ubuntu:22.04");
  expect(ubuntuLogs.some((l) => l.startsWith("mirror 127.0.0.1:5001 failed (image.unreachable): ") && l.endsWith("; trying mirror 127.0.0.1:5000"))).toBe(true);
  expect(ubuntuLogs.some((l) => l.startsWith("pulling docker.io/library/ubuntu:22.04 from mirror 127.0.0.1:5000 ("))).toBe(true);
  expect(o.run).toEqual({ stdout: 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nuser\n', exitCode: 0 });
  const fell = logLines(world, "registry endpoint failed, trying the next");
  expect(fell.map((l) => [l.endpoint, l.next, l.code])).toContainEqual(["mirror 127.0.0.1:5001", "mirror 127.0.0.1:5000", "image.unreachable"]);
  expect(logLines(world, "image fetched").map((l) => [l.ref, l.endpoint])).toContainEqual(["docker.io/library/ubuntu:22.04", "mirror 127.0.0.1:5000"]);
  // the private registry: TLS verified with the CA, credentials from the auth file
  expect((o.priv as { templateId: string }).templateId).toMatch(/^[a-z0-9]{20}$/);
  expect((o.privLogs as string[]).some((l) => l.startsWith(`pulling ${privRef} (`))).toBe(true);
  // the SDK's own credentials win for that registry: a wrong password fails the build, saying so
  expect(o.wrong.name).toBe("BuildError");
  expect(o.wrong.message).toContain(`base image ${privRef}: registry ${PRIV}:5443 refused access to ${privRef}: `);
  expect(o.wrong.message).toContain("unauthorized: authentication required");
  // a mirror serving another manifest for a pinned digest: the build fails naming both digests
  expect(otherDigest).not.toBe(ubuntuDigest);
  expect(o.pinned.name).toBe("BuildError");
  expect(o.pinned.message).toContain(`mirror 127.0.0.1:5002 served a manifest with digest ${otherDigest} for registry.example/library/ubuntu@${ubuntuDigest}, which pins ${ubuntuDigest}`);
  // no password, nor its Basic form, in the node's log, the build logs, the SDK's answers or the data directory
  const secrets = [creds.password, WRONG, Buffer.from(`${creds.username}:${creds.password}`).toString("base64"), Buffer.from(`${creds.username}:${WRONG}`).toString("base64")];
  const seen = world.fullLog + JSON.stringify(o);
  expect(world.fullLog).toContain('"level":20'); // debug lines were written
  for (const s of secrets) expect([s, seen.includes(s)]).toEqual([s, false]);
  const grep = Bun.spawnSync(["grep", "-r", "-l", "-F", ...secrets.flatMap((s) => ["-e", s]), "--exclude-dir=snapshots", "--exclude-dir=templates", "--exclude-dir=tools", world.home], { stdout: "pipe" });
  expect(grep.stdout.toString()).toBe("");
}, 1_200_000);
