// Integration: real `agentenv disk serve` children serving raw files over a real FUSE mount
// (/dev/fuse + mount(2)), read and written by this process with ordinary syscalls and by
// util-linux `fallocate`/`truncate`. Needs root. Every test unmounts and kills what it starts.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, existsSync, fstatSync, fsyncSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, rmSync, statfsSync, statSync, writeFileSync, writeSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { join } from "node:path";
import { listMounts, MNT_DETACH, umount2 } from "../../../src/ffi/mount.ts";
import { mountFuse } from "../../../src/storage/fuse/server.ts";
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

  test("directory listing, statfs and unsupported ops behave like a one-file filesystem", async () => {
    const { d, workDir } = await serveRaw("dir", new Uint8Array(2 * MiB));
    const mnt = join(workDir, "mnt");
    expect(readdirSync(mnt)).toEqual(["root.img"]);
    const sf = statfsSync(mnt);
    expect(sf.bsize).toBe(4096);
    expect(sf.blocks).toBe((2 * MiB) / 4096);
    expect(statSync(mnt).isDirectory()).toBe(true);
    expect(errno(() => mkdirSync(join(mnt, "sub")))).toBeDefined();
    expect(errno(() => rmSync(d.path))).toBeDefined();
    expect(existsSync(d.path)).toBe(true);
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

  test("a read-only guest-RAM style export accepts read-write opens but refuses every write", async () => {
    const data = randomBytes(256 * 1024);
    const workDir = join(root, "mem");
    mkdirSync(workDir, { recursive: true });
    writeFileSync(join(workDir, "mem.raw"), data);
    const d = await exportDisk({
      id: "mem", image: { kind: "raw", path: join(workDir, "mem.raw"), readOnly: true, acceptWritableOpen: true }, workDir, recordDir,
      fileName: "mem.img", config: cfg,
    });
    open.push(d);
    const fd = openSync(d.path, "r+");
    try {
      const buf = Buffer.alloc(4096);
      expect(readSync(fd, buf, 0, 4096, 8192)).toBe(4096);
      expect(buf.equals(data.subarray(8192, 12288))).toBe(true);
      expect(errno(() => writeSync(fd, Buffer.alloc(4096, 1), 0, 4096, 0))).toBe("EROFS");
    } finally {
      closeSync(fd);
    }
    expect(readFileSync(join(workDir, "mem.raw")).equals(data)).toBe(true);
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

  test("the compiled single binary (bun build --compile) serves a disk too", async () => {
    const workDir = join(root, "compiled");
    mkdirSync(workDir, { recursive: true });
    const bin = join(workDir, "agentenv");
    const build = Bun.spawnSync([process.execPath, "build", "--compile", join(import.meta.dir, "../../../src/cli/main.ts"), "--outfile", bin]);
    expect(build.exitCode).toBe(0);
    const data = randomBytes(512 * 1024);
    writeFileSync(join(workDir, "b.raw"), data);
    const spec = {
      id: "compiled", image: { kind: "raw", path: join(workDir, "b.raw"), readOnly: false }, mountPoint: join(workDir, "mnt"),
      fileName: "d.img", recordDir, tuning: { workers: 2, maxWrite: 1 << 20, directIo: false, requestTimeoutSec: 0 },
    };
    writeFileSync(join(workDir, "spec.json"), JSON.stringify(spec));
    let fd = mountFuse(spec.mountPoint, 1 << 20);
    try {
      const child = Bun.spawn([bin, "disk", "serve", "--spec", join(workDir, "spec.json"), "--fuse-fd", "3"], { stdio: ["ignore", "pipe", "inherit", fd] });
      const first = await (child.stdout as ReadableStream<Uint8Array>).getReader().read();
      expect(new TextDecoder().decode(first.value)).toBe(`ready ${join(workDir, "mnt", "d.img")}\n`);
      expect(readFileSync(join(workDir, "mnt", "d.img")).equals(data)).toBe(true);
      umount2(spec.mountPoint, MNT_DETACH);
      closeSync(fd);
      fd = -1;
      expect(await child.exited).toBe(0);
    } finally {
      umount2(spec.mountPoint, MNT_DETACH);
      if (fd >= 0) closeSync(fd);
    }
  }, 120_000);

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

  test("kill -9 of the server: a replacement resumes the connection and I/O from another process never fails", async () => {
    const data = randomBytes(1 * MiB);
    const { d } = await serveRaw("k9", data);
    const firstPid = d.pid;
    // a separate reader process (as a VMM would be) re-reads and checks the file in a loop
    const script = `
      const fs = require("node:fs");
      const want = fs.readFileSync(process.argv[2]).length;
      let ok = 0, bad = 0;
      const end = Date.now() + Number(process.argv[3]);
      while (Date.now() < end) {
        const fd = fs.openSync(process.argv[1], "r");
        const b = Buffer.alloc(want);
        let n = 0;
        try { n = fs.readSync(fd, b, 0, want, 0); } catch (e) { bad++; }
        fs.closeSync(fd);
        if (n === want && b.equals(fs.readFileSync(process.argv[2]))) ok++; else bad++;
      }
      console.log(JSON.stringify({ ok, bad }));`;
    const backing = join(root, "k9", "backing.raw");
    const reader = Bun.spawn([process.execPath, "-e", script, d.path, backing, "2500"], { stdout: "pipe", stderr: "inherit" });
    await Bun.sleep(300);
    for (let k = 1; k <= 2; k++) {
      process.kill(d.pid, "SIGKILL");
      for (let i = 0; i < 100 && d.restarts < k; i++) await Bun.sleep(50);
      expect(d.restarts).toBe(k);
      await Bun.sleep(300);
    }
    expect(await reader.exited).toBe(0);
    const res = JSON.parse(await new Response(reader.stdout).text());
    expect(res.bad).toBe(0);
    expect(res.ok).toBeGreaterThan(10);
    expect(d.restarts).toBe(2);
    expect(d.pid).not.toBe(firstPid);
    expect(fuseMounted(join(root, "k9", "mnt"))).toBe(true);
    expect(JSON.parse(readFileSync(join(recordDir, "k9.json"), "utf8")).pid).toBe(d.pid);
  }, 60_000);

  test("with no restarts left, a dead server gives the disk up: exited resolves, mount detached", async () => {
    const workDir = join(root, "norestart");
    mkdirSync(workDir, { recursive: true });
    writeFileSync(join(workDir, "b.raw"), new Uint8Array(8192));
    const d = await exportDisk({
      id: "norestart", image: { kind: "raw", path: join(workDir, "b.raw"), readOnly: false }, workDir, recordDir,
      config: { ...cfg, maxRestarts: 0 },
    });
    open.push(d);
    process.kill(d.pid, "SIGKILL");
    expect(await d.exited).toBeNull();
    expect(d.restarts).toBe(0);
    expect(fuseMounted(join(workDir, "mnt"))).toBe(false);
    expect(existsSync(join(recordDir, "norestart.json"))).toBe(false);
  }, 60_000);

  test("reap after a node crash kills the orphaned serving children and detaches their mounts", async () => {
    // a stand-in node process exports two disks, then dies by SIGKILL
    const nodeScript = `
      const { exportDisk, diskConfig } = await import(${JSON.stringify(join(import.meta.dir, "../../../src/storage/daemon/index.ts"))});
      const [root, recordDir] = process.argv.slice(1);
      const fs = require("node:fs");
      const out = [];
      for (const id of ["crash-a", "crash-b"]) {
        const workDir = root + "/" + id;
        fs.mkdirSync(workDir, { recursive: true });
        fs.writeFileSync(workDir + "/b.raw", new Uint8Array(8192));
        const d = await exportDisk({ id, image: { kind: "raw", path: workDir + "/b.raw", readOnly: false }, workDir, recordDir, config: diskConfig() });
        out.push({ id, pid: d.pid, path: d.path });
      }
      console.log(JSON.stringify(out));
      await Bun.sleep(60000);`;
    const node = Bun.spawn([process.execPath, "-e", nodeScript, root, recordDir], { stdout: "pipe", stderr: "inherit" });
    const reader = (node.stdout as ReadableStream<Uint8Array>).getReader();
    let text = "";
    while (!text.includes("\n")) {
      const r = await reader.read();
      if (r.done) break;
      text += new TextDecoder().decode(r.value);
    }
    const disks = JSON.parse(text) as { id: string; pid: number; path: string }[];
    node.kill("SIGKILL");
    await node.exited;
    // the orphans keep serving: the mount is alive without the node
    for (const x of disks) expect(statSync(x.path).size).toBe(8192);
    const rep = await reapStaleDisks(recordDir, { mountRoots: [root] });
    expect(rep.killed.sort()).toEqual(disks.map((x) => x.pid).sort());
    expect(rep.unmounted.sort()).toEqual(disks.map((x) => join(root, x.id, "mnt")).sort());
    for (const x of disks) {
      expect(fuseMounted(join(root, x.id, "mnt"))).toBe(false);
      expect(() => process.kill(x.pid, 0)).toThrow();
    }
    // a second reap finds nothing
    expect(await reapStaleDisks(recordDir, { mountRoots: [root] })).toEqual({ killed: [], unmounted: [], records: 0 });
  }, 60_000);

  test("reap leaves a recycled pid alone and drops unreadable records", async () => {
    mkdirSync(recordDir, { recursive: true });
    // a record whose pid now belongs to another program (this test runner)
    writeFileSync(join(recordDir, "recycled.json"), JSON.stringify({ id: "recycled", pid: process.pid, mountPoint: join(root, "recycled", "mnt"), startedAt: 0 }));
    writeFileSync(join(recordDir, "garbage.json"), "{not json");
    const rep = await reapStaleDisks(recordDir, { mountRoots: [root] });
    expect(rep.killed).toEqual([]);
    expect(rep.records).toBe(2);
    expect(existsSync(join(recordDir, "recycled.json"))).toBe(false);
    expect(existsSync(join(recordDir, "garbage.json"))).toBe(false);
  }, 60_000);
});
