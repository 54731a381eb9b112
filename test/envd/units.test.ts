/**
 * Unit tests of envd's pure pieces: multipart reader, Range parsing, Go mode strings, file
 * signatures, winsize encoding, /init validation, the event queue, path resolution.
 */
import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync, mkdirSync, chmodSync } from "node:fs";
import { lstatSync } from "node:fs";
import { join } from "node:path";
import { freeBuffer, freedOnRelease } from "../../src/envd/buffers.ts";
import { EnvdError } from "../../src/envd/errors.ts";
import { goModeString } from "../../src/envd/filesystem/entry.ts";
import { chooseEncoding, contentDisposition, fileSignature, parseRange } from "../../src/envd/http/files.ts";
import { parseInitBody } from "../../src/envd/http/init.ts";
import { parseMeminfo } from "../../src/envd/http/metrics.ts";
import { boundaryOf, parseDisposition, readMultipart, type PartInfo } from "../../src/envd/http/multipart.ts";
import { resolvePath } from "../../src/envd/paths.ts";
import { exitStatusText } from "../../src/envd/process/signals.ts";
import { EventQueue } from "../../src/envd/queue.ts";
import { EnvdState } from "../../src/envd/state.ts";
import { lookupUser } from "../../src/envd/users.ts";
import { encodeWinsize, openPty, resizePty, WINSIZE_SIZE } from "../../src/ffi/pty.ts";

async function* chunks(data: Uint8Array, size: number) {
  for (let i = 0; i < data.length; i += size) yield data.subarray(i, i + size);
}

async function parseAll(body: Uint8Array, boundary: string, chunkSize: number) {
  const parts: { info: PartInfo; data: Buffer }[] = [];
  let maxChunk = 0;
  const n = await readMultipart(chunks(body, chunkSize), boundary, async (info) => {
    const bufs: Buffer[] = [];
    parts.push({ info, data: Buffer.alloc(0) });
    const idx = parts.length - 1;
    return {
      write: async (c) => {
        maxChunk = Math.max(maxChunk, c.length);
        bufs.push(Buffer.from(c));
      },
      end: async () => {
        parts[idx]!.data = Buffer.concat(bufs);
      },
    };
  });
  return { n, parts, maxChunk };
}

describe("buffers freed once written", () => {
  test("a whole buffer is freed (detached, empty after); a view into a larger one, or a detached one, is left alone", () => {
    const whole = new Uint8Array(65536).fill(7);
    expect(freedOnRelease(whole)).toBe(true);
    freeBuffer(whole);
    expect(whole.buffer.detached).toBe(true);
    expect(whole.byteLength).toBe(0);
    expect(freedOnRelease(whole)).toBe(false);
    freeBuffer(whole); // a second free is a no-op
    const parent = new Uint8Array(8192).fill(9);
    for (const view of [parent.subarray(0, 4096), parent.subarray(4096), parent.subarray(1, 8192)]) {
      expect(freedOnRelease(view)).toBe(false);
      freeBuffer(view);
      expect(parent.buffer.detached).toBe(false);
    }
    expect(parent.byteLength).toBe(8192);
    expect(parent.every((b) => b === 9)).toBe(true);
    // a view over all of a buffer still counts as the whole of it
    const all = new Uint8Array(parent.buffer);
    expect(freedOnRelease(all)).toBe(true);
    const shared = new Uint8Array(new SharedArrayBuffer(4096));
    expect(freedOnRelease(shared)).toBe(false);
    freeBuffer(shared);
    expect(shared.byteLength).toBe(4096);
  });
});

