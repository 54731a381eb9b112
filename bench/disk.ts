#!/usr/bin/env bun
/**
 * Disk path benchmark: reads through the FUSE export of the disk daemon (`agentenv ublk-daemon`,
 * started here by a DiskService) against reads of the backing file itself, measured with fio in
 * the same run, printed as ratios. Two exports of the same bytes: the raw file, and an overlaybd
 * stack (the raw file imported as one layer, plus an empty upper: a sandbox root disk).
 *
 * Baseline: the backing file read buffered with its pages hot in the host page cache, by the
 * fastest of fio's psync and io_uring engines (the best a VMM reading a local raw file could get).
 * Through FUSE: O_DIRECT (every read is a round trip to the daemon; no FUSE page cache), psync at
 * QD1 and libaio at QD > 1, as QEMU `cache=none,aio=native` would read.
 * Goals (issue 15): 4 KiB random QD16 >= 0.3x, 1 MiB sequential >= 0.6x of the baseline.
 * Last, the daemon's memory: its PSS before and after 8 more root disks are served and read.
 * Needs root, /dev/fuse and fio.
 *   bun bench/disk.ts [--size-mib 256] [--seconds 3] [--threads N]
 */
import { closeSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, writeSync } from "node:fs";
import { loadavg } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { diskConfig, DiskService } from "../src/storage/daemon/index.ts";
import { importRaw } from "../src/storage/overlaybd/index.ts";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const SIZE = arg("--size-mib", 256) * 1024 * 1024;
const SECONDS = arg("--seconds", 3);
const cfg = diskConfig();
const THREADS = arg("--threads", cfg.fuseThreads);

interface Result {
  iops: number;
  mbps: number;
}

/** One fio job reading `file` for SECONDS. */
function fio(file: string, args: string[]): Result {
  const r = Bun.spawnSync(["fio", "--name=bench", `--filename=${file}`, "--readonly", "--invalidate=0", "--time_based", `--runtime=${SECONDS}`, "--output-format=json", ...args], { stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`fio failed: ${r.stderr.toString()}`);
  const read = JSON.parse(r.stdout.toString()).jobs[0].read as { iops: number; bw_bytes: number };
  return { iops: read.iops, mbps: read.bw_bytes / 1e6 };
}

const which = Bun.spawnSync(["sh", "-c", "command -v fio"]);
if (which.exitCode !== 0) throw new Error("fio is not installed (scripts/install.sh installs it with the test packages)");

const dir = mkdtempSync("/tmp/aenv-bench-disk-");
const backing = join(dir, "backing.raw");
const chunk = randomBytes(16 * 1024 * 1024);
const fd = openSync(backing, "w");
for (let at = 0; at < SIZE; at += chunk.length) writeSync(fd, chunk, 0, Math.min(chunk.length, SIZE - at));
closeSync(fd);
await importRaw(backing, join(dir, "layer0"));
const load = loadavg()[0]!;
const svc = await DiskService.start({ dir: join(dir, "run"), config: { ...cfg, fuseThreads: THREADS } });
try {
  const raw = await svc.exportDisk({ id: "raw", target: { kind: "raw", path: backing, read_only: true } });
  const stack = await svc.rootDisk({ id: "stack", lowers: [join(dir, "layer0")], sandboxDir: join(dir, "sb") });
  // warm the backing file and the layer in the host page cache: the baseline is a page-cache read
  for (const f of [backing, join(dir, "layer0")]) fio(f, ["--rw=read", "--bs=1M", "--ioengine=psync", "--runtime=1"]);
  const cases: { name: string; unit: "iops" | "mbps"; args: string[]; qd: number; goal?: number }[] = [
    { name: "4 KiB random read QD1", unit: "iops", args: ["--rw=randread", "--bs=4k", "--norandommap"], qd: 1 },
    { name: "4 KiB random read QD16", unit: "iops", args: ["--rw=randread", "--bs=4k", "--norandommap"], qd: 16, goal: 0.3 },
    { name: "1 MiB sequential read QD1", unit: "mbps", args: ["--rw=read", "--bs=1M"], qd: 1, goal: 0.6 },
    { name: "1 MiB sequential read QD4", unit: "mbps", args: ["--rw=read", "--bs=1M"], qd: 4 },
  ];
  console.log(`image ${SIZE / 1048576} MiB, ${SECONDS} s per case, fuse_threads=${THREADS}, max_write=${cfg.fuseMaxWrite}; host load average ${load.toFixed(1)} at start`);
  console.log("baseline: backing file, page cache hot, best of psync/io_uring; FUSE: O_DIRECT through the daemon (raw file / overlaybd stack)");
  const fmt = (v: number, unit: string) => `${unit === "mbps" ? v.toFixed(0) : (v / 1000).toFixed(1) + "k"} ${unit === "mbps" ? "MB/s" : "IOPS"}`;
  for (const c of cases) {
    const engine = c.qd === 1 ? ["--ioengine=psync"] : ["--ioengine=libaio", `--iodepth=${c.qd}`];
    const base = [fio(backing, [...c.args, "--ioengine=psync"]), fio(backing, [...c.args, "--ioengine=io_uring", `--iodepth=${c.qd}`])];
    const b = Math.max(...base.map((r) => r[c.unit]));
    const r = fio(raw.path, [...c.args, ...engine, "--direct=1"])[c.unit];
    const s = fio(stack.path, [...c.args, ...engine, "--direct=1"])[c.unit];
    const goal = c.goal ? `  (goal >= ${c.goal}x: raw ${r / b >= c.goal ? "met" : "MISSED"}, stack ${s / b >= c.goal ? "met" : "MISSED"})` : "";
    console.log(`${c.name.padEnd(28)} backing ${fmt(b, c.unit).padStart(12)} | raw ${fmt(r, c.unit).padStart(12)} ratio ${(r / b).toFixed(2)} | stack ${fmt(s, c.unit).padStart(12)} ratio ${(s / b).toFixed(2)}${goal}`);
  }
  // memory: what each more served root disk adds to the daemon (PSS, after reading from it)
  const pss = () => Number(/^Pss:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${svc.pid}/smaps_rollup`, "utf8"))?.[1] ?? NaN);
  const readSome = (path: string) => {
    const f = openSync(path, "r");
    try {
      const b = Buffer.alloc(1 << 20);
      for (let i = 0; i < 8; i++) readSync(f, b, 0, b.length, i * 16 * b.length);
    } finally {
      closeSync(f);
    }
  };
  const MORE = 8;
  const pssBefore = pss();
  const more = [];
  for (let i = 0; i < MORE; i++) {
    const d = await svc.rootDisk({ id: `mem${i}`, lowers: [join(dir, "layer0")], sandboxDir: join(dir, `m${i}`) });
    readSome(d.path);
    more.push(d);
  }
  const pssAfter = pss();
  for (const d of more) await d.close();
  console.log(`disk daemon memory: ${(pssBefore / 1024).toFixed(1)} MiB PSS serving 2 disks (warm pool filled), ${(pssAfter / 1024).toFixed(1)} MiB with ${MORE} more root disks read: ${((pssAfter - pssBefore) / 1024 / MORE).toFixed(2)} MiB per disk`);
  const st = await svc.stats("stack");
  console.log(`stack device: ${st.reads} READs answered, ${(st.bytes_read / 1e9).toFixed(1)} GB; daemon pid ${svc.pid}; host load average ${loadavg()[0]!.toFixed(1)} at end`);
  await raw.close();
  await stack.close();
} finally {
  await svc.close();
  rmSync(dir, { recursive: true, force: true });
}
