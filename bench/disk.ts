#!/usr/bin/env bun
/**
 * Disk path benchmark: reads of a raw image through our FUSE export (a real `agentenv disk serve`
 * child) against reads of the same backing file directly, measured in the same run. Prints
 * throughput/IOPS and the ratio FUSE / plain file. Needs root (mount) and /dev/fuse.
 *   bun bench/disk.ts [--size-mib 256] [--seconds 2]
 */
import { closeSync, constants as fsc, mkdtempSync, openSync, readSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { diskConfig, exportDisk } from "../src/storage/daemon/index.ts";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const SIZE = arg("--size-mib", 256) * 1024 * 1024;
const SECONDS = arg("--seconds", 2);
const O_DIRECT = 0o40000;

/** Run `op` repeatedly for SECONDS; returns ops/s and bytes/s. */
function run(path: string, flags: number, blk: number, random: boolean): { iops: number; mbps: number } {
  const fd = openSync(path, flags);
  const buf = Buffer.alloc(blk);
  const blocks = SIZE / blk;
  let ops = 0;
  let off = 0;
  const end = performance.now() + SECONDS * 1000;
  try {
    while (performance.now() < end) {
      for (let k = 0; k < 16; k++) {
        const at = random ? Math.floor(Math.random() * blocks) * blk : off;
        readSync(fd, buf, 0, blk, at);
        off = (off + blk) % SIZE;
        ops++;
      }
    }
  } finally {
    closeSync(fd);
  }
  const secs = SECONDS;
  return { iops: ops / secs, mbps: (ops * blk) / secs / 1e6 };
}

const dir = mkdtempSync("/tmp/aenv-bench-disk-");
const backing = join(dir, "backing.raw");
const chunk = randomBytes(16 * 1024 * 1024);
const fd = openSync(backing, "w");
for (let at = 0; at < SIZE; at += chunk.length) writeFileSync(fd, chunk);
closeSync(fd);
const disk = await exportDisk({ id: "bench", image: { kind: "raw", path: backing, readOnly: false }, workDir: dir, recordDir: join(dir, "records"), config: diskConfig() });
try {
  // warm the backing file in the host page cache so the baseline is the page-cache read
  run(backing, fsc.O_RDONLY, 1 << 20, false);
  const rows: [string, number, number, boolean, "mbps" | "iops"][] = [
    ["1 MiB sequential, buffered", fsc.O_RDONLY, 1 << 20, false, "mbps"],
    ["4 KiB random QD1, buffered", fsc.O_RDONLY, 4096, true, "iops"],
  ];
  console.log(`image ${SIZE / 1048576} MiB, ${SECONDS} s per case, fuse_workers=${diskConfig().fuseWorkers}`);
  for (const [name, flags, blk, random, unit] of rows) {
    const base = run(backing, flags, blk, random);
    // FUSE O_DIRECT: every read is a round trip to our server (no FUSE page cache)
    const fuse = run(disk.path, flags | O_DIRECT, blk, random);
    const b = unit === "mbps" ? base.mbps : base.iops;
    const f = unit === "mbps" ? fuse.mbps : fuse.iops;
    console.log(`${name.padEnd(30)} plain ${b.toFixed(0).padStart(9)} ${unit}  fuse(O_DIRECT) ${f.toFixed(0).padStart(9)} ${unit}  ratio ${(f / b).toFixed(3)}`);
  }
} finally {
  await disk.close();
  rmSync(dir, { recursive: true, force: true });
}