describe("multipart reader", () => {
  const boundary = "----b0undary";
  const binary = new Uint8Array(70_000).map((_, i) => (i * 31) & 0xff);
  // a body containing something that looks like a delimiter prefix
  const tricky = Buffer.from("line\r\n------b0undar\r\n--not it");
  const body = Buffer.concat([
    Buffer.from(`preamble\r\n--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="/tmp/dir/a.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`),
    Buffer.from(binary),
    Buffer.from(`\r\n--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="rel/b.txt"\r\n\r\n`),
    tricky,
    Buffer.from(`\r\n--${boundary}\r\nContent-Disposition: form-data; name="other"\r\n\r\nignored\r\n--${boundary}--\r\nepilogue`),
  ]);

  for (const size of [1, 7, 64, 4096, body.length]) {
    test(`parts and bytes survive ${size}-byte chunks`, async () => {
      const { n, parts } = await parseAll(body, boundary, size);
      expect(n).toBe(3);
      expect(parts.map((p) => [p.info.name, p.info.filename])).toEqual([
        ["file", "/tmp/dir/a.bin"],
        ["file", "rel/b.txt"],
        ["other", undefined],
      ]);
      expect(parts[0]!.info.contentType).toBe("application/octet-stream");
      expect(Buffer.compare(parts[0]!.data, Buffer.from(binary))).toBe(0);
      expect(parts[1]!.data.toString()).toBe(tricky.toString());
      expect(parts[2]!.data.toString()).toBe("ignored");
    });
  }

  test("part bodies are streamed, not collected (chunk bound = network chunk)", async () => {
    const { maxChunk } = await parseAll(body, boundary, 4096);
    expect(maxChunk).toBeLessThanOrEqual(4096 + 64);
  });

  test("truncated body and bad delimiter are invalid_argument", async () => {
    const cut = body.subarray(0, 500);
    const e1 = await parseAll(cut, boundary, 100).catch((e) => e);
    expect(e1).toBeInstanceOf(EnvdError);
    expect(e1.kind).toBe("invalid_argument");
    const bad = Buffer.from(`--${boundary}XX\r\n\r\n`);
    const e2 = await parseAll(bad, boundary, 3).catch((e) => e);
    expect(e2.kind).toBe("invalid_argument");
  });

  test("boundary and disposition parsing", () => {
    expect(boundaryOf('multipart/form-data; boundary="a b"')).toBe("a b");
    expect(boundaryOf("multipart/form-data; charset=x; boundary=xyz")).toBe("xyz");
    expect(() => boundaryOf("multipart/form-data")).toThrow(EnvdError);
    expect(parseDisposition('form-data; name="file"; filename="/a/\\"q\\".txt"')).toEqual({ name: "file", filename: '/a/"q".txt' });
    expect(parseDisposition("form-data; name=file; filename*=UTF-8''%C3%A9.txt")).toEqual({ name: "file", filename: "é.txt" });
  });
});

describe("http helpers", () => {
  test("Content-Disposition: ASCII only, RFC 6266 filename* for other names", () => {
    expect(contentDisposition("report.txt")).toBe('inline; filename="report.txt"');
    expect(contentDisposition('a"b\\c.txt')).toBe(`inline; filename="a_b_c.txt"; filename*=UTF-8''a%22b%5Cc.txt`);
    expect(contentDisposition("测试 文件.txt")).toBe(`inline; filename="__ __.txt"; filename*=UTF-8''%E6%B5%8B%E8%AF%95%20%E6%96%87%E4%BB%B6.txt`);
    expect(contentDisposition("🤣.txt")).toBe(`inline; filename="_.txt"; filename*=UTF-8''%F0%9F%A4%A3.txt`);
    expect(contentDisposition("café (1)'s*.txt")).toBe(`inline; filename="caf_ (1)'s*.txt"; filename*=UTF-8''caf%C3%A9%20%281%29%27s%2A.txt`);
  });

  test("Accept-Encoding negotiation (RFC 9110 q-values)", () => {
    const cases: [string | null, "gzip" | "identity" | null][] = [
      [null, "identity"],
      ["", "identity"],
      ["gzip", "gzip"],
      ["GZIP", "gzip"],
      ["x-gzip", "gzip"],
      ["br", "identity"],
      ["br, identity;q=0", null],
      ["gzip;q=0", "identity"],
      ["gzip;q=0, identity;q=0", null],
      ["*;q=0", null],
      ["*;q=0, gzip", "gzip"],
      ["*", "gzip"],
      ["gzip;q=0.5, identity", "identity"],
      ["identity;q=0.1, gzip;q=0.2", "gzip"],
      ["gzip;q=0.3, gzip;q=0", "gzip"],
      ["deflate, gzip ; q=1.0", "gzip"],
    ];
    for (const [h, want] of cases) expect([h, chooseEncoding(h)]).toEqual([h, want]);
  });

  test("Range parsing", () => {
    expect(parseRange(null, 100)).toBeUndefined();
    expect(parseRange("bytes=0-9", 100)).toEqual({ start: 0, end: 9 });
    expect(parseRange("bytes=90-", 100)).toEqual({ start: 90, end: 99 });
    expect(parseRange("bytes=-5", 100)).toEqual({ start: 95, end: 99 });
    expect(parseRange("bytes=50-500", 100)).toEqual({ start: 50, end: 99 });
    expect(parseRange("bytes=100-", 100)).toBe("unsatisfiable");
    expect(parseRange("bytes=0-1,3-4", 100)).toBeUndefined();
  });

  test("file signature matches the SDK's formula (sha256, base64 without padding)", () => {
    // sha256("/a:read:user:tok") computed independently with node:crypto
    const raw = require("node:crypto").createHash("sha256").update("/a:read:user:tok").digest("base64").replace(/=+$/, "");
    expect(fileSignature("/a", "read", "user", "tok")).toBe(`v1_${raw}`);
    expect(fileSignature("/a", "write", "", "tok", 1700000000)).not.toBe(fileSignature("/a", "write", "", "tok"));
    expect(fileSignature("/a", "read", "user", "tok")).not.toContain("=");
  });

  test("/init body validation", () => {
    expect(parseInitBody({ accessToken: "t", envVars: { A: "1" }, defaultUser: "root", timestamp: "2026-01-01T00:00:00Z" })).toEqual({
      accessToken: "t",
      envVars: { A: "1" },
      defaultUser: "root",
      timestamp: "2026-01-01T00:00:00Z",
    });
    expect(() => parseInitBody({ envVars: { A: 1 } })).toThrow(/envVars/);
    expect(() => parseInitBody({ timestamp: "yesterday" })).toThrow(/timestamp/);
    expect(() => parseInitBody({ defaultUser: "no-such-user-xyz" })).toThrow(/names no local user/);
    expect(() => parseInitBody([1])).toThrow(EnvdError);
  });

  test("older /init timestamps are ignored", () => {
    const s = new EnvdState();
    expect(s.apply({ accessToken: "new", timestamp: "2026-01-02T00:00:00Z" })).toBe(true);
    expect(s.apply({ accessToken: "old", timestamp: "2026-01-01T00:00:00Z" })).toBe(false);
    expect(s.accessToken).toBe("new");
  });

  test("meminfo parsing in bytes", () => {
    expect(parseMeminfo("MemTotal:       1000 kB\nMemAvailable:    250 kB\nHugePages_Total:       0\n")).toEqual({
      MemTotal: 1024000,
      MemAvailable: 256000,
      HugePages_Total: 0,
    });
  });
});

