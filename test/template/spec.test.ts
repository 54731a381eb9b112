/**
 * Pure parts of template builds: the build body check, step cache keys, ENV expansion, the
 * waitForPort ready-probe rewrite (run against this host's real /proc/net/tcp), and the COPY
 * script (run with /bin/sh on a real archive: files land with the step's owner and mode).
 */
import { expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, mkdirSync, lstatSync, readlinkSync, symlinkSync } from "node:fs";
import { open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { baseKey, checkBuildSpec, copyScript, dockerfileBase, expandEnv, extractScript, readyProbe, stepKey } from "../../src/template/index.ts";
import { waitFor } from "../helpers/wait.ts";

test("a Dockerfile's FROM (`from`): a template this node knows is built on, anything else is an image; a reference with / or @ is always an image", () => {
  const known = new Set(["base", "web", "k2j3h4g5f6d7s8a9q0w1"]);
  const isTemplate = (ref: string) => known.has(ref.split(":")[0]!);
  expect(dockerfileBase("base", isTemplate)).toEqual({ fromTemplate: "base" });
  expect(dockerfileBase("web:v2", isTemplate)).toEqual({ fromTemplate: "web:v2" });
  expect(dockerfileBase("k2j3h4g5f6d7s8a9q0w1", isTemplate)).toEqual({ fromTemplate: "k2j3h4g5f6d7s8a9q0w1" });
  expect(dockerfileBase("ubuntu:22.04", isTemplate)).toEqual({ fromImage: "ubuntu:22.04" });
  // how to name the image when a template has its name
  expect(dockerfileBase("docker.io/library/base", isTemplate)).toEqual({ fromImage: "docker.io/library/base" });
  expect(dockerfileBase("base@sha256:" + "a".repeat(64), () => true)).toEqual({ fromImage: "base@sha256:" + "a".repeat(64) });
  expect(dockerfileBase("127.0.0.1:5000/base:v1", () => true)).toEqual({ fromImage: "127.0.0.1:5000/base:v1" });
  // through the build body: resolved, and kept for the build log
  expect(checkBuildSpec({ from: "base", steps: [] }, "base", isTemplate)).toMatchObject({ fromTemplate: "base", fromImage: undefined, from: "base" });
  expect(checkBuildSpec({ from: "python:3.12" }, "base", isTemplate)).toMatchObject({ fromImage: "python:3.12", fromTemplate: undefined, from: "python:3.12" });
  // without a catalog to ask, nothing is a template
  expect(checkBuildSpec({ from: "base" }, "base")).toMatchObject({ fromImage: "base" });
  expect(() => checkBuildSpec({ from: "base", fromImage: "x" }, "base", isTemplate)).toThrow("give from (a Dockerfile's FROM) or fromImage / fromTemplate, not both");
  expect(() => checkBuildSpec({ from: " " }, "base", isTemplate)).toThrow("from must name a template or an image");
  expect(() => checkBuildSpec({ from: 3 }, "base", isTemplate)).toThrow("from must be a string");
});

test("checkBuildSpec: defaults, e2bdev/base → the default template, credentials, bad fields", () => {
  expect(checkBuildSpec({}, "base")).toEqual({ fromImage: undefined, fromTemplate: "base", credentials: undefined, force: false, steps: [], startCmd: "", readyCmd: "" });
  expect(checkBuildSpec({ fromImage: "e2bdev/base" }, "base").fromTemplate).toBe("base");
  const s = checkBuildSpec(
    { fromImage: "127.0.0.1:5000/a:b", fromImageRegistry: { type: "registry", username: "u", password: "p" }, steps: [{ type: "run", args: ["echo hi", "root"], force: true }], force: false, startCmd: "x", readyCmd: "y", extra: 1 },
    "base",
  );
  expect(s).toEqual({ fromImage: "127.0.0.1:5000/a:b", fromTemplate: undefined, credentials: { username: "u", password: "p" }, force: false, steps: [{ type: "RUN", args: ["echo hi", "root"], force: true }], startCmd: "x", readyCmd: "y" });
  const bad: [Record<string, unknown>, string][] = [
    [{ fromImage: "a", fromTemplate: "b" }, "not both"],
    [{ steps: {} }, "steps must be an array"],
    [{ steps: [{ args: [] }] }, "steps[0].type"],
    [{ steps: [{ type: "RUN", args: [1] }] }, "steps[0].args"],
    [{ steps: [{ type: "COPY", args: ["a", "b"], filesHash: "XYZ" }] }, "filesHash"],
    [{ fromImageRegistry: { type: "aws" } }, "not supported"],
    [{ fromImageRegistry: { type: "gcp", serviceAccountJson: '{"private_key": "sekrit' } }, "a service account key (JSON object)"],
    [{ fromImageRegistry: { type: "gcp" } }, "a service account key (JSON object)"],
    [{ force: "yes" }, "force must be a boolean"],
  ];
  for (const [body, msg] of bad) expect(() => checkBuildSpec(body, "base")).toThrow(msg);
  // a broken key is refused without quoting it
  expect(() => checkBuildSpec({ fromImageRegistry: { type: "gcp", serviceAccountJson: '{"private_key": "sekrit' } }, "base")).not.toThrow("sekrit");
  // fromGCPRegistry: the key as the password of `_json_key`
  const key = JSON.stringify({ type: "service_account", private_key: "k" });
  expect(checkBuildSpec({ fromImage: "europe-docker.pkg.dev/p/r/i:1", fromImageRegistry: { type: "gcp", serviceAccountJson: key } }, "base").credentials).toEqual({ username: "_json_key", password: key });
});

test("step keys chain: same prefix same key, any change in type, args, files or base changes it", () => {
  const b = baseKey({ image: "1".repeat(32) });
  const run = { type: "RUN", args: ["echo a"], force: false };
  const k1 = stepKey(b, run);
  expect(stepKey(b, { ...run, force: true })).toBe(k1); // force is not part of the key
  expect(stepKey(b, { ...run, args: ["echo b"] })).not.toBe(k1);
  expect(stepKey(baseKey({ image: "2".repeat(32) }), run)).not.toBe(k1);
  expect(stepKey(baseKey({ templateBuildID: "x" }), run)).not.toBe(k1);
  const copy = { type: "COPY", args: ["a", "/b"], filesHash: "a".repeat(64), force: false };
  expect(stepKey(k1, copy)).not.toBe(stepKey(k1, { ...copy, filesHash: "b".repeat(64) }));
  expect(k1).toMatch(/^[0-9a-f]{64}$/);
  // args are hashed as a list: RUN ["echo a", "root"] (as root) is not RUN ["echo a root"]
  expect(stepKey(b, { ...run, args: ["echo a", "root"] })).not.toBe(stepKey(b, { ...run, args: ["echo a root"] }));
  expect(stepKey(b, { type: "ENV", args: ["A", "1 B"], force: false })).not.toBe(stepKey(b, { type: "ENV", args: ["A 1", "B"], force: false }));
});

test("expandEnv expands $VAR and ${VAR}, unknown to empty", () => {
  expect(expandEnv("$HOME/bin:${PATH}:$NOPE.", { HOME: "/h", PATH: "/usr/bin" })).toBe("/h/bin:/usr/bin:.");
});

test("readyProbe: the SDK's waitForPort text becomes a /proc/net/tcp probe that sees a real listener", async () => {
  expect(readyProbe("pgrep 'x' > /dev/null")).toBe("pgrep 'x' > /dev/null");
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("ok") });
  try {
    const probe = readyProbe(`[ -n "$(ss -Htuln sport = :${server.port})" ]`);
    expect(probe).not.toContain("ss ");
    expect(Bun.spawnSync(["sh", "-c", probe]).exitCode).toBe(0);
  } finally {
    server.stop(true);
  }
  // a port nothing listens on (the server is gone)
  const free = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("") });
  const port = free.port;
  free.stop(true);
  await waitFor(`the probe to find nothing on port ${port}`, () => Bun.spawnSync(["sh", "-c", readyProbe(`[ -n "$(ss -Htuln sport = :${port})" ]`)]).exitCode === 1);
});

