#!/usr/bin/env bun
/**
 * envd benchmark: a real `agentenv envd` child on loopback against doing the same work directly
 * in this process, measured in the same run (envd and direct runs interleaved, medians). Prints
 * each figure and the ratio envd / direct.
 *   bun bench/envd.ts [--runs 50] [--size-mib 64] [--reps 5]
 * - command: Connect Start of /bin/true (JSON, server stream to `end`) vs Bun.spawn(/bin/true)
 * - stdout: `head -c N /dev/zero` streamed through Start and decoded as the SDK does (Connect
 *   JSON envelopes, base64), and as binary protobuf, vs reading a direct spawn's pipe
 * - upload: POST /files octet-stream of N bytes vs Bun.write of the same bytes
 * - download: GET /files of N bytes vs Bun.file(...).arrayBuffer(); and both streamed (counted as
 *   they arrive) vs Bun.file(...).stream(); and streamed vs the same file from a bare Bun.serve
 *   child (the loopback HTTP transport's own ceiling for this client)
 * - envd RSS: idle, after a warm-up, and the peak while the stdout runs streamed
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { loadavg } from "node:os";
import { join } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import { StartRequestSchema } from "../src/envd/gen/process_pb.ts";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const RUNS = arg("--runs", 50);
const SIZE = arg("--size-mib", 64) * 1024 * 1024;
const REPS = arg("--reps", 5);
const TOKEN = "bench-token";
const root = join(import.meta.dir, "..");

const load = loadavg()[0]!;
const child = Bun.spawn(["bun", join(root, "src/cli/main.ts"), "envd", "--port", "0", "--host", "127.0.0.1", "--no-clock-sync"], {
  stdout: "pipe",
  stderr: "inherit",
  env: { ...process.env, AENV_LOG_LEVEL: "warn" },
});
const tmp = mkdtempSync("/tmp/envd-bench-");
const rssMiB = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${child.pid}/status`, "utf8"))![1]) / 1024;
try {
  const reader = child.stdout.getReader();
  let text = "";
  while (!/listening on (\d+)/.test(text)) {
    const r = await reader.read();
    if (r.done) throw new Error(`envd exited: ${text}`);
    text += new TextDecoder().decode(r.value);
  }
  const base = `http://127.0.0.1:${/listening on (\d+)/.exec(text)![1]}`;
  await fetch(`${base}/init`, { method: "POST", body: JSON.stringify({ accessToken: TOKEN, defaultUser: "root" }) });
  const rssIdle = rssMiB();
  const auth = { "x-access-token": TOKEN };

  const envelope = (b: Uint8Array) => {
    const f = Buffer.alloc(5 + b.length);
    f.writeUInt32BE(b.length, 1);
    f.set(b, 5);
    return f;
  };
  /** Protobuf StartResponse -> payload length of its data event (0 for other events). */
  const protoDataLength = (m: Buffer): number => {
    // StartResponse.event (0x0a, len) > ProcessEvent.data (0x12, len) > DataEvent.stdout (0x0a, len)
    const varint = (off: number): [number, number] => {
      let v = 0;
      let mul = 1;
      for (;;) {
        const b = m[off++]!;
        v += (b & 0x7f) * mul;
        if (b < 0x80) return [v, off];
        mul *= 128;
      }
    };
    if (m[0] !== 0x0a) return 0;
    let off = varint(1)[1];
    if (m[off] !== 0x12) return 0;
    off = varint(off + 1)[1];
    if (m[off] !== 0x0a) return 0;
    return varint(off + 1)[0];
  };
  /** Run a command through Start; returns stdout bytes seen, decoded as a client would. */
  const start = async (cmd: string, args: string[], binary = false, onChunk?: () => void): Promise<number> => {
    const req = { process: { cmd, args }, stdin: false };
    const res = await fetch(`${base}/process.Process/Start`, {
      method: "POST",
      headers: { ...auth, "content-type": binary ? "application/connect+proto" : "application/connect+json", "connect-protocol-version": "1" },
      body: envelope(binary ? toBinary(StartRequestSchema, create(StartRequestSchema, req)) : Buffer.from(JSON.stringify(req))),
    });
    let pending: Buffer = Buffer.alloc(0);
    let bytes = 0;
    for await (const chunk of res.body!) {
      onChunk?.();
      pending = pending.length ? Buffer.concat([pending, chunk]) : Buffer.from(chunk);
      let off = 0;
      while (pending.length - off >= 5) {
        const len = pending.readUInt32BE(off + 1);
        if (pending.length - off < 5 + len) break;
        const msg = pending.subarray(off + 5, off + 5 + len);
        if (pending[off] === 0) {
          if (binary) bytes += protoDataLength(msg);
          else {
            const ev = JSON.parse(msg.toString()).event;
            if (ev.data?.stdout) bytes += Buffer.from(ev.data.stdout, "base64").length;
          }
        }
        off += 5 + len;
      }
      pending = pending.subarray(off);
    }
    return bytes;
  };
  const time = async (fn: () => Promise<unknown>) => {
    const t = performance.now();
    await fn();
    return performance.now() - t;
  };
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const row = (name: string, envd: number, direct: number, unit: string) =>
    console.log(`${name.padEnd(19)} envd ${envd.toFixed(2).padStart(9)} ${unit}   direct ${direct.toFixed(2).padStart(9)} ${unit}   ratio envd/direct ${(envd / direct).toFixed(2)}`);
  const mib = SIZE / 1048576;
  /** Median throughput (MiB/s) of `envdFn` and `directFn`, runs interleaved. */
  const pair = async (envdFn: () => Promise<unknown>, directFn: () => Promise<unknown>) => {
    const e: number[] = [];
    const d: number[] = [];
    for (let i = 0; i < REPS; i++) {
      e.push(mib / ((await time(envdFn)) / 1000));
      d.push(mib / ((await time(directFn)) / 1000));
    }
    return [median(e), median(d)] as const;
  };

  // warm-up
  for (let i = 0; i < 5; i++) {
    await start("/bin/true", []);
    await Bun.spawn(["/bin/true"]).exited;
  }
  const viaEnvd: number[] = [];
  const direct: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    viaEnvd.push(await time(() => start("/bin/true", [])));
    direct.push(await time(() => Bun.spawn(["/bin/true"]).exited));
  }
  row("command", median(viaEnvd), median(direct), "ms (median)");

  const pipe = async () => {
    const p = Bun.spawn(["/usr/bin/head", "-c", String(SIZE), "/dev/zero"], { stdout: "pipe" });
    let n = 0;
    for await (const c of p.stdout) n += c.length;
    if (n !== SIZE) throw new Error("short read");
  };
  const head = ["-c", String(SIZE), "/dev/zero"];
  const checked = (binary: boolean) => async () => {
    const got = await start("/usr/bin/head", head, binary);
    if (got !== SIZE) throw new Error(`stdout bytes ${got} != ${SIZE}`);
  };
  // warm-up of the output path, then RSS while it runs
  await checked(false)();
  const rssWarm = rssMiB();
  let rssPeak = rssWarm;
  const [outJson, outDirect] = await pair(async () => {
    const got = await start("/usr/bin/head", head, false, () => (rssPeak = Math.max(rssPeak, rssMiB())));
    if (got !== SIZE) throw new Error(`stdout bytes ${got} != ${SIZE}`);
  }, pipe);
  row("stdout (JSON)", outJson, outDirect, "MiB/s");
  const [outProto, outDirect2] = await pair(checked(true), pipe);
  row("stdout (proto)", outProto, outDirect2, "MiB/s");

  const data = new Uint8Array(SIZE).map((_, i) => i & 0xff);
  const up = join(tmp, "up.bin");
  const [upE, upD] = await pair(
    () =>
      fetch(`${base}/files?path=${encodeURIComponent(up)}`, { method: "POST", headers: { ...auth, "content-type": "application/octet-stream" }, body: data }).then((r) => {
        if (r.status !== 200) throw new Error(`upload ${r.status}`);
        return r.text();
      }),
    () => Bun.write(join(tmp, "direct.bin"), data),
  );
  row("upload", upE, upD, "MiB/s");

  const [downE, downD] = await pair(
    () =>
      fetch(`${base}/files?path=${encodeURIComponent(up)}`, { headers: { ...auth, "accept-encoding": "identity" } })
        .then((r) => r.arrayBuffer())
        .then((b) => {
          if (b.byteLength !== SIZE) throw new Error(`download ${b.byteLength}`);
        }),
    () => Bun.file(up).arrayBuffer(),
  );
  row("download", downE, downD, "MiB/s");
  // the same, both sides streamed (bytes counted as they arrive, nothing collected)
  const count = async (s: ReadableStream<Uint8Array>) => {
    let n = 0;
    for await (const c of s) n += c.length;
    if (n !== SIZE) throw new Error(`read ${n}`);
  };
  const [downSE, downSD] = await pair(
    async () => count((await fetch(`${base}/files?path=${encodeURIComponent(up)}`, { headers: { ...auth, "accept-encoding": "identity" } })).body!),
    () => count(Bun.file(up).stream()),
  );
  row("download (streamed)", downSE, downSD, "MiB/s");
  // transport baseline: the same file from a bare Bun.serve child (Response(Bun.file), as envd
  // answers), so the ratio shows what envd adds to loopback HTTP and this client's receive
  const plain = Bun.spawn(["bun", "-e", `const s = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(Bun.file(${JSON.stringify(up)})) }); console.log("port " + s.port);`], { stdout: "pipe" });
  try {
    const pr = plain.stdout.getReader();
    let ptext = "";
    while (!/port (\d+)\n/.test(ptext)) {
      const r = await pr.read();
      if (r.done) throw new Error(`plain server exited: ${ptext}`);
      ptext += new TextDecoder().decode(r.value);
    }
    const plainUrl = `http://127.0.0.1:${/port (\d+)/.exec(ptext)![1]}/`;
    const [downPE, downPP] = await pair(
      async () => count((await fetch(`${base}/files?path=${encodeURIComponent(up)}`, { headers: { ...auth, "accept-encoding": "identity" } })).body!),
      async () => count((await fetch(plainUrl)).body!),
    );
    console.log(`${"download vs HTTP".padEnd(19)} envd ${downPE.toFixed(2).padStart(9)} MiB/s   bare Bun.serve ${downPP.toFixed(2).padStart(9)} MiB/s   ratio envd/bare ${(downPE / downPP).toFixed(2)}`);
  } finally {
    plain.kill();
    await plain.exited;
  }
  console.log(
    `envd RSS: idle ${rssIdle.toFixed(1)} MiB, after warm-up ${rssWarm.toFixed(1)} MiB, peak during ${REPS}x${mib} MiB stdout ${rssPeak.toFixed(1)} MiB (+${(rssPeak - rssWarm).toFixed(1)}), after all ${rssMiB().toFixed(1)} MiB`,
  );
  console.log(`${REPS} interleaved repetitions each (medians), ${mib} MiB; host load average ${load.toFixed(2)} at start`);
} finally {
  child.kill("SIGTERM");
  await child.exited;
  rmSync(tmp, { recursive: true, force: true });
}