describe("users", () => {
  test("root exists without /etc/passwd (an empty image); other names do not", () => {
    const dir = mkdtempSync("/tmp/envd-users-");
    try {
      const none = join(dir, "missing");
      expect(lookupUser("root", none)).toEqual({ name: "root", uid: 0, gid: 0, home: "/root", shell: "/bin/sh" });
      expect(() => lookupUser("user", none)).toThrow(EnvdError);
      // an entry in the file wins over the fallback
      writeFileSync(join(dir, "passwd"), "root:x:0:0:root:/var/root:/bin/ash\nuser:x:1000:1000::/home/user:/bin/sh\n");
      expect(lookupUser("root", join(dir, "passwd"))).toEqual({ name: "root", uid: 0, gid: 0, home: "/var/root", shell: "/bin/ash" });
      expect(lookupUser("user", join(dir, "passwd")).uid).toBe(1000);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("entries and paths", () => {
  test("Go FileMode strings", () => {
    const d = mkdtempSync("/tmp/envd-units-");
    try {
      writeFileSync(join(d, "f"), "");
      chmodSync(join(d, "f"), 0o640);
      mkdirSync(join(d, "dir"), { mode: 0o755 });
      chmodSync(join(d, "dir"), 0o1777);
      symlinkSync("f", join(d, "l"));
      chmodSync(join(d, "f"), 0o4755);
      expect(goModeString(lstatSync(join(d, "f")))).toBe("urwxr-xr-x");
      chmodSync(join(d, "f"), 0o640);
      expect(goModeString(lstatSync(join(d, "f")))).toBe("-rw-r-----");
      expect(goModeString(lstatSync(join(d, "dir")))).toBe("dtrwxrwxrwx");
      expect(goModeString(lstatSync(join(d, "l")))).toBe("Lrwxrwxrwx");
      expect(statSync(join(d, "f")).size).toBe(0);
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });

  test("path resolution: ~, relative to home or workdir, normalised", () => {
    const u = { name: "u", uid: 1, gid: 1, home: "/home/u", shell: "/bin/sh" };
    expect(resolvePath("~", u)).toBe("/home/u");
    expect(resolvePath("~/a/../b", u)).toBe("/home/u/b");
    expect(resolvePath("x/y", u)).toBe("/home/u/x/y");
    // E2B: a relative path is the acting user's home's, the default workdir only stands for an empty path
    expect(resolvePath("x", u, "/srv/app")).toBe("/home/u/x");
    expect(resolvePath("", u, "/srv/app")).toBe("/srv/app");
    expect(resolvePath("", u)).toBe("/home/u");
    expect(resolvePath("/a//b/./c", u)).toBe("/a/b/c");
    expect(() => resolvePath("a\0b", u)).toThrow(EnvdError);
  });

  test("exit status text follows Go's ProcessState.String()", () => {
    expect(exitStatusText(0, null)).toBe("exit status 0");
    expect(exitStatusText(null, "SIGKILL")).toBe("signal: killed");
    expect(exitStatusText(null, "SIGTERM")).toBe("signal: terminated");
  });
});

describe("pty ffi", () => {
  test("struct winsize is 8 bytes, rows then cols, little-endian u16", () => {
    expect(WINSIZE_SIZE).toBe(8);
    expect(Array.from(encodeWinsize(132, 40))).toEqual([40, 0, 132, 0, 0, 0, 0, 0]);
  });

  test("openpty gives a working pair and TIOCSWINSZ takes effect", async () => {
    const { master, slave } = openPty(90, 20);
    try {
      const p = Bun.spawn(["stty", "size"], { stdin: slave, stdout: "pipe" });
      expect(await new Response(p.stdout).text()).toBe("20 90\n");
      resizePty(master, 100, 31);
      const q = Bun.spawn(["stty", "size"], { stdin: slave, stdout: "pipe" });
      expect(await new Response(q.stdout).text()).toBe("31 100\n");
      expect(() => resizePty(-1, 1, 1)).toThrow(/TIOCSWINSZ/);
    } finally {
      require("node:fs").closeSync(master);
      require("node:fs").closeSync(slave);
    }
  });
});

describe("event queue", () => {
  test("delivers in order, injects keepalives, stops on abort and releases the producer", async () => {
    const q = new EventQueue<string>(2);
    const ac = new AbortController();
    const got: string[] = [];
    const consumer = (async () => {
      for await (const v of q.iterate(ac.signal, 50, () => "ka")) {
        got.push(v);
        if (got.length === 5) ac.abort();
      }
    })();
    q.push("a");
    q.push("b");
    q.push("c");
    let released = false;
    const w = q.waitForSpace().then(() => (released = true));
    await w;
    expect(released).toBe(true);
    await consumer;
    expect(got.slice(0, 3)).toEqual(["a", "b", "c"]);
    expect(got.slice(3)).toEqual(["ka", "ka"]);
    expect(q.closed).toBe(true);
    // after the consumer left, producers never block
    q.push("x");
    q.push("y");
    q.push("z");
    await q.waitForSpace();
  });

  test("close with an error raises it after queued items", async () => {
    const q = new EventQueue<number>(4);
    q.push(1);
    q.close(new Error("boom"));
    const got: number[] = [];
    const err = await (async () => {
      for await (const v of q.iterate(new AbortController().signal)) got.push(v);
    })().catch((e) => e);
    expect(got).toEqual([1]);
    expect(err.message).toBe("boom");
    expect(() => new EventQueue(0)).toThrow(RangeError);
  });
});

describe("inotify ffi", () => {
  test("decoder reassembles records split across chunks (16-byte header + padded name)", async () => {
    const { InotifyDecoder, EVENT_HEADER_SIZE, IN_CREATE, IN_ISDIR } = await import("../../src/ffi/inotify.ts");
    expect(EVENT_HEADER_SIZE).toBe(16);
    const rec = (wd: number, mask: number, cookie: number, name: string) => {
      const n = name ? Buffer.alloc(Math.ceil((name.length + 1) / 16) * 16) : Buffer.alloc(0);
      n.write(name);
      const h = Buffer.alloc(16);
      h.writeInt32LE(wd, 0);
      h.writeUInt32LE(mask, 4);
      h.writeUInt32LE(cookie, 8);
      h.writeUInt32LE(n.length, 12);
      return Buffer.concat([h, n]);
    };
    const all = Buffer.concat([rec(1, IN_CREATE, 0, "a.txt"), rec(2, IN_CREATE | IN_ISDIR, 7, "a-much-longer-name"), rec(1, 0x400, 0, "")]);
    const d = new InotifyDecoder();
    const got = [];
    for (let i = 0; i < all.length; i += 5) got.push(...d.push(all.subarray(i, i + 5)));
    expect(got).toEqual([
      { wd: 1, mask: IN_CREATE, cookie: 0, name: "a.txt" },
      { wd: 2, mask: IN_CREATE | IN_ISDIR, cookie: 7, name: "a-much-longer-name" },
      { wd: 1, mask: 0x400, cookie: 0, name: "" },
    ]);
  });

  test("watching a missing directory is inotify.not_found", async () => {
    const { inotifyInit, inotifyAddWatch, IN_CREATE } = await import("../../src/ffi/inotify.ts");
    const fd = inotifyInit();
    try {
      expect(() => inotifyAddWatch(fd, "/no/such/dir/xyz", IN_CREATE)).toThrow(expect.objectContaining({ code: "inotify.not_found" }));
      expect(inotifyAddWatch(fd, "/tmp", IN_CREATE)).toBeGreaterThan(0);
    } finally {
      require("node:fs").closeSync(fd);
    }
  });
});

describe("network mounts", () => {
  test("ext4, /proc and missing paths are not network mounts", async () => {
    const { isNetworkMount } = await import("../../src/envd/filesystem/service.ts");
    expect(isNetworkMount("/")).toBe(false);
    expect(isNetworkMount("/proc")).toBe(false);
    expect(isNetworkMount("/no/such/path")).toBe(false);
  });
});