/** Write `data` to `path` as envd's /files upload does (fs.promises.open "w": blocks on a FIFO until its reader opens). */
async function writeAll(path: string, data: Uint8Array): Promise<void> {
  const fh = await open(path, "w", 0o644);
  try {
    for (let off = 0; off < data.length; ) off += (await fh.write(data, off, data.length - off)).bytesWritten;
  } finally {
    await fh.close();
  }
}

test("extractScript + copyScript: streamed through a FIFO; directory merge, file into a directory, file renamed, glob; owner and mode applied", async () => {
  const root = mkdtempSync(join(tmpdir(), "aenv-copy-"));
  try {
    const ctx = join(root, "ctx");
    mkdirSync(join(ctx, "app/sub"), { recursive: true });
    writeFileSync(join(ctx, "app/main.py"), "print(1)\n");
    writeFileSync(join(ctx, "app/sub/data.txt"), "data\n");
    symlinkSync("main.py", join(ctx, "app/link"));
    writeFileSync(join(ctx, "single.txt"), "one\n");
    const sh = (script: string) => {
      const r = Bun.spawnSync(["sh", "-c", script], { stderr: "pipe" });
      return { code: r.exitCode, err: r.stderr.toString() };
    };
    let n = 0;
    /** Stream a tar of `paths` (gzip or plain) through a FIFO into a stage dir, as a build does; returns the stage. */
    const stageOf = async (gzip: boolean, ...paths: string[]) => {
      const id = ++n;
      const tarPath = join(root, `${id}.tar`);
      expect(Bun.spawnSync(["tar", gzip ? "-czf" : "-cf", tarPath, "-C", ctx, ...paths]).exitCode).toBe(0);
      const fifo = join(root, `${id}.fifo`);
      const stage = join(root, `stage${id}`);
      expect(sh(`mkfifo ${fifo} && mkdir ${stage}`).code).toBe(0);
      const x = Bun.spawn(["sh", "-c", extractScript(fifo, stage, gzip)], { stderr: "pipe" });
      // the writer side, as envd's upload: a blocking open for writing, write it all, close
      await writeAll(fifo, readFileSync(tarPath));
      expect(await x.exited).toBe(0);
      return stage;
    };
    const dest = join(root, "dest");
    mkdirSync(join(dest, "app"), { recursive: true });
    writeFileSync(join(dest, "app/keep.txt"), "kept\n");
    const s1 = await stageOf(true, "app");
    expect(sh(copyScript(s1, "app/", `${dest}/app/`, "nobody", "")).code).toBe(0);
    expect(readFileSync(join(dest, "app/main.py"), "utf8")).toBe("print(1)\n");
    expect(readFileSync(join(dest, "app/sub/data.txt"), "utf8")).toBe("data\n");
    expect(readFileSync(join(dest, "app/keep.txt"), "utf8")).toBe("kept\n");
    expect(readlinkSync(join(dest, "app/link"))).toBe("main.py");
    const nobody = Number(Bun.spawnSync(["id", "-u", "nobody"]).stdout.toString().trim());
    expect(statSync(join(dest, "app/sub/data.txt")).uid).toBe(nobody);
    expect(lstatSync(join(dest, "app/link")).uid).toBe(nobody);
    expect(statSync(join(dest, "app/keep.txt")).uid).toBe(process.getuid!()); // not copied: untouched
    // hard-linked into place (same filesystem): the stage is gone, the files stay, one link each
    expect(existsSync(s1)).toBe(false);
    expect(statSync(join(dest, "app/main.py")).nlink).toBe(1);
    const s2 = await stageOf(false, "single.txt");
    expect(sh(copyScript(s2, "single.txt", `${dest}/etc/`, "root", "0600")).code).toBe(0);
    expect(statSync(join(dest, "etc/single.txt")).mode & 0o777).toBe(0o600);
    expect(sh(copyScript(await stageOf(true, "single.txt"), "single.txt", `${dest}/renamed.txt`, "root", "")).code).toBe(0);
    expect(readFileSync(join(dest, "renamed.txt"), "utf8")).toBe("one\n");
    expect(sh(copyScript(await stageOf(true, "app/main.py"), "app/*.py", `${dest}/py`, "root", "0755")).code).toBe(0);
    expect(statSync(join(dest, "py/main.py")).mode & 0o777).toBe(0o755);
    const s5 = await stageOf(true, "single.txt");
    const miss = sh(copyScript(s5, "nothere.txt", `${dest}/x`, "root", ""));
    expect(miss.code).not.toBe(0);
    expect(miss.err).toContain("matched nothing");
    expect(existsSync(s5)).toBe(false); // removed on failure too
    // a broken archive: the extraction fails, the writer is never left blocked or cut off
    const bad = join(root, "bad.fifo");
    expect(sh(`mkfifo ${bad} && mkdir ${join(root, "badstage")}`).code).toBe(0);
    const x = Bun.spawn(["sh", "-c", extractScript(bad, join(root, "badstage"), true)], { stderr: "pipe" });
    await writeAll(bad, new Uint8Array(300_000).fill(7));
    expect(await x.exited).not.toBe(0);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test("readyProbe: waitForURL works with curl, and with only wget on PATH", async () => {
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: (r) => new Response("x", { status: new URL(r.url).pathname === "/ok" ? 200 : 404 }) });
  const bin = mkdtempSync(join(tmpdir(), "aenv-wget-"));
  try {
    symlinkSync(Bun.which("wget")!, join(bin, "wget"));
    for (const sh of ["grep", "sh"]) symlinkSync(Bun.which(sh)!, join(bin, sh));
    const probe = (path: string, code: number) => readyProbe(`curl -s -o /dev/null -w "%{http_code}" 'http://127.0.0.1:${server.port}${path}' | grep -q "${code}"`);
    // async: the server answers from this process
    const run = (script: string, PATH?: string) => Bun.spawn(["/bin/sh", "-c", script], { env: PATH ? { PATH } : process.env, stdout: "ignore", stderr: "ignore" }).exited;
    expect(probe("/ok", 200)).toContain("wget");
    expect(await run(probe("/ok", 200))).toBe(0); // curl
    expect(await run(probe("/missing", 200))).toBe(1);
    expect(await run(probe("/ok", 200), bin)).toBe(0); // wget only
    expect(await run(probe("/missing", 200), bin)).toBe(1);
    expect(await run(probe("/missing", 404), bin)).toBe(0);
  } finally {
    server.stop(true);
    rmSync(bin, { recursive: true, force: true });
  }
});
