/**
 * The unmodified e2b@2.51.0 JS SDK against a real envd child process on loopback.
 * Real parts: envd (`bun src/cli/main.ts envd`), processes, PTYs, files under a temp dir.
 * Only the control-plane create/connect call is answered by a tiny stub API in this file, so the
 * SDK learns the envd URL (sandboxUrl), access token and envd version.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import {
  AuthenticationError,
  CommandExitError,
  FileNotFoundError,
  FilesystemEventType,
  FileType,
  InvalidArgumentError,
  NotFoundError,
  RateLimitError,
  Sandbox,
  SandboxError,
} from "e2b";
import { ENVD_VERSION } from "../../src/envd/version.ts";
import { ensureUserAccount, initEnvd, procState, startEnvdChild, type EnvdChild } from "./harness.ts";
import { waitFor } from "../helpers/wait.ts";

const TOKEN = "a".repeat(24) + "0123456789abcdef";
/** Most envd RSS growth (MiB) during a bulk output once envd has streamed one (see the large output test). */
const RSS_BOUND_MIB = 16;
let envd: EnvdChild;
let api: ReturnType<typeof Bun.serve>;
let sbx: Sandbox;
let dir: string;
let userIds: { uid: number; gid: number };

const sandboxJson = () => ({
  sandboxID: "sbxenvdtest",
  templateID: "base",
  clientID: "6532622b",
  envdVersion: ENVD_VERSION,
  envdAccessToken: TOKEN,
});

function sdkOpts() {
  return { apiKey: "e2b_0123456789abcdef", apiUrl: `http://127.0.0.1:${api.port}`, sandboxUrl: envd.url, requestTimeoutMs: 20_000 };
}

beforeAll(async () => {
  userIds = ensureUserAccount();
  envd = await startEnvdChild();
  const init = await initEnvd(envd.url, { accessToken: TOKEN, envVars: { SBX_VAR: "sbx" }, defaultUser: "user" });
  expect(init.status).toBe(204);
  expect(init.headers.get("x-envd-version")).toBe(ENVD_VERSION);
  api = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch(req) {
      const path = new URL(req.url).pathname;
      if (req.method === "POST" && path === "/v2/sandboxes") return Response.json(sandboxJson(), { status: 201 });
      if (req.method === "POST" && path === "/v2/sandboxes/sbxenvdtest/connect") return Response.json(sandboxJson(), { status: 200 });
      return Response.json({ code: 404, message: `stub: no ${req.method} ${path}` }, { status: 404 });
    },
  });
  sbx = await Sandbox.create(sdkOpts());
  dir = mkdtempSync("/tmp/envd-sdk-");
  chownSync(dir, userIds.uid, userIds.gid);
}, 30_000);

