/**
 * Large command output through a real envd child (Connect JSON, as the E2B SDK sends it):
 * 200 MiB read by a slow client arrives byte for byte, in events of at most 32 KiB, while envd's
 * RSS stays bounded; when the client stops reading, the command itself stops writing
 * (back-pressure reaches its pipe) and envd's memory does not grow.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { initEnvd, startEnvdChild, type EnvdChild } from "./harness.ts";

const TOKEN = "output-test-token";
const TOTAL = 200 * 1024 * 1024;
// seq's decimal lines: varied bytes whose exact stream the test computes locally
const CMD = `seq 1 40000000 | head -c ${TOTAL}`;
let envd: EnvdChild;

beforeAll(async () => {
  envd = await startEnvdChild();
  expect((await initEnvd(envd.url, { accessToken: TOKEN, defaultUser: "root" })).status).toBe(204);
}, 30_000);

afterAll(async () => {
  await envd?.stop();
});

function rssKiB(pid: number): number {
  return Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]);
}

/** Bytes a process has written so far (/proc/<pid>/io wchar). */
function written(pid: number): number {
  return Number(/wchar: (\d+)/.exec(readFileSync(`/proc/${pid}/io`, "utf8"))![1]);
}

/** Pids of `pid`'s direct children named `comm`. */
function childrenNamed(pid: number, comm: string): number[] {
  const out: number[] = [];
  for (const t of readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(/\s+/).filter(Boolean)) {
    try {
      if (readFileSync(`/proc/${t}/comm`, "utf8").trim() === comm) out.push(Number(t));
    } catch {
      /* gone */
    }
  }
  return out;
}

/** One Connect JSON envelope holding `msg`. */
function envelope(msg: unknown): Uint8Array {
  const b = Buffer.from(JSON.stringify(msg));
  const f = Buffer.alloc(5 + b.length);
  f.writeUInt32BE(b.length, 1);
  b.copy(f, 5);
  return f;
}

/** Incremental parser of a Connect envelope stream; calls `onMessage(flags, json)` per envelope. */
function envelopeParser(onMessage: (flags: number, msg: any) => void): (chunk: Uint8Array) => void {
  let pending: Buffer[] = [];
  let have = 0;
  return (chunk) => {
    pending.push(Buffer.from(chunk));
    have += chunk.byteLength;
    for (;;) {
      if (have < 5) return;
      let buf = pending.length === 1 ? pending[0]! : Buffer.concat(pending);
      pending = [buf];
      const len = buf.readUInt32BE(1);
      if (have < 5 + len) return;
      onMessage(buf[0]!, JSON.parse(buf.subarray(5, 5 + len).toString()));
      buf = buf.subarray(5 + len);
      pending = buf.length ? [buf] : [];
      have = buf.length;
    }
  };
}

