/**
 * envd over the binary protobuf Connect protocol, driven by a plain Connect client
 * (`@connectrpc/connect-node`, HTTP/1.1, `useBinaryFormat: true`) — not the E2B SDK.
 * Real parts: envd child process, processes, PTYs, files under a temp dir.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { connect as connectTcp } from "node:net";
import { dirname, join } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { EventType, FileType, Filesystem } from "../../src/envd/gen/filesystem_pb.ts";
import { ConnectRequestSchema, Process, Signal, StreamInputRequestSchema } from "../../src/envd/gen/process_pb.ts";
import { envelope as envelopeOf } from "../../src/envd/connect-stream.ts";
import { initEnvd, procState, startEnvdChild, type EnvdChild } from "./harness.ts";
import { waitFor } from "../helpers/wait.ts";

const TOKEN = "connect-test-token-0123456789";
let envd: EnvdChild;
let proc: Client<typeof Process>;
let fsc: Client<typeof Filesystem>;
let dir: string;

function transport(headers: Record<string, string> = { "x-access-token": TOKEN }, binary = true) {
  return createConnectTransport({
    baseUrl: envd.url,
    httpVersion: "1.1",
    useBinaryFormat: binary,
    interceptors: [
      (next) => async (req) => {
        for (const [k, v] of Object.entries(headers)) req.header.set(k, v);
        return next(req);
      },
    ],
  });
}

async function codeOf(p: Promise<unknown>): Promise<Code | "ok"> {
  try {
    await p;
    return "ok";
  } catch (e) {
    return ConnectError.from(e).code;
  }
}

const dec = new TextDecoder();

/** Server streams from the Connect client are async generators; say so for `.next()`. */
function gen<T>(it: AsyncIterable<T>): AsyncGenerator<T> {
  return it as AsyncGenerator<T>;
}

beforeAll(async () => {
  envd = await startEnvdChild();
  expect((await initEnvd(envd.url, { accessToken: TOKEN, defaultUser: "root" })).status).toBe(204);
  proc = createClient(Process, transport());
  fsc = createClient(Filesystem, transport());
  dir = mkdtempSync("/tmp/envd-connect-");
}, 30_000);