afterAll(async () => {
  await envd?.stop();
  api?.stop(true);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe("commands", () => {
  test("run returns stdout, stderr and exit code", async () => {
    const r = await sbx.commands.run("echo hi; echo oops >&2");
    expect(r.exitCode).toBe(0);
    expect(r.stdout).toBe("hi\n");
    expect(r.stderr).toBe("oops\n");
  });

  test("non-zero exit raises CommandExitError with the output kept", async () => {
    const err = await sbx.commands.run("echo partial; echo bad >&2; exit 3").catch((e) => e);
    expect(err).toBeInstanceOf(CommandExitError);
    expect(err.exitCode).toBe(3);
    expect(err.stdout).toBe("partial\n");
    expect(err.stderr).toBe("bad\n");
    expect(err.error).toBe("exit status 3");
  });

  test("streaming callbacks get output as it is produced", async () => {
    const seen: string[] = [];
    const times: number[] = [];
    const t0 = Date.now();
    const r = await sbx.commands.run("echo one; sleep 0.4; echo two >&2; sleep 0.4; echo three", {
      onStdout: (d) => {
        seen.push(`out:${d}`);
        times.push(Date.now() - t0);
      },
      onStderr: (d) => {
        seen.push(`err:${d}`);
        times.push(Date.now() - t0);
      },
    });
    expect(seen).toEqual(["out:one\n", "err:two\n", "out:three\n"]);
    // the first chunk arrived well before the command finished: streamed, not buffered
    expect(times[2]! - times[0]!).toBeGreaterThan(500);
    expect(r.stdout).toBe("one\nthree\n");
  });

  test(`large output (issue 16 item 1): 50 MB complete in events of at most 64 KiB; envd's RSS grows less than ${RSS_BOUND_MIB} MiB, for a fast consumer and one that blocks 10 ms per event`, async () => {
    const rssKiB = () => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${envd.proc.pid}/status`, "utf8"))![1]);
    const block = new Int32Array(new SharedArrayBuffer(4));
    const run = async (total: number, consumerMs: number) => {
      const rss0 = rssKiB();
      let rssMax = rss0;
      let events = 0;
      let bytes = 0;
      let largest = 0;
      let notX = 0;
      const r = await sbx.commands.run(`head -c ${total} /dev/zero | tr '\\0' x`, {
        timeoutMs: 0,
        onStdout: (d) => {
          events++;
          bytes += d.length;
          largest = Math.max(largest, d.length);
          if (/[^x]/.test(d)) notX++;
          if (events % 16 === 0) rssMax = Math.max(rssMax, rssKiB());
          // a slow consumer: the SDK's callback holds the whole client (its event loop) 10 ms
          if (consumerMs) Atomics.wait(block, 0, 0, consumerMs);
        },
      });
      expect(r.exitCode).toBe(0);
      expect(bytes).toBe(total);
      expect(r.stdout.length).toBe(total);
      expect(notX).toBe(0);
      expect(largest).toBeLessThanOrEqual(64 * 1024);
      expect(largest).toBe(32 * 1024); // [envd] output_event_bytes
      expect(events).toBeGreaterThanOrEqual(Math.ceil(total / (32 * 1024)));
      const grew = (rssMax - rss0) / 1024;
      console.log(`${total / 1e6} MB output, consumer ${consumerMs} ms/event: ${events} events, envd RSS ${(rss0 / 1024).toFixed(1)} MiB -> peak ${(rssMax / 1024).toFixed(1)} MiB (+${grew.toFixed(1)})`);
      return grew;
    };
    // the first bulk output after envd started also compiles its output path and sizes its
    // heap (a one-time growth, printed, not bounded); what is bounded is the growth of later ones
    await run(50_000_000, 0);
    expect(await run(50_000_000, 0)).toBeLessThan(RSS_BOUND_MIB);
    expect(await run(50_000_000, 10)).toBeLessThan(RSS_BOUND_MIB);
  }, 180_000);

  test("envs, cwd and the sandbox-wide vars from /init reach the process", async () => {
    const r = await sbx.commands.run('echo "$FOO|$SBX_VAR|$HOME|$USER"; pwd', { envs: { FOO: "bar baz" }, cwd: dir });
    expect(r.stdout).toBe(`bar baz|sbx|/home/user|user\n${dir}\n`);
  });

  test("default user is `user` from /init; user: root switches identity", async () => {
    const u = await sbx.commands.run("id -u; id -g; id -un; id -Gn");
    expect(u.stdout).toBe(`${userIds.uid}\n${userIds.gid}\nuser\nuser envdtest\n`);
    const missing = await sbx.commands.run("no-such-command-xyz").catch((e) => e);
    expect(missing).toBeInstanceOf(CommandExitError);
    expect(missing.exitCode).toBe(127);
    expect(missing.stderr).toContain("no-such-command-xyz");
    const r = await sbx.commands.run("id -u; id -un; pwd", { user: "root" });
    expect(r.stdout).toBe("0\nroot\n/root\n");
  });

  test("missing cwd is InvalidArgumentError; unknown user is AuthenticationError", async () => {
    const e1 = await sbx.commands.run("true", { cwd: "/does/not/exist" }).catch((e) => e);
    expect(e1).toBeInstanceOf(InvalidArgumentError);
    expect(String(e1.message)).toContain("/does/not/exist");
    const e2 = await sbx.commands.run("true", { user: "nosuchuser" as "root" }).catch((e) => e);
    expect(e2).toBeInstanceOf(AuthenticationError);
  });

  test("a cwd the user cannot enter fails the start (as E2B's, where the process changes directory as the user); root may", async () => {
    const locked = join(dir, "locked");
    mkdirSync(join(locked, "inner"), { recursive: true, mode: 0o700 });
    const e = await sbx.commands.run("pwd", { cwd: join(locked, "inner") }).catch((x) => x);
    expect(e).toBeInstanceOf(SandboxError);
    expect(String(e.message)).toContain(`start in cwd '${join(locked, "inner")}': user 'user' has no permission on '${locked}'`);
    expect((await sbx.commands.run("pwd", { cwd: join(locked, "inner"), user: "root" })).stdout).toBe(`${join(locked, "inner")}\n`);
  });

  test("20 concurrent commands each get their own output", async () => {
    const runs = await Promise.all(Array.from({ length: 20 }, (_, i) => sbx.commands.run(`echo n${i}; echo e${i} >&2; exit ${i % 2}`).catch((e) => e)));
    runs.forEach((r, i) => {
      expect(r.stdout).toBe(`n${i}\n`);
      expect(r.stderr).toBe(`e${i}\n`);
      expect(r.exitCode).toBe(i % 2);
      if (i % 2) expect(r).toBeInstanceOf(CommandExitError);
    });
  });

  test("background process is listed, then killed", async () => {
    const h = await sbx.commands.run("sleep 30", { background: true });
    expect(h.pid).toBeGreaterThan(0);
    expect(procState(h.pid)).toMatch(/^[RSD]$/); // alive, not a zombie
    const list = await sbx.commands.list();
    const mine = list.find((p) => p.pid === h.pid);
    expect(mine?.cmd).toBe("/bin/bash");
    expect(mine?.args).toEqual(["-l", "-c", "sleep 30"]);
    expect(await sbx.commands.kill(h.pid)).toBe(true);
    const err = await h.wait().catch((e) => e);
    expect(err).toBeInstanceOf(CommandExitError);
    expect(err.exitCode).toBe(-1);
    expect(err.error).toBe("signal: killed");
    // reaped: no zombie left behind
    await waitFor("procState(h.pid) === undefined", () => procState(h.pid) === undefined);
    expect((await sbx.commands.list()).some((p) => p.pid === h.pid)).toBe(false);
    expect(await sbx.commands.kill(h.pid)).toBe(false);
  });

  test("sendStdin and closeStdin feed a background process", async () => {
    const h = await sbx.commands.run("read line; echo got:$line; cat; echo done", { background: true, stdin: true });
    await sbx.commands.sendStdin(h.pid, "abc\n");
    await sbx.commands.sendStdin(h.pid, new TextEncoder().encode("rest\n"));
    await sbx.commands.closeStdin(h.pid);
    const r = await h.wait();
    expect(r.exitCode).toBe(0);
    expect(r.stdout).toBe("got:abc\nrest\ndone\n");
  });

  test("connect re-attaches to a running process and sees its later output", async () => {
    const h = await sbx.commands.run("sleep 0.6; echo late; exit 4", { background: true });
    await h.disconnect();
    const out: string[] = [];
    const again = await sbx.commands.connect(h.pid, { onStdout: (d) => void out.push(d) });
    const err = await again.wait().catch((e) => e);
    expect(err).toBeInstanceOf(CommandExitError);
    expect(err.exitCode).toBe(4);
    expect(out.join("")).toBe("late\n");
    const missing = await sbx.commands.connect(999_999).catch((e) => e);
    expect(missing).toBeInstanceOf(NotFoundError);
  });
});

describe("pty", () => {
  test("create, sendInput, resize, kill", async () => {
    let out = "";
    const dec = new TextDecoder();
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => void (out += dec.decode(d, { stream: true })) });
    const enc = new TextEncoder();
    await sbx.pty.sendInput(h.pid, enc.encode("stty size; tty; echo $TERM\n"));
    await waitFor("/24 80\\r\\n\\/dev\\/pts\\/\\d+\\r\\nxterm-256color/.test(out)", () => /24 80\r\n\/dev\/pts\/\d+\r\nxterm-256color/.test(out));
    await sbx.pty.resize(h.pid, { cols: 132, rows: 40 });
    await sbx.pty.sendInput(h.pid, enc.encode("stty size; id -un\n"));
    await waitFor("/40 132\\r\\nuser\\r\\n/.test(out)", () => /40 132\r\nuser\r\n/.test(out));
    expect(await sbx.pty.kill(h.pid)).toBe(true);
    const err = await h.wait().catch((e) => e);
    expect(err).toBeInstanceOf(CommandExitError);
    expect(err.exitCode).toBe(-1);
    await waitFor("procState(h.pid) === undefined", () => procState(h.pid) === undefined);
  }, 30_000);

  test("pty.connect re-attaches to a running PTY after disconnect", async () => {
    const h = await sbx.pty.create({ cols: 60, rows: 12, onData: () => {} });
    await h.disconnect();
    let out = "";
    const again = await sbx.pty.connect(h.pid, { onData: (d) => void (out += new TextDecoder().decode(d)) });
    await sbx.pty.sendInput(h.pid, new TextEncoder().encode("echo reattached-$((6*7))\n"));
    await waitFor("out.includes(\"reattached-42\")", () => out.includes("reattached-42"));
    await sbx.pty.sendInput(h.pid, new TextEncoder().encode("exit 3\n"));
    const err = await again.wait().catch((e) => e);
    expect(err).toBeInstanceOf(CommandExitError);
    expect(err.exitCode).toBe(3);
  }, 30_000);

  test("exit from the shell ends the PTY with its exit code", async () => {
    const h = await sbx.pty.create({ cols: 40, rows: 10, onData: () => {} });
    await sbx.pty.sendInput(h.pid, new TextEncoder().encode("exit 0\n"));
    const r = await h.wait();
    expect(r.exitCode).toBe(0);
  }, 30_000);
});

describe("files", () => {
  test("write text, read as text, bytes and stream; owner is the user", async () => {
    const p = join(dir, "hello.txt");
    const info = await sbx.files.write(p, "hello world\n");
    expect(info.path).toBe(p);
    expect(info.name).toBe("hello.txt");
    expect(await sbx.files.read(p)).toBe("hello world\n");
    const bytes = await sbx.files.read(p, { format: "bytes" });
    expect(Array.from(bytes)).toEqual(Array.from(new TextEncoder().encode("hello world\n")));
    const stream = await sbx.files.read(p, { format: "stream" });
    expect(await new Response(stream).text()).toBe("hello world\n");
    const st = statSync(p);
    expect([st.uid, st.gid]).toEqual([userIds.uid, userIds.gid]);
  });

  test("read with gzip: true gets the same bytes", async () => {
    const p = join(dir, "gz.txt");
    await sbx.files.write(p, "compress me ".repeat(1000));
    expect(await sbx.files.read(p, { gzip: true })).toBe("compress me ".repeat(1000));
    expect((await sbx.files.read(p, { format: "bytes", gzip: true })).length).toBe(12_000);
  });

  test("a device or a FIFO reads as empty, with gzip and without, instead of being read forever (as E2B's envd)", async () => {
    const fifo = join(dir, "a-fifo");
    expect(Bun.spawnSync(["mkfifo", fifo]).exitCode).toBe(0);
    for (const p of ["/dev/zero", fifo]) {
      expect(await sbx.files.read(p)).toBe("");
      expect(await sbx.files.read(p, { gzip: true })).toBe("");
      expect((await sbx.files.read(p, { format: "bytes", gzip: true })).length).toBe(0);
    }
  });

  test("non-ASCII file names: SDK write and read work; Content-Disposition is ASCII with filename* (issue 16 item 3)", async () => {
    for (const name of ["测试 文件.txt", "🤣.txt", "café.txt"]) {
      const p = join(dir, name);
      await sbx.files.write(p, `content of ${name}`);
      expect(await sbx.files.read(p)).toBe(`content of ${name}`);
      const r = await fetch(`${envd.url}/files?path=${encodeURIComponent(p)}`, { headers: { "x-access-token": TOKEN } });
      expect(r.status).toBe(200);
      const cd = r.headers.get("content-disposition")!;
      expect(/^[\x20-\x7e]+$/.test(cd)).toBe(true);
      const m = /^inline; filename="([^"]*)"; filename\*=UTF-8''(.+)$/.exec(cd);
      expect(m).not.toBeNull();
      expect(decodeURIComponent(m![2]!)).toBe(name);
      expect(m![1]!.length).toBeGreaterThan(0);
      expect(await r.text()).toBe(`content of ${name}`);
    }
    const plain = await fetch(`${envd.url}/files?path=${encodeURIComponent(join(dir, "gz.txt"))}`, { headers: { "x-access-token": TOKEN } });
    expect(plain.headers.get("content-disposition")).toBe('inline; filename="gz.txt"');
    await plain.arrayBuffer();
  });

  test("Accept-Encoding q-values are honoured; nothing acceptable is 406 (issue 16 item 4)", async () => {
    const p = join(dir, "gz.txt");
    const get = (ae: string, extra: Record<string, string> = {}) =>
      fetch(`${envd.url}/files?path=${encodeURIComponent(p)}`, { headers: { "x-access-token": TOKEN, "accept-encoding": ae, ...extra }, decompress: false } as RequestInit);
    const none = await get("br, identity;q=0");
    expect(none.status).toBe(406);
    expect(await none.json()).toEqual({ code: 406, message: expect.stringContaining("br, identity;q=0") });
    expect((await get("*;q=0")).status).toBe(406);
    const identity = await get("gzip;q=0, br");
    expect(identity.status).toBe(200);
    expect(identity.headers.get("content-encoding")).toBeNull();
    expect(await identity.text()).toBe("compress me ".repeat(1000));
    const gz = await get("identity;q=0.5, gzip;q=0.8");
    expect(gz.headers.get("content-encoding")).toBe("gzip");
    expect(Bun.gunzipSync(new Uint8Array(await gz.arrayBuffer())).length).toBe(12_000);
    const preferIdentity = await get("gzip;q=0.2, identity");
    expect(preferIdentity.headers.get("content-encoding")).toBeNull();
    await preferIdentity.arrayBuffer();
    // a range is sent as stored: identity must be acceptable
    expect((await get("gzip, identity;q=0", { range: "bytes=0-9" })).status).toBe(406);
    const part = await get("gzip", { range: "bytes=0-10" });
    expect(part.status).toBe(206);
    expect(await part.text()).toBe("compress me");
  });

  test("write binary bytes round-trips exactly (1 MiB, all byte values)", async () => {
    const data = new Uint8Array(1 << 20);
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + (i >> 8)) & 0xff;
    const p = join(dir, "bin", "blob.bin");
    await sbx.files.write(p, data.buffer);
    const back = await sbx.files.read(p, { format: "bytes" });
    expect(back.length).toBe(data.length);
    expect(Buffer.compare(Buffer.from(back), Buffer.from(data))).toBe(0);
  });

  test("write several files at once into nested new directories", async () => {
    const res = await sbx.files.write([
      { path: join(dir, "multi/a/one.txt"), data: "1" },
      { path: join(dir, "multi/b/c/two.txt"), data: "22" },
      { path: "relative/three.txt", data: "333" },
    ]);
    expect(res.map((r) => r.path)).toEqual([join(dir, "multi/a/one.txt"), join(dir, "multi/b/c/two.txt"), "/home/user/relative/three.txt"]);
    expect(await sbx.files.read(join(dir, "multi/b/c/two.txt"))).toBe("22");
    expect(await sbx.files.read("relative/three.txt")).toBe("333");
    const st = statSync(join(dir, "multi/b/c"));
    expect(st.uid).toBe(userIds.uid);
  });

  test("octet-stream, gzip and ReadableStream uploads", async () => {
    const p1 = join(dir, "oct/a.txt");
    await sbx.files.write(p1, "octet body", { useOctetStream: true });
    expect(await sbx.files.read(p1)).toBe("octet body");
    const p2 = join(dir, "oct/b.txt");
    await sbx.files.write(p2, "z".repeat(100_000), { gzip: true });
    expect(await sbx.files.read(p2)).toBe("z".repeat(100_000));
    const p3 = join(dir, "oct/c.bin");
    const parts = [new Uint8Array([1, 2, 3]), new Uint8Array(200_000).fill(9), new Uint8Array([4])];
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        for (const x of parts) c.enqueue(x);
        c.close();
      },
    });
    await sbx.files.write(p3, stream);
    const back = await sbx.files.read(p3, { format: "bytes" });
    expect(back.length).toBe(200_004);
    expect([back[0], back[1], back[2], back[3], back[200_003]]).toEqual([1, 2, 3, 9, 4]);
    expect(statSync(p3).uid).toBe(userIds.uid);
  });

  test("file metadata is stored as xattrs, listed, and replaced by the next upload", async () => {
    const p = join(dir, "meta.txt");
    const w = await sbx.files.write(p, "m", { metadata: { Owner: "agent-7", stage: "draft" } });
    expect(w.metadata).toEqual({ owner: "agent-7", stage: "draft" });
    expect((await sbx.files.getInfo(p)).metadata).toEqual({ owner: "agent-7", stage: "draft" });
    expect((await sbx.files.list(dir)).find((e) => e.name === "meta.txt")?.metadata).toEqual({ owner: "agent-7", stage: "draft" });
    await sbx.files.write(p, "m2", { metadata: { stage: "final" }, useOctetStream: true });
    expect((await sbx.files.getInfo(p)).metadata).toEqual({ stage: "final" });
    await sbx.files.write(p, "m3");
    expect((await sbx.files.getInfo(p)).metadata).toBeUndefined();
  });

  test("list with depth, exists, getInfo", async () => {
    const base = join(dir, "tree");
    await sbx.files.write(join(base, "x/y/deep.txt"), "d");
    await sbx.files.write(join(base, "top.txt"), "top");
    const one = await sbx.files.list(base);
    expect(one.map((e) => e.name).sort()).toEqual(["top.txt", "x"]);
    const three = await sbx.files.list(base, { depth: 3 });
    expect(three.map((e) => e.path).sort()).toEqual([join(base, "top.txt"), join(base, "x"), join(base, "x/y"), join(base, "x/y/deep.txt")]);
    const dirEntry = three.find((e) => e.name === "x")!;
    expect(dirEntry.type).toBe(FileType.DIR);
    expect(await sbx.files.exists(join(base, "top.txt"))).toBe(true);
    expect(await sbx.files.exists(join(base, "nope.txt"))).toBe(false);
    const info = await sbx.files.getInfo(join(base, "top.txt"));
    expect(info.type).toBe(FileType.FILE);
    expect(info.size).toBe(3);
    expect(info.owner).toBe("user");
    expect(info.permissions).toBe("-rw-r--r--");
    expect(info.mode).toBe(0o644);
    // the file's own mtime (envd runs on this host), whole milliseconds as envd sends them
    expect(info.modifiedTime!.getTime()).toBe(Math.floor(statSync(join(base, "top.txt")).mtimeMs));
  });

  test("rename, remove, makeDir", async () => {
    const a = join(dir, "mv-src.txt");
    await sbx.files.write(a, "move me");
    const moved = await sbx.files.rename(a, join(dir, "moved/dst.txt"));
    expect(moved.path).toBe(join(dir, "moved/dst.txt"));
    expect(await sbx.files.exists(a)).toBe(false);
    expect(await sbx.files.read(join(dir, "moved/dst.txt"))).toBe("move me");
    expect(await sbx.files.makeDir(join(dir, "made/deep"))).toBe(true);
    expect(await sbx.files.makeDir(join(dir, "made/deep"))).toBe(false);
    expect(statSync(join(dir, "made/deep")).isDirectory()).toBe(true);
    await sbx.files.remove(join(dir, "made"));
    expect(await sbx.files.exists(join(dir, "made"))).toBe(false);
    const err = await sbx.files.rename(join(dir, "ghost"), join(dir, "ghost2")).catch((e) => e);
    expect(err).toBeInstanceOf(NotFoundError);
  });

  test("a full disk on makeDir is a SandboxError saying so, not a RateLimitError (E2B's envd answers internal)", async () => {
    // a tmpfs with 2 inodes: its root takes one, the first directory the other
    const full = join(dir, "full-fs");
    mkdirSync(full);
    expect(Bun.spawnSync(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=2", "tmpfs", full]).exitCode).toBe(0);
    try {
      expect(await sbx.files.makeDir(join(full, "a"))).toBe(true);
      const err = await sbx.files.makeDir(join(full, "b")).catch((e) => e);
      expect(err).toBeInstanceOf(SandboxError);
      expect(err).not.toBeInstanceOf(RateLimitError);
      expect(String(err.message)).toContain("not enough disk space");
      expect(String(err.message)).toContain("internal");
    } finally {
      expect(Bun.spawnSync(["umount", full]).exitCode).toBe(0);
    }
  });

  test("errors: missing file, directory read; like E2B, file ops act as root and the user owns the result", async () => {
    const e1 = await sbx.files.read(join(dir, "missing.txt")).catch((e) => e);
    expect(e1).toBeInstanceOf(FileNotFoundError);
    const e2 = await sbx.files.read(dir).catch((e) => e);
    expect(e2).toBeInstanceOf(InvalidArgumentError);
    // removing what is not there succeeds (E2B: os.RemoveAll)
    await sbx.files.remove(join(dir, "never-existed"));
    mkdirSync("/root/envd-private-test", { recursive: true, mode: 0o700 });
    try {
      // default permission policy ([envd] enforce_permissions = false): `user` may write into
      // root's directory; what it creates belongs to `user`
      expect(await sbx.files.makeDir("/root/envd-private-test/x")).toBe(true);
      await sbx.files.write("/root/envd-private-test/y.txt", "from user");
      expect(statSync("/root/envd-private-test/y.txt").uid).toBe(userIds.uid);
      expect(statSync("/root/envd-private-test/x").uid).toBe(userIds.uid);
      await sbx.files.write("/root/envd-private-test/z.txt", "yes", { user: "root" });
      expect(await sbx.files.read("/root/envd-private-test/z.txt", { user: "root" })).toBe("yes");
      expect(statSync("/root/envd-private-test/z.txt").uid).toBe(0);
      // but the commands themselves run as the user: the kernel refuses them
      const denied = await sbx.commands.run("cat /root/envd-private-test/z.txt").catch((e) => e);
      expect(denied).toBeInstanceOf(CommandExitError);
      expect(denied.stderr).toContain("Permission denied");
    } finally {
      rmSync("/root/envd-private-test", { recursive: true, force: true });
    }
  });

  test("watchDir reports create, write and remove", async () => {
    const wdir = join(dir, "watched");
    await sbx.files.makeDir(wdir);
    const events: { name: string; type: string }[] = [];
    const handle = await sbx.files.watchDir(wdir, (ev) => void events.push({ name: ev.name, type: ev.type }));
    await sbx.files.write(join(wdir, "new.txt"), "x");
    await waitFor("events.some((e) => e.name === \"new.txt\" && e.type === FilesystemEventType.CREATE)", () => events.some((e) => e.name === "new.txt" && e.type === FilesystemEventType.CREATE));
    await sbx.files.write(join(wdir, "new.txt"), "more");
    await waitFor("events.some((e) => e.name === \"new.txt\" && e.type === FilesystemEventType.WRITE)", () => events.some((e) => e.name === "new.txt" && e.type === FilesystemEventType.WRITE));
    await sbx.files.remove(join(wdir, "new.txt"));
    await waitFor("events.some((e) => e.name === \"new.txt\" && e.type === FilesystemEventType.REMOVE)", () => events.some((e) => e.name === "new.txt" && e.type === FilesystemEventType.REMOVE));
    await handle.stop();
    const withEntry: { name: string; type: string; size?: number }[] = [];
    const h2 = await sbx.files.watchDir(wdir, (ev) => void withEntry.push({ name: ev.name, type: ev.type, size: ev.entry?.size }), { includeEntry: true, recursive: true });
    await sbx.files.write(join(wdir, "deep/er/e.txt"), "12345");
    await waitFor("withEntry.some((e) => e.name === \"deep/er/e.txt\" && e.size === 5)", () => withEntry.some((e) => e.name === "deep/er/e.txt" && e.size === 5));
    await sbx.files.rename(join(wdir, "deep/er/e.txt"), join(wdir, "deep/er/f.txt"));
    await waitFor("withEntry.some((e) => e.name === \"deep/er/e.txt\" && e.type === FilesystemEventType.RENAME)", () => withEntry.some((e) => e.name === "deep/er/e.txt" && e.type === FilesystemEventType.RENAME));
    await h2.stop();
    const e = await sbx.files.watchDir(join(dir, "no-such-dir"), () => {}).catch((x) => x);
    expect(e).toBeInstanceOf(NotFoundError);
  });

  test("recursive watchDir reports what happened in new directories before their watch, in order, every run (issue 16 item 5)", async () => {
    for (let run = 0; run < 5; run++) {
      const w = join(dir, `w${run}`);
      await sbx.files.makeDir(w);
      const events: string[] = [];
      const h = await sbx.files.watchDir(w, (ev) => void events.push(`${ev.type} ${ev.name}`), { recursive: true });
      expect((await sbx.commands.run(`mkdir -p ${w}/a/b/c && echo x > ${w}/a/b/c/f`)).exitCode).toBe(0);
      await waitFor("events.includes(`${FilesystemEventType.WRITE} a/b/c/f`)", () => events.includes(`${FilesystemEventType.WRITE} a/b/c/f`));
      // a later write of an entry the scan reported is a new event (the scan's record of it
      // must not swallow it)
      expect((await sbx.commands.run(`echo y >> ${w}/a/b/c/f`)).exitCode).toBe(0);
      await waitFor("events.filter((e) => e === `${FilesystemEventType.WRITE} a/b/c/f`).length === 2", () => events.filter((e) => e === `${FilesystemEventType.WRITE} a/b/c/f`).length === 2);
      expect((await sbx.commands.run(`mv ${w}/a/b/c/f ${w}/g`)).exitCode).toBe(0);
      await waitFor("events.includes(`${FilesystemEventType.CREATE} g`)", () => events.includes(`${FilesystemEventType.CREATE} g`));
      await h.stop();
      const { CREATE, WRITE, RENAME } = FilesystemEventType;
      expect([run, events]).toEqual([
        run,
        [`${CREATE} a`, `${CREATE} a/b`, `${CREATE} a/b/c`, `${CREATE} a/b/c/f`, `${WRITE} a/b/c/f`, `${WRITE} a/b/c/f`, `${RENAME} a/b/c/f`, `${CREATE} g`],
      ]);
    }
  });

  test("recursive watchDir: the issue's reproduction as one shell command, five runs: each directory once, f's events a whole tail of its history, g last (issue 16 item 5)", async () => {
    const { CREATE, WRITE, RENAME } = FilesystemEventType;
    // What the watch can know of f depends on when a/b/c's watch began relative to the mv: f
    // seen by the scan (create, write, rename), gone before the scan but after the watch
    // (rename only; or write + rename when the write raced the scan), or moved before the watch
    // (nothing). Never a create without its write, a write without the rename, or a repeat.
    const tails = [[], [`${RENAME} a/b/c/f`], [`${WRITE} a/b/c/f`, `${RENAME} a/b/c/f`], [`${CREATE} a/b/c/f`, `${WRITE} a/b/c/f`, `${RENAME} a/b/c/f`]];
    const seen: number[] = [];
    for (let run = 0; run < 5; run++) {
      const w = join(dir, `w1-${run}`);
      await sbx.files.makeDir(w);
      const events: string[] = [];
      const h = await sbx.files.watchDir(w, (ev) => void events.push(`${ev.type} ${ev.name}`), { recursive: true });
      expect((await sbx.commands.run(`mkdir -p ${w}/a/b/c && echo x > ${w}/a/b/c/f && mv ${w}/a/b/c/f ${w}/g`)).exitCode).toBe(0);
      await waitFor("events.includes(`${CREATE} g`)", () => events.includes(`${CREATE} g`));
      // one more event marks the end: whatever the watch reports about the command came before it
      expect((await sbx.commands.run(`touch ${w}/end`)).exitCode).toBe(0);
      await waitFor("events.includes(`${CREATE} end`)", () => events.includes(`${CREATE} end`));
      await h.stop();
      const body = events.slice(0, events.indexOf(`${CREATE} end`));
      const tail = body.slice(3, -1);
      expect([run, body.slice(0, 3), body.at(-1)]).toEqual([run, [`${CREATE} a`, `${CREATE} a/b`, `${CREATE} a/b/c`], `${CREATE} g`]);
      const which = tails.findIndex((t) => JSON.stringify(t) === JSON.stringify(tail));
      expect([run, which >= 0 ? "a tail" : tail]).toEqual([run, "a tail"]);
      seen.push(tail.length);
    }
    console.log(`one-command runs: events about a/b/c/f per run ${JSON.stringify(seen)} (3 = create, write, rename)`);
  });
});

describe("auth", () => {
  test("a wrong access token is rejected with AuthenticationError", async () => {
    const bad = new Sandbox({ ...sdkOpts(), sandboxId: "sbxenvdtest", envdVersion: ENVD_VERSION, envdAccessToken: "wrong" } as never);
    const e = await bad.commands.run("true").catch((x) => x);
    expect(e).toBeInstanceOf(AuthenticationError);
    const e2 = await bad.files.list("/").catch((x) => x);
    expect(e2).toBeInstanceOf(AuthenticationError);
  });

  test("signed uploadUrl/downloadUrl work without the access token; tampering is refused", async () => {
    const p = join(dir, "signed.txt");
    const up = await sbx.uploadUrl(p, { useSignatureExpiration: 60 });
    const form = new FormData();
    form.append("file", new Blob(["signed upload"]), "ignored-name.txt");
    const res = await fetch(up, { method: "POST", body: form });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { path: string }[])[0]!.path).toBe(p);
    const down = await sbx.downloadUrl(p, { user: "user" });
    expect(await (await fetch(down)).text()).toBe("signed upload");
    const tampered = new URL(down);
    tampered.searchParams.set("path", join(dir, "hello.txt"));
    expect((await fetch(tampered)).status).toBe(401);
  });

  test("Sandbox.connect reaches the same envd; isRunning via /health", async () => {
    const again = await Sandbox.connect("sbxenvdtest", sdkOpts());
    expect(await again.isRunning()).toBe(true);
    expect((await again.commands.run("echo again")).stdout).toBe("again\n");
  });
});
