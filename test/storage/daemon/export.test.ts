// Integration: real `agentenv disk serve` children serving raw files over a real FUSE mount
// (/dev/fuse + mount(2)), read and written by this process with ordinary syscalls and by
// util-linux `fallocate`/`truncate`. Needs root. Every test unmounts and kills what it starts.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, existsSync, fstatSync, fsyncSync, mkdirSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, statSync, writeFileSync, writeSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { join } from "node:path";
import { listMounts } from "../../../src/ffi/mount.ts";
import { diskConfig, exportDisk, reapStaleDisks, type DiskConfig, type ExportedDisk } from "../../../src/storage/daemon/index.ts";

const MiB = 1 << 20;
let root: string;
let recordDir: string;
let cfg: DiskConfig;
const open: ExportedDisk[] = [];

beforeAll(() => {
  root = mkdtempSync("/tmp/aenv-disk-test-");
  recordDir = join(root, "records");
  cfg = { ...diskConfig(), readyTimeoutMs: 15000 };
});
afterEach(async () => {
  for (const d of open.splice(0)) await d.close();
});
afterAll(async () => {
  await reapStaleDisks(recordDir, { mountRoots: [root] });
  rmSync(root, { recursive: true, force: true });
});

function fuseMounted(mp: string): boolean {
  return listMounts().some((m) => m.mountPoint === mp && m.fstype === "fuse.aenvdisk");
}

async function serveRaw(id: string, data: Uint8Array, readOnly = false): Promise<{ d: ExportedDisk; backing: string; workDir: string }> {
  const workDir = join(root, id);
  mkdirSync(workDir, { recursive: true });
  const backing = join(workDir, "backing.raw");
  writeFileSync(backing, data);
  const d = await exportDisk({ id, image: { kind: "raw", path: backing, readOnly }, workDir, recordDir, fileName: "root.img", config: cfg });
  open.push(d);
  return { d, backing, workDir };
}

function errno(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    return (e as NodeJS.ErrnoException).code;
  }
  return undefined;
}

const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