afterAll(async () => {
  await envd?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe("process over binary Connect", () => {
  test("large binary output (issue 15): 2 x 48 MiB of every byte value on stdout and stderr at once, decoded by the Connect client: byte-exact per stream, in order, events <= 32 KiB, both streams interleaved", async () => {
    // two files of pseudo-random bytes (all 256 values, most >= 0x80 half the time); the command
    // writes them to stdout and stderr in alternating 1 MiB blocks, so both pipes run at volume
    const MIB = 1 << 20;
    const BLOCKS = 48;
    const rand = (seed: number) => {
      const b = new Uint8Array(BLOCKS * MIB);
      const v = new DataView(b.buffer);
      let x = seed >>> 0;
      for (let i = 0; i < b.length; i += 4) {
        x ^= x << 13;
        x ^= x >>> 17;
        x ^= x << 5;
        v.setUint32(i, x >>> 0);
      }
      return b;
    };
    const want = { stdout: rand(0x9e3779b9), stderr: rand(0x85ebca6b) };
    const bin = mkdtempSync("/tmp/envd-binary-out-");
    writeFileSync(join(bin, "out.bin"), want.stdout);
    writeFileSync(join(bin, "err.bin"), want.stderr);
    const script = `for i in $(seq 0 ${BLOCKS - 1}); do dd if=out.bin bs=1M skip=$i count=1 status=none; dd if=err.bin bs=1M skip=$i count=1 status=none >&2; done`;
    const got = { stdout: new Uint8Array(BLOCKS * MIB), stderr: new Uint8Array(BLOCKS * MIB) };
    const at = { stdout: 0, stderr: 0 };
    const order: string[] = [];
    let largest = 0;
    let high = 0;
    let end: unknown;
    try {
      for await (const res of proc.start({ process: { cmd: "/bin/sh", args: ["-c", script], cwd: bin }, stdin: false })) {
        const ev = res.event!.event;
        if (ev.case === "end") end = ev.value;
        if (order.at(-1) !== ev.case && ev.case !== "data") order.push(ev.case!);
        if (ev.case !== "data") continue;
        const kind = ev.value.output.case as "stdout" | "stderr";
        const bytes = ev.value.output.value as Uint8Array;
        if (order.at(-1) !== kind) order.push(kind);
        largest = Math.max(largest, bytes.byteLength);
        for (let i = 0; i < bytes.length; i += 997) if (bytes[i]! >= 0x80) high++;
        got[kind].set(bytes, at[kind]);
        at[kind] += bytes.byteLength;
      }
    } finally {
      rmSync(bin, { recursive: true, force: true });
    }
    expect(at).toEqual({ stdout: BLOCKS * MIB, stderr: BLOCKS * MIB });
    expect(Buffer.from(got.stdout).equals(Buffer.from(want.stdout))).toBe(true);
    expect(Buffer.from(got.stderr).equals(Buffer.from(want.stderr))).toBe(true);
    expect(high).toBeGreaterThan(40_000); // bytes >= 0x80 went through (about half of those sampled)
    expect(largest).toBe(32 * 1024);
    expect(order[0]).toBe("start");
    expect(order.at(-1)).toBe("end");
    // neither stream waited for the other to finish: they alternate many times
    expect(order.filter((k) => k === "stderr").length).toBeGreaterThan(BLOCKS / 4);
    expect(end).toMatchObject({ exited: true, exitCode: 0 });
  }, 120_000);

  test("three streams of one process (Start; Connect reading slowly in JSON; Connect that stops reading, then goes away): the two that stay get every byte exactly; a read is freed only once every stream is done with it", async () => {
    const MIB = 1 << 20;
    // more than the loopback socket buffers of the two paused streams hold, so their queues fill
    const want = new Uint8Array(96 * MIB);
    let x = 0x2545f491;
    for (let i = 0; i < want.length; i++) {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      want[i] = x & 0xff;
    }
    const work = mkdtempSync("/tmp/envd-two-streams-");
    writeFileSync(join(work, "out.bin"), want);
    // the output starts only once the other two streams are attached (the file "go" appears)
    const script = "while [ ! -e go ]; do sleep 0.02; done; cat out.bin";
    let gone!: () => void;
    /** Resolves when the leaver (below) has disconnected. */
    const leaverGone = new Promise<void>((r) => (gone = r));
    const collect = async (it: AsyncIterable<{ event?: { event: { case?: string; value?: unknown } } }>, slow: boolean, onStart?: (pid: number) => void) => {
      const chunks: Uint8Array[] = [];
      const kinds: string[] = [];
      let n = 0;
      for await (const r of it) {
        const ev = r.event!.event;
        if (kinds.at(-1) !== ev.case) kinds.push(ev.case!);
        if (ev.case === "start") onStart?.((ev.value as { pid: number }).pid);
        if (ev.case !== "data") continue;
        chunks.push((ev.value as { output: { value: Uint8Array } }).output.value);
        // the slow reader lags behind: its queue holds reads the fast one already sent; and it
        // pauses while the leaver goes away, so both queues hold the same reads then
        if (slow && ++n % 16 === 0) await Bun.sleep(5);
        if (slow && n === 8) await leaverGone;
      }
      return { bytes: Buffer.concat(chunks), kinds };
    };
    const json = createClient(Process, transport({ "x-access-token": TOKEN }, false));
    /**
     * A Connect over a plain TCP socket that stops reading after its first bytes (the kernel's
     * buffers fill, then envd's queue for it holds reads), then disconnects: returns the bytes
     * it got before it stopped.
     */
    const leaver = (pid: number, onStart: () => void): Promise<number> =>
      new Promise((resolve, reject) => {
        const url = new URL(envd.url);
        const body = Buffer.from(envelopeOf(toBinary(ConnectRequestSchema, create(ConnectRequestSchema, { process: { selector: { case: "pid", value: pid } } }))));
        const sock = connectTcp(Number(url.port), url.hostname);
        sock.on("error", reject);
        sock.on("connect", () => {
          sock.write(`POST /process.Process/Connect HTTP/1.1\r\nHost: ${url.host}\r\nContent-Type: application/connect+proto\r\nConnect-Protocol-Version: 1\r\nx-access-token: ${TOKEN}\r\nContent-Length: ${body.byteLength}\r\n\r\n`);
          sock.write(body);
        });
        sock.once("data", (d) => {
          sock.pause();
          onStart();
          setTimeout(() => {
            sock.destroy();
            resolve(Buffer.byteLength(d));
            gone();
          }, 1000);
        });
      });
    try {
      let attached!: Promise<[{ bytes: Buffer; kinds: string[] }, number]>;
      let started = 0;
      const go = () => ++started === 2 && writeFileSync(join(work, "go"), "");
      const first = collect(proc.start({ process: { cmd: "/bin/sh", args: ["-c", script], cwd: work }, stdin: false }), false, (pid) => {
        attached = Promise.all([collect(json.connect({ process: { selector: { case: "pid", value: pid } } }), true, go), leaver(pid, go)]);
      });
      const a = await first;
      const [b, left] = await attached;
      expect(left).toBeGreaterThan(0);
      for (const got of [a, b]) {
        expect(got.kinds).toEqual(["start", "data", "end"]);
        expect(got.bytes.byteLength).toBe(want.byteLength);
        expect(got.bytes.equals(Buffer.from(want))).toBe(true);
      }
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  }, 120_000);

  test("Start streams start, stdout/stderr bytes and end in order", async () => {
    const kinds: string[] = [];
    let out = "";
    let err = "";
    let end: { exitCode: number; exited: boolean; status: string; error?: string } | undefined;
    for await (const res of proc.start({ process: { cmd: "/bin/sh", args: ["-c", "printf 'a\\0b'; printf e >&2; exit 5"] }, stdin: false })) {
      const ev = res.event!.event;
      kinds.push(ev.case!);
      if (ev.case === "data" && ev.value.output.case === "stdout") out += dec.decode(ev.value.output.value);
      if (ev.case === "data" && ev.value.output.case === "stderr") err += dec.decode(ev.value.output.value);
      if (ev.case === "end") end = ev.value;
    }
    expect(kinds[0]).toBe("start");
    expect(kinds.at(-1)).toBe("end");
    expect(out).toBe("a\0b");
    expect(err).toBe("e");
    expect(end).toMatchObject({ exitCode: 5, exited: true, status: "exit status 5", error: "exit status 5" });
  });

  test("unknown pid is not_found; bad selector is invalid_argument; unsupported signal unimplemented", async () => {
    expect(await codeOf(proc.sendSignal({ process: { selector: { case: "pid", value: 999_999 } }, signal: Signal.SIGKILL }))).toBe(Code.NotFound);
    expect(await codeOf(proc.sendInput({ process: { selector: { case: "tag", value: "nope" } }, input: { input: { case: "stdin", value: new Uint8Array([1]) } } }))).toBe(Code.NotFound);
    expect(await codeOf(proc.closeStdin({}))).toBe(Code.Unimplemented);
    expect(await codeOf(gen(proc.start({ process: { cmd: "" } })).next())).toBe(Code.InvalidArgument);
    expect(await codeOf(gen(proc.start({ process: { cmd: "/no/such/binary" } })).next())).toBe(Code.InvalidArgument);
    const it = gen(proc.start({ process: { cmd: "/bin/sleep", args: ["5"] }, tag: "sleeper" }));
    const first = await it.next();
    const pid = (first.value.event.event.value as { pid: number }).pid;
    expect(await codeOf(proc.sendSignal({ process: { selector: { case: "pid", value: pid } }, signal: Signal.UNSPECIFIED }))).toBe(Code.Unimplemented);
    // a process started with stdin: false takes no input; closing its stdin is a no-op (as in E2B)
    const quiet = gen(proc.start({ process: { cmd: "/bin/sleep", args: ["5"] }, stdin: false }));
    const qpid = ((await quiet.next()).value.event.event.value as { pid: number }).pid;
    const sel = { selector: { case: "pid" as const, value: qpid } };
    expect(await codeOf(proc.sendInput({ process: sel, input: { input: { case: "stdin", value: new Uint8Array([1]) } } }))).toBe(Code.Internal);
    expect(await codeOf(proc.sendInput({ process: sel, input: { input: { case: "pty", value: new Uint8Array([1]) } } }))).toBe(Code.Internal);
    expect(await codeOf(proc.update({ process: sel, pty: { size: { cols: 10, rows: 10 } } }))).toBe(Code.Internal);
    expect(await codeOf(proc.closeStdin({ process: sel }))).toBe("ok");
    await proc.sendSignal({ process: sel, signal: Signal.SIGKILL });
    for await (const _ of quiet);
    // tags select too
    expect(await codeOf(proc.sendSignal({ process: { selector: { case: "tag", value: "sleeper" } }, signal: Signal.SIGTERM }))).toBe("ok");
    let end;
    for await (const r of it) if (r.event?.event.case === "end") end = r.event.event.value;
    expect(end).toMatchObject({ exitCode: -1, exited: false, status: "signal: terminated" });
  });

  test("client disconnect leaves the process running; Connect re-attaches; no zombie after kill", async () => {
    const ac = new AbortController();
    const it = gen(proc.start({ process: { cmd: "/bin/sh", args: ["-c", "i=0; while true; do echo tick$i; i=$((i+1)); sleep 0.1; done"] }, tag: "ticker" }, { signal: ac.signal }));
    const first = await it.next();
    const pid = (first.value.event.event.value as { pid: number }).pid;
    await it.next(); // some output arrived
    ac.abort();
    expect(await codeOf(it.next())).toBe(Code.Canceled);
    const listed = await proc.list({});
    expect(listed.processes.find((p) => p.pid === pid)?.tag).toBe("ticker");

    const again = gen(proc.connect({ process: { selector: { case: "tag", value: "ticker" } } }));
    const start = await again.next();
    expect(start.value.event.event).toEqual({ case: "start", value: expect.objectContaining({ pid }) });
    let text = "";
    for await (const r of again) {
      const ev = r.event!.event;
      if (ev.case === "data" && ev.value.output.case === "stdout") text += dec.decode(ev.value.output.value);
      if (text.includes("\n") && /tick\d+\n/.test(text)) break;
    }
    expect(text).toMatch(/tick\d+\n/);
    // it wrote after the client went away: the disconnect left it running (alive, not a zombie)
    expect(procState(pid)).toMatch(/^[RSD]$/);
    await proc.sendSignal({ process: { selector: { case: "pid", value: pid } }, signal: Signal.SIGKILL });
    await waitFor("procState(pid) === undefined", () => procState(pid) === undefined);
    // within the retention window Connect still returns start + the recorded end
    const late = [];
    for await (const r of proc.connect({ process: { selector: { case: "pid", value: pid } } })) late.push(r.event!.event.case);
    expect(late).toEqual(["start", "end"]);
    expect((await proc.list({})).processes.some((p) => p.pid === pid)).toBe(false);
  }, 20_000);

  test("a client that stops reading and disconnects never stalls the process (back-pressure released)", async () => {
    const ac = new AbortController();
    // ~64 MiB of output: far more than pipe + stream buffers hold while nobody reads
    const it = gen(proc.start({ process: { cmd: "/bin/sh", args: ["-c", "head -c 67108864 /dev/zero; echo finished >&2"] } }, { signal: ac.signal }));
    const pid = ((await it.next()).value.event.event.value as { pid: number }).pid;
    await it.next();
    ac.abort();
    await codeOf(it.next());
    // attach late: the process must run to completion on its own
    const kinds: string[] = [];
    for await (const r of proc.connect({ process: { selector: { case: "pid", value: pid } } })) {
      const ev = r.event!.event;
      if (ev.case !== "data") kinds.push(ev.case!);
      if (ev.case === "end") expect(ev.value.exitCode).toBe(0);
    }
    expect(kinds.at(-1)).toBe("end");
    await waitFor("procState(pid) === undefined", () => procState(pid) === undefined);
  }, 30_000);

  test("idle PTYs do not starve other work (no blocking reads on pool threads)", async () => {
    const ptys = [];
    for (let i = 0; i < 8; i++) {
      const it = gen(proc.start({ process: { cmd: "/bin/sleep", args: ["20"] }, pty: { size: { cols: 80, rows: 24 } } }));
      ptys.push({ it, pid: ((await it.next()).value.event.event.value as { pid: number }).pid });
    }
    try {
      let out = "";
      for await (const r of proc.start({ process: { cmd: "/bin/echo", args: ["alive"] } })) {
        const ev = r.event!.event;
        if (ev.case === "data") out += dec.decode(ev.value.output.value as Uint8Array);
      }
      expect(out).toBe("alive\n");
      const poolFile = join(mkdtempSync("/tmp/envd-pool-"), "pool.txt");
      writeFileSync(poolFile, "pool");
      const st = await fsc.stat({ path: poolFile });
      rmSync(dirname(poolFile), { recursive: true });
      expect(st.entry?.size).toBe(4n);
      // done while every idle PTY's `sleep 20` still runs: the work was not queued behind them
      for (const p of ptys) expect(procState(p.pid)).toMatch(/^[RSD]$/);
    } finally {
      for (const p of ptys) await proc.sendSignal({ process: { selector: { case: "pid", value: p.pid } }, signal: Signal.SIGKILL });
      for (const p of ptys) for await (const _ of p.it);
    }
  }, 30_000);

  test("keepalive events arrive at the interval the client asks for", async () => {
    const c = createClient(Process, transport({ "x-access-token": TOKEN, "keepalive-ping-interval": "1" }));
    const kinds: string[] = [];
    for await (const r of c.start({ process: { cmd: "/bin/sleep", args: ["2.3"] } })) kinds.push(r.event!.event.case!);
    expect(kinds[0]).toBe("start");
    expect(kinds.filter((k) => k === "keepalive").length).toBe(2);
    expect(kinds.at(-1)).toBe("end");
  }, 10_000);

  test("Connect-Timeout-Ms bounds the process lifetime", async () => {
    const it = gen(proc.start({ process: { cmd: "/bin/sleep", args: ["30"] } }, { timeoutMs: 500 }));
    const first = await it.next();
    const pid = (first.value.event.event.value as { pid: number }).pid;
    const code = await codeOf((async () => { for await (const _ of it); })());
    expect([Code.DeadlineExceeded, "ok"]).toContain(code);
    await waitFor("procState(pid) === undefined", () => procState(pid) === undefined, { timeoutMs: 3000 });
  });

  test("PTY: input, resize via Update, Ctrl-D ends the shell", async () => {
    const it = gen(proc.start({ process: { cmd: "/bin/bash", args: ["--norc", "-i"], envs: { PS1: "$ " } }, pty: { size: { cols: 50, rows: 7 } } }));
    const pid = ((await it.next()).value.event.event.value as { pid: number }).pid;
    let screen = "";
    const reading = (async () => {
      for await (const r of it) {
        const ev = r.event!.event;
        if (ev.case === "data" && ev.value.output.case === "pty") screen += dec.decode(ev.value.output.value);
        if (ev.case === "end") return ev.value;
      }
    })();
    const send = (s: string) => proc.sendInput({ process: { selector: { case: "pid", value: pid } }, input: { input: { case: "pty", value: new TextEncoder().encode(s) } } });
    await send("stty size\n");
    await waitFor("screen.includes(\"7 50\")", () => screen.includes("7 50"));
    await proc.update({ process: { selector: { case: "pid", value: pid } }, pty: { size: { cols: 91, rows: 33 } } });
    await send("stty size\n");
    await waitFor("screen.includes(\"33 91\")", () => screen.includes("33 91"));
    expect(await codeOf(proc.closeStdin({ process: { selector: { case: "pid", value: pid } } }))).toBe(Code.Unknown);
    expect(await codeOf(proc.sendInput({ process: { selector: { case: "pid", value: pid } }, input: {} }))).toBe(Code.Unimplemented);
    await send("\x04");
    const end = await reading;
    expect(end).toMatchObject({ exitCode: 0, exited: true });
  }, 15_000);

  test("StreamInput (client stream, binary envelopes) feeds stdin in order", async () => {
    const it = gen(proc.start({ process: { cmd: "/bin/sh", args: ["-c", "head -c 6"] }, stdin: true }));
    const pid = ((await it.next()).value.event.event.value as { pid: number }).pid;
    const msgs = [
      create(StreamInputRequestSchema, { event: { case: "start", value: { process: { selector: { case: "pid", value: pid } } } } }),
      create(StreamInputRequestSchema, { event: { case: "data", value: { input: { input: { case: "stdin", value: new TextEncoder().encode("abc") } } } } }),
      create(StreamInputRequestSchema, { event: { case: "data", value: { input: { input: { case: "stdin", value: new TextEncoder().encode("def") } } } } }),
    ];
    const frames = msgs.map((m) => {
      const b = toBinary(StreamInputRequestSchema, m);
      const f = new Uint8Array(5 + b.length);
      new DataView(f.buffer).setUint32(1, b.length);
      f.set(b, 5);
      return f;
    });
    const res = await fetch(`${envd.url}/process.Process/StreamInput`, {
      method: "POST",
      headers: { "content-type": "application/connect+proto", "connect-protocol-version": "1", "x-access-token": TOKEN },
      body: Buffer.concat(frames),
    });
    expect(res.status).toBe(200);
    // one empty StreamInputResponse envelope, then the end-of-stream envelope `{}` (no error)
    expect(Array.from(new Uint8Array(await res.arrayBuffer()))).toEqual([0, 0, 0, 0, 0, 2, 0, 0, 0, 2, 0x7b, 0x7d]);
    let out = "";
    for await (const r of it) if (r.event?.event.case === "data") out += dec.decode(r.event.event.value.output.value as Uint8Array);
    expect(out).toBe("abcdef");
  });

  test("no access token: HTTP 401 -> unauthenticated", async () => {
    const anon = createClient(Process, transport({}));
    expect(await codeOf(anon.list({}))).toBe(Code.Unauthenticated);
    const wrong = createClient(Filesystem, transport({ "x-access-token": "nope" }));
    expect(await codeOf(wrong.stat({ path: "/" }))).toBe(Code.Unauthenticated);
  });
});

describe("filesystem over binary Connect", () => {
  test("Stat, MakeDir, ListDir depth, Move, Remove and their error codes", async () => {
    writeFileSync(join(dir, "f.txt"), "12345");
    const st = await fsc.stat({ path: join(dir, "f.txt") });
    expect(st.entry).toMatchObject({ name: "f.txt", type: FileType.FILE, size: 5n, owner: "root", permissions: "-rw-r--r--" });
    expect(await codeOf(fsc.stat({ path: join(dir, "missing") }))).toBe(Code.NotFound);

    const md = await fsc.makeDir({ path: join(dir, "d1/d2") });
    expect(md.entry?.type).toBe(FileType.DIRECTORY);
    expect(await codeOf(fsc.makeDir({ path: join(dir, "d1/d2") }))).toBe(Code.AlreadyExists);
    expect(await codeOf(fsc.makeDir({ path: join(dir, "f.txt") }))).toBe(Code.InvalidArgument);

    const l1 = await fsc.listDir({ path: dir, depth: 1 });
    expect(l1.entries.map((e) => e.name).sort()).toEqual(["d1", "f.txt"]);
    const l0 = await fsc.listDir({ path: dir });
    expect(l0.entries.length).toBe(2);
    const l2 = await fsc.listDir({ path: dir, depth: 2 });
    expect(l2.entries.map((e) => e.path).sort()).toEqual([join(dir, "d1"), join(dir, "d1/d2"), join(dir, "f.txt")]);
    expect(await codeOf(fsc.listDir({ path: join(dir, "f.txt") }))).toBe(Code.InvalidArgument);
    expect(await codeOf(fsc.listDir({ path: join(dir, "zzz") }))).toBe(Code.NotFound);

    const mv = await fsc.move({ source: join(dir, "f.txt"), destination: join(dir, "d1/g.txt") });
    expect(mv.entry?.path).toBe(join(dir, "d1/g.txt"));
    expect(await codeOf(fsc.move({ source: join(dir, "f.txt"), destination: join(dir, "x") }))).toBe(Code.NotFound);

    await fsc.remove({ path: join(dir, "d1") });
    expect(await codeOf(fsc.stat({ path: join(dir, "d1") }))).toBe(Code.NotFound);
    // removing a missing path succeeds, as with E2B's envd (os.RemoveAll)
    expect(await codeOf(fsc.remove({ path: join(dir, "d1") }))).toBe("ok");
    // an empty path is the default workdir, else the user's home (E2B's ExpandAndResolve)
    expect((await fsc.stat({ path: "" })).entry?.path).toBe("/root");
  });

  test("WatchDir (recursive) and the polling watcher API", async () => {
    const w = join(dir, "w");
    await fsc.makeDir({ path: join(w, "sub") });
    const ac = new AbortController();
    const stream = gen(fsc.watchDir({ path: w, recursive: true, includeEntry: true }, { signal: ac.signal }));
    const first = await stream.next();
    expect(first.value.event.case).toBe("start");
    writeFileSync(join(w, "sub/n.txt"), "x");
    let got: { name: string; type: EventType; entryPath?: string } | undefined;
    for await (const r of stream) {
      if (r.event.case === "filesystem" && r.event.value.type === EventType.CREATE) {
        got = { name: r.event.value.name, type: r.event.value.type, entryPath: r.event.value.entry?.path };
        break;
      }
    }
    ac.abort();
    expect(got).toEqual({ name: "sub/n.txt", type: EventType.CREATE, entryPath: join(w, "sub/n.txt") });

    const { watcherId } = await fsc.createWatcher({ path: w });
    expect(watcherId).toMatch(/^w[0-9a-f]+$/);
    writeFileSync(join(w, "p.txt"), "1");
    renameSync(join(w, "p.txt"), join(w, "q.txt"));
    chmodSync(join(w, "q.txt"), 0o600);
    rmSync(join(w, "q.txt"));
    // each call hands over the events since the last one: collect until the last operation's
    const seen: [string, EventType][] = [];
    await waitFor("the watcher's REMOVE of q.txt", async () => {
      seen.push(...(await fsc.getWatcherEvents({ watcherId })).events.map((e): [string, EventType] => [e.name, e.type]));
      return seen.some(([n, t]) => n === "q.txt" && t === EventType.REMOVE);
    });
    // one write(2) may raise IN_MODIFY more than once (truncate + write): collapse repeats
    const evs = seen.filter((e, i, all) => i === 0 || JSON.stringify(e) !== JSON.stringify(all[i - 1]));
    expect(evs).toEqual([
      ["p.txt", EventType.CREATE],
      ["p.txt", EventType.WRITE],
      ["p.txt", EventType.RENAME],
      ["q.txt", EventType.CREATE],
      ["q.txt", EventType.CHMOD],
      ["q.txt", EventType.REMOVE],
    ]);
    expect((await fsc.getWatcherEvents({ watcherId })).events).toEqual([]);
    await fsc.removeWatcher({ watcherId });
    expect(await codeOf(fsc.getWatcherEvents({ watcherId }))).toBe(Code.NotFound);
    expect(await codeOf(fsc.createWatcher({ path: join(dir, "nowhere") }))).toBe(Code.NotFound);
  });
});

describe("plain HTTP routes", () => {
  test("/health, /envs, /metrics, /init auth and validation", async () => {
    expect((await fetch(`${envd.url}/health`)).status).toBe(204);
    expect((await fetch(`${envd.url}/envs`)).status).toBe(401);
    // re-init needs the current token; then env vars are replaced
    expect((await initEnvd(envd.url, { envVars: { A: "1" } })).status).toBe(401);
    expect((await initEnvd(envd.url, { envVars: { A: "1" }, defaultUser: "root" }, TOKEN)).status).toBe(204);
    const envs = await fetch(`${envd.url}/envs`, { headers: { "x-access-token": TOKEN } });
    expect(await envs.json()).toEqual({ A: "1" });
    const bad = await initEnvd(envd.url, { defaultUser: "no-such-user-xyz" }, TOKEN);
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { code: number }).code).toBe(400);
    expect((await initEnvd(envd.url, { envVars: "x" }, TOKEN)).status).toBe(400);
    const t0 = Math.floor(Date.now() / 1000);
    const m = (await (await fetch(`${envd.url}/metrics`, { headers: { "x-access-token": TOKEN } })).json()) as Record<string, number>;
    const t1 = Math.floor(Date.now() / 1000);
    expect(m.cpu_count).toBeGreaterThan(0);
    expect(m.mem_total).toBeGreaterThan(m.mem_used);
    expect(m.disk_total).toBeGreaterThan(0);
    expect(m.ts).toBeGreaterThanOrEqual(t0); // taken while the request ran (unix s)
    expect(m.ts).toBeLessThanOrEqual(t1);
    expect((await fetch(`${envd.url}/nope`, { headers: { "x-access-token": TOKEN } })).status).toBe(404);
  });

  test("/files: signatures, Range, gzip, octet-stream without path, bad multipart", async () => {
    const { fileSignature } = await import("../../src/envd/http/files.ts");
    writeFileSync(join(dir, "r.txt"), "0123456789");
    const path = join(dir, "r.txt");
    const q = (extra: string) => `${envd.url}/files?path=${encodeURIComponent(path)}${extra}`;
    expect((await fetch(q(""))).status).toBe(401);
    const sig = fileSignature(path, "read", "", TOKEN);
    const enc = encodeURIComponent;
    expect(await (await fetch(q(`&signature=${enc(sig)}`))).text()).toBe("0123456789");
    expect((await fetch(q(`&signature=${enc(fileSignature(path, "write", "", TOKEN))}`))).status).toBe(401);
    const past = Math.floor(Date.now() / 1000) - 10;
    expect((await fetch(q(`&signature=${enc(fileSignature(path, "read", "", TOKEN, past))}&signature_expiration=${past}`))).status).toBe(401);
    const future = Math.floor(Date.now() / 1000) + 60;
    expect((await fetch(q(`&signature=${enc(fileSignature(path, "read", "", TOKEN, future))}&signature_expiration=${future}`))).status).toBe(200);
    const auth = { "x-access-token": TOKEN };
    const part = await fetch(q(""), { headers: { ...auth, range: "bytes=2-4" } });
    expect(part.status).toBe(206);
    expect(part.headers.get("content-range")).toBe("bytes 2-4/10");
    expect(await part.text()).toBe("234");
    const gz = await fetch(q(""), { headers: { ...auth, "accept-encoding": "gzip" }, decompress: false } as RequestInit);
    expect(gz.headers.get("content-encoding")).toBe("gzip");
    expect(Buffer.from(Bun.gunzipSync(new Uint8Array(await gz.arrayBuffer()))).toString()).toBe("0123456789");
    const noPath = await fetch(`${envd.url}/files`, { method: "POST", headers: { ...auth, "content-type": "application/octet-stream" }, body: "x" });
    expect(noPath.status).toBe(400);
    const badMp = await fetch(`${envd.url}/files`, {
      method: "POST",
      headers: { ...auth, "content-type": "multipart/form-data; boundary=zz" },
      body: '--zz\r\nContent-Disposition: form-data; name="file"; filename="/tmp/x-envd-trunc"\r\n\r\nabc',
    });
    expect(badMp.status).toBe(400);
    const dup = await fetch(`${envd.url}/files`, {
      method: "POST",
      headers: { ...auth, "content-type": "multipart/form-data; boundary=zz" },
      body: `--zz\r\nContent-Disposition: form-data; name="file"; filename="${dir}/d.txt"\r\n\r\n1\r\n--zz\r\nContent-Disposition: form-data; name="file"; filename="${dir}/d.txt"\r\n\r\n2\r\n--zz--\r\n`,
    });
    expect(dup.status).toBe(400);
    rmSync("/tmp/x-envd-trunc", { force: true });
  });
});

/** POST /files of a streamed octet-stream body to `path`. */
function uploadStream(path: string, body: ReadableStream<Uint8Array>): Promise<Response> {
  return fetch(`${envd.url}/files?path=${encodeURIComponent(path)}`, {
    method: "POST",
    headers: { "x-access-token": TOKEN, "content-type": "application/octet-stream" },
    body,
    duplex: "half",
  } as RequestInit);
}

describe("uploads are streamed", () => {
  test("a 320 MiB streamed upload (above Bun's 128 MiB default) lands whole while envd's RSS stays bounded", async () => {
    const rss = async () => Number(/VmRSS:\s+(\d+)/.exec(await Bun.file(`/proc/${envd.proc.pid}/status`).text())![1]) * 1024;
    const size = 320 * 1024 * 1024;
    const before = await rss();
    let peak = before;
    let samples = 0;
    let sent = 0;
    // sampled as the upload moves (every 16 MiB sent), not on a timer: a fast host would take
    // too few samples for the bound to mean anything
    const body = new ReadableStream<Uint8Array>({
      async pull(c) {
        if (sent % (16 << 20) === 0) {
          peak = Math.max(peak, await rss());
          samples++;
        }
        if (sent >= size) return c.close();
        const n = Math.min(1 << 20, size - sent);
        c.enqueue(new Uint8Array(n).fill(sent / (1 << 20)));
        sent += n;
      },
    });
    const target = join(dir, "big.bin");
    const res = await uploadStream(target, body);
    peak = Math.max(peak, await rss());
    // the bound below means something only if the upload was watched while it ran
    expect(samples).toBe(21);
    expect(res.status).toBe(200);
    expect(require("node:fs").statSync(target).size).toBe(size);
    const fd = require("node:fs").openSync(target, "r");
    const probe = Buffer.alloc(1);
    require("node:fs").readSync(fd, probe, 0, 1, 300 * 1024 * 1024);
    require("node:fs").closeSync(fd);
    expect(probe[0]).toBe(300 & 0xff); // chunk k is filled with k mod 256
    // held whole it would add >= 320 MiB; streamed, growth is Bun's read-ahead and GC lag
    console.log(`envd RSS during a 320 MiB upload: ${(before / 1048576).toFixed(1)} MiB before, peak +${((peak - before) / 1048576).toFixed(1)} MiB (${samples} samples)`);
    expect(peak - before).toBeLessThan(48 * 1024 * 1024);
    rmSync(target);
  }, 60_000);

  test("48 MiB of random bytes land byte-exact: streamed octet-stream in odd-sized pieces, gzip, multipart", async () => {
    const { createHash, randomBytes } = require("node:crypto") as typeof import("node:crypto");
    const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
    const data = randomBytes(48 << 20);
    const want = sha(data);
    // pieces of 777,777 bytes: no piece boundary falls where Bun's body chunks end
    const pieces = () => {
      let off = 0;
      return new ReadableStream<Uint8Array>({
        pull(c) {
          if (off >= data.length) return c.close();
          const n = Math.min(777_777, data.length - off);
          c.enqueue(data.slice(off, off + n));
          off += n;
        },
      });
    };
    const target = join(dir, "exact.bin");
    for (let round = 0; round < 2; round++) {
      const res = await uploadStream(target, pieces());
      expect(res.status).toBe(200);
      expect(sha(readFileSync(target))).toBe(want);
      rmSync(target);
    }
    const gz = Bun.gzipSync(data);
    const gzRes = await fetch(`${envd.url}/files?path=${encodeURIComponent(target)}`, {
      method: "POST",
      headers: { "x-access-token": TOKEN, "content-type": "application/octet-stream", "content-encoding": "gzip" },
      body: gz,
    });
    expect(gzRes.status).toBe(200);
    expect(sha(readFileSync(target))).toBe(want);
    rmSync(target);
    const form = new FormData();
    form.append("file", new Blob([data]), "exact.bin");
    const mp = await fetch(`${envd.url}/files?path=${encodeURIComponent(target)}`, { method: "POST", headers: { "x-access-token": TOKEN }, body: form });
    expect(mp.status).toBe(200);
    expect(sha(readFileSync(target))).toBe(want);
    rmSync(target);
  }, 120_000);

  test("an upload into a FIFO read by a process of this envd completes: envd drains the reader's output while it writes", async () => {
    const fifo = join(dir, "upload.fifo");
    expect(Bun.spawnSync(["mkfifo", fifo]).exitCode).toBe(0);
    const size = 8 << 20;
    // cat's stdout is a pipe envd drains: a write into the FIFO that blocked envd's event loop
    // would stop that drain, cat would stop reading the FIFO, and neither would ever finish
    let got = 0;
    let exit: number | undefined;
    const reader = (async () => {
      for await (const r of proc.start({ process: { cmd: "/bin/cat", args: [fifo] }, stdin: false })) {
        const ev = r.event?.event;
        if (ev?.case === "data" && ev.value.output.case === "stdout") got += ev.value.output.value.byteLength;
        if (ev?.case === "end") exit = ev.value.exitCode;
      }
    })();
    const res = await fetch(`${envd.url}/files?path=${encodeURIComponent(fifo)}`, {
      method: "POST",
      headers: { "x-access-token": TOKEN, "content-type": "application/octet-stream" },
      body: new Uint8Array(size).fill(0x5a),
    });
    expect(res.status).toBe(200);
    await reader;
    expect(exit).toBe(0);
    expect(got).toBe(size);
    rmSync(fifo);
  }, 60_000);

  test("a slow 40 MiB upload (1 MiB every 125 ms) lands whole; envd's RSS stays flat while it trickles in", async () => {
    const rss = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${envd.proc.pid}/status`, "utf8"))![1]) * 1024;
    const size = 40 << 20;
    const before = rss();
    let peak = before;
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      async pull(c) {
        if (sent >= size) return c.close();
        if (sent > 0) await Bun.sleep(125);
        peak = Math.max(peak, rss());
        c.enqueue(new Uint8Array(1 << 20).fill((sent >> 20) & 0xff));
        sent += 1 << 20;
      },
    });
    const target = join(dir, "slow.bin");
    const res = await uploadStream(target, body);
    expect(res.status).toBe(200);
    const got = readFileSync(target);
    expect(got.length).toBe(size);
    for (let k = 0; k < 40; k++) expect([k, got[k << 20], got[((k + 1) << 20) - 1]]).toEqual([k, k, k]);
    console.log(`envd RSS during a slow 40 MiB upload: ${(before / 1048576).toFixed(1)} MiB before, peak +${((peak - before) / 1048576).toFixed(1)} MiB`);
    expect(peak - before).toBeLessThan(16 * 1024 * 1024);
    rmSync(target);
  }, 60_000);
});

describe("a full disk", () => {
  test("an upload that runs out of space is 507 (octet-stream and multipart), and envd keeps serving", async () => {
    const mnt = mkdtempSync("/tmp/envd-full-");
    const m = Bun.spawnSync(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], { stderr: "pipe" });
    expect(m.exitCode).toBe(0);
    try {
      const big = new Uint8Array(3 << 20).fill(7);
      const octet = await fetch(`${envd.url}/files?path=${encodeURIComponent(`${mnt}/a.bin`)}`, {
        method: "POST",
        headers: { "x-access-token": TOKEN, "content-type": "application/octet-stream" },
        body: big,
      });
      expect(octet.status).toBe(507);
      expect(await octet.json()).toEqual({ code: 507, message: expect.stringContaining(`${mnt}/a.bin`) });
      const form = new FormData();
      form.append("file", new Blob([big]), `${mnt}/b.bin`);
      const multi = await fetch(`${envd.url}/files`, { method: "POST", headers: { "x-access-token": TOKEN }, body: form });
      expect(multi.status).toBe(507);
      await multi.arrayBuffer();
      const ok = await fetch(`${envd.url}/files?path=${encodeURIComponent(join(dir, "after-full.txt"))}`, {
        method: "POST",
        headers: { "x-access-token": TOKEN, "content-type": "application/octet-stream" },
        body: "still here",
      });
      expect(ok.status).toBe(200);
      expect(readFileSync(join(dir, "after-full.txt"), "utf8")).toBe("still here");
    } finally {
      Bun.spawnSync(["umount", mnt]);
      rmSync(mnt, { recursive: true, force: true });
    }
  });
});

describe("/files/compose", () => {
  test("concatenates sources in order into the destination and deletes them", async () => {
    const auth = { "x-access-token": TOKEN, "content-type": "application/json" };
    const d = mkdtempSync("/tmp/envd-compose-");
    try {
      writeFileSync(join(d, "p1"), "alpha-");
      writeFileSync(join(d, "p2"), Buffer.alloc(200_000, 0x62));
      writeFileSync(join(d, "p3"), "-omega");
      const res = await fetch(`${envd.url}/files/compose`, {
        method: "POST",
        headers: auth,
        body: JSON.stringify({ source_paths: [join(d, "p1"), join(d, "p2"), join(d, "p3")], destination: join(d, "out/whole.bin") }),
      });
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ path: join(d, "out/whole.bin"), name: "whole.bin", type: "file" });
      const out = require("node:fs").readFileSync(join(d, "out/whole.bin"));
      expect(out.length).toBe(6 + 200_000 + 6);
      expect(out.subarray(0, 6).toString()).toBe("alpha-");
      expect(out.subarray(-6).toString()).toBe("-omega");
      expect(require("node:fs").existsSync(join(d, "p1"))).toBe(false);
      const missing = await fetch(`${envd.url}/files/compose`, { method: "POST", headers: auth, body: JSON.stringify({ source_paths: [join(d, "p1")], destination: join(d, "x") }) });
      expect(missing.status).toBe(404);
      const bad = await fetch(`${envd.url}/files/compose`, { method: "POST", headers: auth, body: JSON.stringify({ source_paths: [], destination: join(d, "x") }) });
      expect(bad.status).toBe(400);
      const noToken = await fetch(`${envd.url}/files/compose`, { method: "POST", body: "{}" });
      expect(noToken.status).toBe(401);
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });
});

describe("PTY start errors", () => {
  test("a missing program on a PTY is invalid_argument and leaks no fds", async () => {
    const fds = () => require("node:fs").readdirSync(`/proc/${envd.proc.pid}/fd`).length;
    // a warm-up PTY session, read to its end (its fds are closed by then)
    for await (const _ of proc.start({ process: { cmd: "/bin/true" }, pty: { size: { cols: 10, rows: 5 } } }));
    const before = fds();
    for (let i = 0; i < 5; i++) {
      expect(await codeOf(gen(proc.start({ process: { cmd: "/no/such/shell" }, pty: { size: { cols: 10, rows: 5 } } })).next())).toBe(Code.InvalidArgument);
    }
    // other streams of earlier tests may still be closing: wait for the count to settle
    await waitFor("fds() <= before", () => fds() <= before, { timeoutMs: 3000 });
  });

  test("finished PTY sessions, commands and watches release their fds", async () => {
    const fds = () => require("node:fs").readdirSync(`/proc/${envd.proc.pid}/fd`).length;
    const before = fds();
    for (let i = 0; i < 10; i++) {
      for await (const _ of proc.start({ process: { cmd: "/bin/echo", args: ["x"] }, pty: { size: { cols: 10, rows: 5 } } }));
      // stdin left open: the deadline (Connect-Timeout-Ms) kills it
      await codeOf((async () => { for await (const _ of proc.start({ process: { cmd: "/bin/cat" }, stdin: true }, { timeoutMs: 200 })); })());
      const ac = new AbortController();
      const w = gen(fsc.watchDir({ path: dir }, { signal: ac.signal }));
      await w.next();
      ac.abort();
      await codeOf(w.next());
    }
    await waitFor("fds() <= before + 2", () => fds() <= before + 2, { timeoutMs: 3000 });
  }, 30_000);
});