describe("large output", () => {
  test("200 MiB to a slow client: byte-exact, events <= 32 KiB, back-pressure stops the writer, envd RSS bounded", async () => {
    const want = createHash("sha256");
    const local = Bun.spawn(["sh", "-c", CMD], { stdout: "pipe" });
    for await (const c of local.stdout) want.update(c);
    expect(await local.exited).toBe(0);

    const start = (cmd: string) =>
      fetch(`${envd.url}/process.Process/Start`, {
        method: "POST",
        headers: { "x-access-token": TOKEN, "content-type": "application/connect+json", "connect-protocol-version": "1" },
        body: envelope({ process: { cmd: "/bin/sh", args: ["-c", cmd] }, stdin: false }),
      });
    // warm-up: the first output through a fresh envd loads and compiles its code paths
    const warm = await start("head -c 16777216 /dev/zero");
    let warmBytes = 0;
    const warmParse = envelopeParser((flags, msg) => {
      if (!(flags & 2) && msg.event.data) warmBytes += Buffer.byteLength(msg.event.data.stdout, "base64");
    });
    for await (const c of warm.body!) warmParse(c);
    expect(warmBytes).toBe(16 << 20);

    const rss0 = rssKiB(envd.proc.pid);
    const res = await start(CMD);
    expect(res.status).toBe(200);
    const got = createHash("sha256");
    let bytes = 0;
    let maxEvent = 0;
    let dataEvents = 0;
    const kinds: string[] = [];
    let end: any;
    let endStream: any;
    const parse = envelopeParser((flags, msg) => {
      if (flags & 2) {
        endStream = msg;
        return;
      }
      const ev = msg.event;
      const kind = Object.keys(ev)[0]!;
      if (kinds.at(-1) !== kind) kinds.push(kind);
      if (kind === "data") {
        const b = Buffer.from(ev.data.stdout, "base64");
        got.update(b);
        bytes += b.length;
        maxEvent = Math.max(maxEvent, b.length);
        dataEvents++;
      }
      if (kind === "end") end = ev.end;
    });

    const reader = res.body!.getReader();
    let maxRss = rss0;
    let stalled: { written: number[]; after: number[]; rssBefore: number; rssAfter: number } | undefined;
    let nextPause = 8 << 20;
    for (;;) {
      const r = await reader.read();
      if (r.done) break;
      parse(r.value);
      maxRss = Math.max(maxRss, rssKiB(envd.proc.pid));
      if (!stalled && bytes >= 64 << 20) {
        // stop reading for a while: the command must stop writing and envd must not buffer
        const sh = childrenNamed(envd.proc.pid, "sh")[0]!;
        const writers = childrenNamed(sh, "head");
        expect(writers.length).toBe(1);
        await Bun.sleep(500);
        const w1 = writers.map(written);
        const rssBefore = rssKiB(envd.proc.pid);
        await Bun.sleep(1500);
        stalled = { written: w1, after: writers.map(written), rssBefore, rssAfter: rssKiB(envd.proc.pid) };
      } else if (bytes >= nextPause) {
        // a slow client: a pause every 8 MiB
        nextPause += 8 << 20;
        await Bun.sleep(50);
      }
    }
    expect(kinds).toEqual(["start", "data", "end"]);
    expect(end).toEqual({ exited: true, status: "exit status 0" });
    expect(endStream).toEqual({});
    expect(bytes).toBe(TOTAL);
    expect(got.digest("hex")).toBe(want.digest("hex"));
    expect(maxEvent).toBe(32 * 1024); // large reads were split at the protocol's 32 KiB
    expect(dataEvents).toBeGreaterThanOrEqual(TOTAL / (32 * 1024));
    // while the client did not read, the writer was blocked on its pipe and envd held still
    expect(stalled!.after).toEqual(stalled!.written);
    expect(stalled!.rssAfter - stalled!.rssBefore).toBeLessThan(4 * 1024);
    // 200 MiB went through; envd's resident memory rose by far less than one tenth of that
    console.log(`envd RSS ${(rss0 / 1024).toFixed(1)} MiB at start, peak ${(maxRss / 1024).toFixed(1)} MiB (+${((maxRss - rss0) / 1024).toFixed(1)}); stalled ${JSON.stringify(stalled)}`);
    expect(maxRss - rss0).toBeLessThan(24 * 1024);
  }, 180_000);
});

describe("settings file", () => {
  test("`envd --settings` takes the [envd] section from JSON (as the tools drive gives it): events follow its output_event_bytes", async () => {
    const dir = mkdtempSync("/tmp/envd-settings-");
    const file = join(dir, "envd.json");
    writeFileSync(file, JSON.stringify({ ...loadConfig({ env: {} }).envd, output_event_bytes: 1000 }));
    const child = await startEnvdChild(undefined, {}, ["--settings", file]);
    try {
      const res = await fetch(`${child.url}/process.Process/Start`, {
        method: "POST",
        headers: { "content-type": "application/connect+json" },
        body: envelope({ process: { cmd: "/usr/bin/head", args: ["-c", "100000", "/dev/zero"] }, stdin: false }),
      });
      const sizes: number[] = [];
      const parse = envelopeParser((flags, msg) => {
        if (!(flags & 2) && msg.event.data) sizes.push(Buffer.byteLength(msg.event.data.stdout, "base64"));
      });
      for await (const c of res.body!) parse(c);
      expect(sizes.reduce((a, b) => a + b, 0)).toBe(100_000);
      expect(Math.max(...sizes)).toBe(1000);
      // a file that is not a JSON object, or holds a key of the wrong type, stops envd naming it
      const refused = (text: string) => {
        writeFileSync(file, text);
        const bad = Bun.spawnSync(["bun", join(import.meta.dir, "../../src/cli/main.ts"), "envd", "--port", "0", "--settings", file], { stderr: "pipe" });
        expect(bad.exitCode).not.toBe(0);
        return bad.stderr.toString();
      };
      expect(refused("[1,2]")).toContain(`config: envd settings ${file}: envd = [1,2]: expected a table`);
      expect(refused('{"output_event_bytes": "big"}')).toContain(`config: envd settings ${file}: envd.output_event_bytes = "big": expected an integer in 1..65536 (bytes)`);
    } finally {
      await child.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