describe("FUSE disk export", () => {
  test("reads are byte-exact, whole file and at unaligned offsets; size and mode reported", async () => {
    const data = randomBytes(4 * MiB);
    const { d, workDir } = await serveRaw("rd", data);
    expect(d.path).toBe(join(workDir, "mnt", "root.img"));
    const st = statSync(d.path);
    expect(st.size).toBe(4 * MiB);
    expect(st.isFile()).toBe(true);
    expect(st.mode & 0o777).toBe(0o644);
    expect(sha(readFileSync(d.path))).toBe(sha(data));
    const fd = openSync(d.path, "r");
    try {
      const buf = Buffer.alloc(10000);
      expect(readSync(fd, buf, 0, 10000, 12345)).toBe(10000);
      expect(buf.equals(data.subarray(12345, 22345))).toBe(true);
      // read straddling the end is short, read past the end returns 0
      expect(readSync(fd, buf, 0, 10000, 4 * MiB - 100)).toBe(100);
      expect(buf.subarray(0, 100).equals(data.subarray(4 * MiB - 100))).toBe(true);
      expect(readSync(fd, buf, 0, 10000, 4 * MiB + 5)).toBe(0);
    } finally {
      closeSync(fd);
    }
    expect(fuseMounted(join(workDir, "mnt"))).toBe(true);
  }, 60_000);

  test("writes land in the backing file byte-exactly; fsync succeeds", async () => {
    const data = new Uint8Array(2 * MiB);
    const { d, backing } = await serveRaw("wr", data);
    const patch = randomBytes(300_000);
    const fd = openSync(d.path, "r+");
    try {
      expect(writeSync(fd, patch, 0, patch.length, 777)).toBe(patch.length);
      expect(writeSync(fd, Buffer.from("tail"), 0, 4, 2 * MiB - 4)).toBe(4);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    const b = readFileSync(backing);
    expect(b.length).toBe(2 * MiB); // never grows
    expect(b.subarray(777, 777 + patch.length).equals(patch)).toBe(true);
    expect(b.subarray(0, 777).every((x) => x === 0)).toBe(true);
    expect(b.subarray(2 * MiB - 4).toString()).toBe("tail");
    // read back through the mount too (no stale page cache)
    expect(readFileSync(d.path).subarray(777, 777 + patch.length).equals(patch)).toBe(true);
  }, 60_000);

  test("punch-hole fallocate discards: the range reads back as zeros", async () => {
    const data = new Uint8Array(1 * MiB).fill(0xab);
    const { d, backing } = await serveRaw("discard", data);
    const r = Bun.spawnSync(["fallocate", "--punch-hole", "--offset", "4096", "--length", "8192", d.path]);
    expect(r.exitCode).toBe(0);
    const b = readFileSync(backing);
    expect(b.subarray(4096, 12288).every((x) => x === 0)).toBe(true);
    expect(b[4095]).toBe(0xab);
    expect(b[12288]).toBe(0xab);
    expect(readFileSync(d.path).subarray(4096, 12288).every((x) => x === 0)).toBe(true);
    // plain preallocation that would grow the file is refused
    const grow = Bun.spawnSync(["fallocate", "--offset", String(1 * MiB), "--length", "4096", d.path]);
    expect(grow.exitCode).not.toBe(0);
    expect(statSync(backing).size).toBe(1 * MiB);
  }, 60_000);

  test("bad input: write past the end, truncate, create, missing name, read-only writes", async () => {
    const { d, workDir } = await serveRaw("bad", new Uint8Array(64 * 1024));
    const fd = openSync(d.path, "r+");
    try {
      expect(errno(() => writeSync(fd, Buffer.alloc(4096), 0, 4096, 64 * 1024))).toBe("ENOSPC");
      // a write straddling the end is cut at the end (short write), the file never grows
      expect(writeSync(fd, Buffer.alloc(4096, 1), 0, 4096, 62 * 1024)).toBe(2048);
      expect(fstatSync(fd).size).toBe(64 * 1024);
    } finally {
      closeSync(fd);
    }
    const tr = Bun.spawnSync(["truncate", "-s", "0", d.path]);
    expect(tr.exitCode).not.toBe(0);
    expect(tr.stderr.toString()).toContain("Operation not permitted");
    expect(statSync(d.path).size).toBe(64 * 1024);
    expect(errno(() => writeFileSync(join(workDir, "mnt", "new.img"), "x"))).toBeDefined();
    expect(errno(() => statSync(join(workDir, "mnt", "nope.img")))).toBe("ENOENT");

    const ro = await serveRaw("ro", randomBytes(64 * 1024), true);
    expect(statSync(ro.d.path).mode & 0o777).toBe(0o444);
    expect(errno(() => openSync(ro.d.path, "r+"))).toBe("EROFS");
    expect(readFileSync(ro.d.path).equals(readFileSync(ro.backing))).toBe(true);
  }, 60_000);

  test("close unmounts, removes the record and the child exits 0", async () => {
    const { d, workDir } = await serveRaw("cl", new Uint8Array(8192));
    expect(existsSync(join(recordDir, "cl.json"))).toBe(true);
    open.pop();
    await d.close();
    expect(await d.exited).toBe(0);
    expect(fuseMounted(join(workDir, "mnt"))).toBe(false);
    expect(existsSync(d.path)).toBe(false);
    expect(existsSync(join(recordDir, "cl.json"))).toBe(false);
    await d.close(); // idempotent
  }, 60_000);

  test("a spec naming a missing backing file fails with the child's error", async () => {
    const workDir = join(root, "missing");
    let err: any;
    try {
      await exportDisk({ id: "missing", image: { kind: "raw", path: join(workDir, "nope.raw"), readOnly: false }, workDir, recordDir, config: cfg });
    } catch (e) {
      err = e;
    }
    expect(err?.code).toBe("disk.serve_failed");
    expect(err.details.stderr).toContain("disk.open_failed");
    expect(err.details.exitCode).toBe(1);
    expect(fuseMounted(join(workDir, "mnt"))).toBe(false);
    expect(existsSync(join(recordDir, "missing.json"))).toBe(false);
  }, 60_000);

  test("kill -9 of the server: I/O fails with ENOTCONN, reap detaches the mount and drops the record", async () => {
    const { d, workDir } = await serveRaw("k9", randomBytes(64 * 1024));
    expect(readFileSync(d.path).length).toBe(64 * 1024);
    process.kill(d.pid, "SIGKILL");
    expect(await d.exited).toBeNull();
    expect(errno(() => statSync(d.path))).toBe("ENOTCONN");
    expect(fuseMounted(join(workDir, "mnt"))).toBe(true);
    const rep = await reapStaleDisks(recordDir, { mountRoots: [root] });
    expect(rep.killed).toEqual([]); // already dead
    expect(rep.unmounted).toContain(join(workDir, "mnt"));
    expect(fuseMounted(join(workDir, "mnt"))).toBe(false);
    expect(existsSync(join(recordDir, "k9.json"))).toBe(false);
  }, 60_000);

  test("reap after a node crash kills live serving children and unmounts their disks", async () => {
    const a = await serveRaw("crash-a", new Uint8Array(8192));
    const b = await serveRaw("crash-b", new Uint8Array(8192));
    open.splice(0); // the "crashed node" forgets them
    const rep = await reapStaleDisks(recordDir, { mountRoots: [root] });
    expect(rep.killed.sort()).toEqual([a.d.pid, b.d.pid].sort());
    expect(rep.unmounted.sort()).toEqual([join(a.workDir, "mnt"), join(b.workDir, "mnt")].sort());
    expect(await a.d.exited).toBeNull();
    expect(await b.d.exited).toBeNull();
    expect(fuseMounted(join(a.workDir, "mnt"))).toBe(false);
    // a second reap finds nothing
    expect(await reapStaleDisks(recordDir, { mountRoots: [root] })).toEqual({ killed: [], unmounted: [], records: 0 });
  }, 60_000);
});
