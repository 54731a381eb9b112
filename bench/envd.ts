#!/usr/bin/env bun
/**
 * envd benchmark: a real `agentenv envd` child on loopback against doing the same work directly
 * in this process, measured in the same run. Prints each figure and the ratio envd / direct.
 *   bun bench/envd.ts [--runs 50] [--size-mib 64]
 * - command: Connect Start of /bin/true (JSON, server stream to `end`) vs Bun.spawn(/bin/true)
 * - stdout: `head -c N /dev/zero` streamed through Start vs read from a direct spawn's pipe
 * - upload: POST /files octet-stream of N bytes vs Bun.write of the same bytes
 * - download: GET /files of N bytes vs Bun.file(...).arrayBuffer()
 */
import { mkdtempSync, rmSync } from "node:fs";
import { join } from "node:path";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const RUNS = arg("--runs", 50);
const SIZE = arg("--size-mib", 64) * 1024 * 1024;
const TOKEN = "bench-token";
const root = join(import.meta.dir, "..");

const child = Bun.spawn(["bun", join(root, "src/cli/main.ts"), "envd", "--port", "0", "--host", "127.0.0.1", "--no-clock-sync"], {
  stdout: "pipe",
  stderr: "inherit",
  env: { ...process.env, AENV_LOG_LEVEL: "warn" },
});
const tmp = mkdtempSync("/tmp/envd-bench-");
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
  const auth = { "x-access-token": TOKEN };

  const envelope = (msg: unknown) => {
    const b = Buffer.from(JSON.stringify(msg));
    const f = Buffer.alloc(5 + b.length);
    f.writeUInt32BE(b.length, 1);
    b.copy(f, 5);
    return f;
  };
  /** Run a command through Start; returns stdout bytes seen (counted from base64 lengths). */
  const start = async (cmd: string, args: string[]): Promise<number> => {
    const res = await fetch(`${base}/process.Process/Start`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/connect+json", "connect-protocol-version": "1" },
      body: envelope({ process: { cmd, args }, stdin: false }),
    });
    let buf = Buffer.alloc(0);
    let bytes = 0;
    for await (const chunk of res.body!) {
      buf = Buffer.concat([buf, chunk]);
      while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
        const len = buf.readUInt32BE(1);
        const msg = JSON.parse(buf.subarray(5, 5 + len).toString());
        const out = msg?.event?.event?.data?.stdout ?? msg?.event?.data?.stdout;
        if (out) bytes += Buffer.from(out, "base64").length;
        buf = buf.subarray(5 + len);
      }
    }
    return bytes;
  };
  const time = async (fn: () => Promise<unknown>) => {
    const t = performance.now();
    await fn();
    return performance.now() - t;
  };
  const median = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const row = (name: string, envd: number, direct: number, unit: string) =>
    console.log(`${name.padEnd(10)} envd ${envd.toFixed(2).padStart(9)} ${unit}   direct ${direct.toFixed(2).padStart(9)} ${unit}   ratio envd/direct ${(envd / direct).toFixed(2)}`);

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

  let got = 0;
  const tOut = await time(async () => (got = await start("/usr/bin/head", ["-c", String(SIZE), "/dev/zero"])));
  if (got !== SIZE) throw new Error(`stdout bytes ${got} != ${SIZE}`);
  const tOutDirect = await time(async () => {
    const p = Bun.spawn(["/usr/bin/head", "-c", String(SIZE), "/dev/zero"], { stdout: "pipe" });
    let n = 0;
    for await (const c of p.stdout) n += c.length;
    if (n !== SIZE) throw new Error("short read");
  });
  const mib = SIZE / 1048576;
  row("stdout", mib / (tOut / 1000), mib / (tOutDirect / 1000), "MiB/s");

  const data = new Uint8Array(SIZE).map((_, i) => i & 0xff);
  const up = join(tmp, "up.bin");
  const tUp = await time(() =>
    fetch(`${base}/files?path=${encodeURIComponent(up)}`, { method: "POST", headers: { ...auth, "content-type": "application/octet-stream" }, body: data }).then((r) => r.text()),
  );
  const tUpDirect = await time(() => Bun.write(join(tmp, "direct.bin"), data));
  row("upload", mib / (tUp / 1000), mib / (tUpDirect / 1000), "MiB/s");

  const tDown = await time(() => fetch(`${base}/files?path=${encodeURIComponent(up)}`, { headers: { ...auth, "accept-encoding": "identity" } }).then((r) => r.arrayBuffer()));
  const tDownDirect = await time(() => Bun.file(up).arrayBuffer());
  row("download", mib / (tDown / 1000), mib / (tDownDirect / 1000), "MiB/s");
  const envdRss = Number(/VmRSS:\s+(\d+)/.exec(await Bun.file(`/proc/${child.pid}/status`).text())![1]) / 1024;
  console.log(`envd RSS after the run: ${envdRss.toFixed(1)} MiB (upload of ${mib} MiB was streamed, not buffered)`);
} finally {
  child.kill("SIGTERM");
  await child.exited;
  rmSync(tmp, { recursive: true, force: true });
}
