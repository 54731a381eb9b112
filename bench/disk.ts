#!/usr/bin/env bun
/**
 * Disk path benchmark: reads through the FUSE export of the disk daemon (`agentenv ublk-daemon`,
 * started here by a DiskService) against reads of the backing file itself, measured with fio in
 * the same run, printed as ratios. Two exports of the same bytes: the raw file, and an overlaybd
 * stack (the raw file imported as one layer, plus an empty upper: a sandbox root disk).
 *
 * Two comparisons, each in the same run:
 *  1. The issue's: the backing file read buffered with its pages hot in the host page cache, by
 *     the fastest of fio's psync and io_uring engines (the best a VMM reading a local raw file
 *     could get), against O_DIRECT through the export (psync at QD1, libaio at QD > 1, as QEMU
 *     `cache=none,aio=native` reads). This sets the export's worst case (every read a round trip to
 *     the daemon) against the file's best (every read a page-cache copy): the two paths do not see
 *     the same cache.
 *  2. Same access path: both read buffered with the same engine (psync at QD1, io_uring at
 *     QD > 1), every block once per pass (a first touch, as a new sandbox reads its disk),
 *     the backing file hot in the page cache (as the daemon reads it), the export's own page cache
 *     dropped before each pass (so every read reaches the daemon; its READ count per pass is
 *     printed). This is what a VMM with `cache=writeback` (QEMU's default, what sandboxes use)
 *     gets from the export against the same VMM on the layer file itself.
 * Goals (issue 15): 4 KiB random QD16 >= 0.3x, 1 MiB sequential >= 0.6x of the backing file.
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

/** fio's read figures of one job: ios, bytes and its runtime (ms). */
function fioRun(file: string, args: string[]): { ios: number; bytes: number; ms: number } {
  // page-aligned buffers: fio's default (malloc's 16-byte alignment) makes every kernel copy into
  // them several times slower here (1 MiB pread from the page cache: 1.5 GB/s at +16 bytes, 7.8 GB/s
  // page-aligned), which would lower the baseline and not the O_DIRECT path (aligned by fio)
  const r = Bun.spawnSync(["fio", "--name=bench", `--filename=${file}`, "--readonly", "--invalidate=0", "--mem_align=4096", "--output-format=json", ...args], { stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`fio failed: ${r.stderr.toString()}`);
  const read = JSON.parse(r.stdout.toString()).jobs[0].read as { total_ios: number; io_bytes: number; runtime: number };
  return { ios: read.total_ios, bytes: read.io_bytes, ms: read.runtime };
}

/** One fio job reading `file` for SECONDS. */
function fio(file: string, args: string[]): Result {
  const r = fioRun(file, ["--time_based", `--runtime=${SECONDS}`, ...args]);
  return { iops: (r.ios / r.ms) * 1000, mbps: r.bytes / r.ms / 1000 };
}

/**
 * Passes of fio over the whole of `file` (every block read once per pass, in random order for a
 * random pattern) until SECONDS of fio runtime add up; `before` runs before each pass.
 */
function passes(file: string, args: string[], before: () => void): Result {
  let ios = 0, bytes = 0, ms = 0;
  while (ms < SECONDS * 1000) {
    before();
    const r = fioRun(file, args);
    ios += r.ios;
    bytes += r.bytes;
    ms += r.ms;
  }
  return { iops: (ios / ms) * 1000, mbps: bytes / ms / 1000 };
}

/** Drop the page cache of one file (POSIX_FADV_DONTNEED over all of it: GNU dd's nocache with count=0). */
function dropCache(file: string): void {
  const r = Bun.spawnSync(["dd", `if=${file}`, "iflag=nocache", "count=0", "status=none"], { stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`dropping the page cache of ${file} failed: ${r.stderr.toString()}`);
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
  const fmt = (v: number, unit: string) => `${unit === "mbps" ? v.toFixed(0) : (v / 1000).toFixed(1) + "k"} ${unit === "mbps" ? "MB/s" : "IOPS"}`;
  const line = (name: string, unit: "iops" | "mbps", b: number, r: number, s: number, goal?: number, extra = "") => {
    const g = goal ? `  (goal >= ${goal}x: raw ${r / b >= goal ? "met" : "MISSED"}, stack ${s / b >= goal ? "met" : "MISSED"})` : "";
    console.log(`${name.padEnd(28)} backing ${fmt(b, unit).padStart(12)} | raw ${fmt(r, unit).padStart(12)} ratio ${(r / b).toFixed(2)} | stack ${fmt(s, unit).padStart(12)} ratio ${(s / b).toFixed(2)}${g}${extra}`);
  };
  console.log("1. the issue's baseline: backing file buffered, page cache hot, best of psync/io_uring; export: O_DIRECT (every read a round trip to the daemon)");
  for (const c of cases) {
    const engine = c.qd === 1 ? ["--ioengine=psync"] : ["--ioengine=libaio", `--iodepth=${c.qd}`];
    const base = [fio(backing, [...c.args, "--ioengine=psync"]), fio(backing, [...c.args, "--ioengine=io_uring", `--iodepth=${c.qd}`])];
    const b = Math.max(...base.map((r) => r[c.unit]));
    const r = fio(raw.path, [...c.args, ...engine, "--direct=1"])[c.unit];
    const s = fio(stack.path, [...c.args, ...engine, "--direct=1"])[c.unit];
    line(c.name, c.unit, b, r, s, c.goal);
  }
  console.log("2. same access path: both buffered, same engine (psync QD1, io_uring QD>1), every block once per pass; backing hot, the export's own cache dropped before each pass");
  for (const c of cases) {
    // a pass reads every block once: no --norandommap, no time limit
    const args = [...c.args.filter((a) => a !== "--norandommap"), ...(c.qd === 1 ? ["--ioengine=psync"] : ["--ioengine=io_uring", `--iodepth=${c.qd}`])];
    const b = passes(backing, args, () => {})[c.unit];
    const st0 = await svc.stats("stack");
    let n = 0;
    const r = passes(raw.path, args, () => dropCache(raw.path))[c.unit];
    const s = passes(stack.path, args, () => (dropCache(stack.path), n++))[c.unit];
    const st1 = await svc.stats("stack");
    line(c.name, c.unit, b, r, s, c.goal, `  [stack: ${((st1.reads - st0.reads) / n).toFixed(0)} READs per pass of ${SIZE / (c.name.startsWith("4 KiB") ? 4096 : 1048576)} blocks]`);
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
  console.log(`stack device: ${st.reads} READs answered (${st.spliced_reads} by splice), ${(st.bytes_read / 1e9).toFixed(1)} GB; daemon pid ${svc.pid}; host load average ${loadavg()[0]!.toFixed(1)} at end`);
  await raw.close();
  await stack.close();
} finally {
  await svc.close();
  rmSync(dir, { recursive: true, force: true });
}
