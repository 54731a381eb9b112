// Integration: the disk daemon (`agentenv ublk-daemon`, started by a DiskService) serving raw
// files over real FUSE mounts (/dev/fuse + mount(2)), read and written by this process with
// ordinary syscalls and by util-linux `fallocate`/`truncate`, and surviving kill -9. Needs root.
// One daemon for the file; tests that kill or crash daemons start their own and stop them.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, existsSync, fstatSync, fsyncSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, rmSync, statfsSync, statSync, unlinkSync, writeFileSync, writeSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { join } from "node:path";
import { DaemonClient } from "../../../src/storage/daemon/client.ts";
import { daemonSettings, diskConfig, DiskService, type DiskExport } from "../../../src/storage/daemon/index.ts";
import { compileEntrypoints } from "../../../src/bundle.ts";
import { alive, exited, firstLine } from "../../helpers/proc.ts";
import { fuseMounted, startService, stopService } from "./fixtures/service.ts";
import { listMounts } from "../../../src/ffi/mount.ts";
import { waitFor } from "../../helpers/wait.ts";
import { errorCode } from "../../../src/util/error.ts";

const MiB = 1 << 20;
let root: string;
let svc: DiskService;

beforeAll(async () => {
  root = mkdtempSync("/tmp/aenv-disk-test-");
  svc = await startService(root);
}, 60_000);
afterAll(async () => {
  await stopService(svc, root);
  rmSync(root, { recursive: true, force: true });
});

async function serveRaw(id: string, data: Uint8Array, readOnly = false, s = svc): Promise<{ d: DiskExport; backing: string; workDir: string }> {
  const workDir = join(root, id);
  mkdirSync(workDir, { recursive: true });
  const backing = join(workDir, "backing.raw");
  writeFileSync(backing, data);
  const d = await s.exportDisk({ id, target: { kind: "raw", path: backing, read_only: readOnly }, mountPoint: join(workDir, "mnt"), fileName: "root.img" });
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

/** A separate reader process (as a VMM would be) that re-reads the file and compares it with `backing` for `ms`. */
const READER = `
  const fs = require("node:fs");
  const [path, backing, progress] = process.argv.slice(1);
  const want = fs.readFileSync(backing);
  let ok = 0, bad = 0;
  // reads until the test writes <progress>.stop, counting good reads into <progress>
  fs.writeFileSync(progress, "0");
  while (!fs.existsSync(progress + ".stop")) {
    const b = Buffer.alloc(want.length);
    let n = 0;
    try { const fd = fs.openSync(path, "r"); n = fs.readSync(fd, b, 0, want.length, 0); fs.closeSync(fd); } catch (e) { bad++; continue; }
    if (n === want.length && b.equals(want)) ok++; else bad++;
    try { fs.writeFileSync(progress + ".tmp", String(ok)); fs.renameSync(progress + ".tmp", progress); } catch {}
  }
  console.log(JSON.stringify({ ok, bad }));`;

describe("FUSE disk export through the daemon", () => {
  test("reads are byte-exact, whole file and at unaligned offsets; size and mode reported", async () => {
    const data = randomBytes(4 * MiB);
    const { d, workDir } = await serveRaw("rd", data);
    try {
      expect(d.path).toBe(join(workDir, "mnt", "root.img"));
      expect(d.engine).toBe("fuse");
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
      const s = await d.stats();
      expect(s.bytes_read).toBeGreaterThanOrEqual(4 * MiB);
      expect(s.opens).toBe(2);
      expect(s.image_opens).toBe(1);
    } finally {
      await d.close();
    }
  }, 60_000);

  /** O_DIRECT reads of `path` (each one READ of exactly its size and offset: no page cache, no readahead), checked against `data`. */
  function spliceCases(path: string, data: Uint8Array): void {
    const fd = openSync(path, 0o40000);
    const cases: [offset: number, size: number, expected: number][] = [
      [0, 256 * 1024, 256 * 1024],
      [12345, 256 * 1024, 256 * 1024], // unaligned in the file: spans one page more
      [MiB, 64 * 1024, 64 * 1024],
      [2 * MiB, 4096, 4096], // below the splice threshold
      [4 * MiB - 100_000, 256 * 1024, 100_000], // short at the end of the file
    ];
    try {
      for (const [offset, size, expected] of cases) {
        const buf = Buffer.alloc(size);
        expect(readSync(fd, buf, 0, size, offset)).toBe(expected);
        expect(buf.subarray(0, expected).equals(data.subarray(offset, offset + expected))).toBe(true);
      }
    } finally {
      closeSync(fd);
    }
  }
  const SPLICE_CASE_BYTES = 256 * 1024 * 2 + 64 * 1024 + 4096 + 100_000;

  test("READs of 64 KiB and more are answered by splice: byte-exact at aligned and unaligned offsets and up to the end; 4 KiB ones are copied", async () => {
    const data = randomBytes(4 * MiB);
    const { d } = await serveRaw("splice", data, true);
    try {
      spliceCases(d.path, data);
      const s = await d.stats();
      expect(s.reads).toBe(5);
      expect(s.bytes_read).toBe(SPLICE_CASE_BYTES);
      expect(s.spliced_reads).toBe(4);
      expect(s.errors).toBe(0);
    } finally {
      await d.close();
    }
  }, 60_000);

  test("with fuse_splice off the same READs are all copied, byte-exact", async () => {
    const own = await startService(root, { fuseSplice: false }, join(root, "nosplice-run"));
    try {
      const data = randomBytes(4 * MiB);
      const { d } = await serveRaw("nosplice", data, true, own);
      try {
        spliceCases(d.path, data);
        const s = await d.stats();
        expect(s.reads).toBe(5);
        expect(s.bytes_read).toBe(SPLICE_CASE_BYTES);
        expect(s.spliced_reads).toBe(0);
        expect(s.errors).toBe(0);
      } finally {
        await d.close();
      }
    } finally {
      await own.close();
    }
  }, 60_000);

  test("the mount's readahead window is [disk] fuse_read_ahead_bytes: a buffered sequential read of 4 MiB is a few large READs; 0 keeps the kernel's 128 KiB", async () => {
    const bdiKb = (mp: string) => {
      const dev = listMounts().findLast((m) => m.mountPoint === mp)!.dev;
      return Number(readFileSync(`/sys/class/bdi/${dev}/read_ahead_kb`, "utf8").trim());
    };
    const data = randomBytes(4 * MiB);
    const { d, workDir } = await serveRaw("readahead", data, true);
    try {
      expect(bdiKb(join(workDir, "mnt"))).toBe(diskConfig().fuseReadAheadKb);
      expect(diskConfig().fuseReadAheadKb).toBe(1024);
      expect(diskConfig().fuseMaxWrite).toBe(512 * 1024);
      expect(sha(readFileSync(d.path))).toBe(sha(data));
      const s = await d.stats();
      expect(s.bytes_read).toBe(4 * MiB);
      // 4 MiB in windows of 1 MiB, each two READs of 512 KiB (fuse_max_write): 8 READs (the
      // kernel's 128 KiB window would take 32 or more)
      expect(s.reads).toBeGreaterThanOrEqual(8);
      expect(s.reads).toBeLessThanOrEqual(12);
    } finally {
      await d.close();
    }
    const own = await startService(root, { fuseReadAheadKb: 0 }, join(root, "ra0-run"));
    try {
      const { d: d0, workDir: w0 } = await serveRaw("readahead0", data, true, own);
      try {
        expect(bdiKb(join(w0, "mnt"))).toBe(128);
        expect(sha(readFileSync(d0.path))).toBe(sha(data));
        expect((await d0.stats()).reads).toBeGreaterThanOrEqual(32);
      } finally {
        await d0.close();
      }
    } finally {
      await own.close();
    }
  }, 60_000);

  test("directory listing, statfs and unsupported ops behave like a one-file filesystem", async () => {
    const { d, workDir } = await serveRaw("dir", new Uint8Array(2 * MiB));
    try {
      const mnt = join(workDir, "mnt");
      expect(readdirSync(mnt)).toEqual(["root.img"]);
      const sf = statfsSync(mnt);
      expect(sf.bsize).toBe(4096);
      expect(sf.blocks).toBe((2 * MiB) / 4096);
      expect(statSync(mnt).isDirectory()).toBe(true);
      expect(errno(() => mkdirSync(join(mnt, "sub")))).toBe("ENOSYS"); // no MKDIR handler: the kernel answers ENOSYS
      expect(errno(() => unlinkSync(d.path))).toBe("ENOSYS"); // nor UNLINK
      expect(existsSync(d.path)).toBe(true);
    } finally {
      await d.close();
    }
  }, 60_000);

  test("writes land in the backing file byte-exactly; fsync succeeds", async () => {
    const { d, backing } = await serveRaw("wr", new Uint8Array(2 * MiB));
    try {
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
      expect((await d.stats()).bytes_written).toBe(patch.length + 4);
    } finally {
      await d.close();
    }
  }, 60_000);

  test("punch-hole fallocate discards: the range reads back as zeros", async () => {
    const { d, backing } = await serveRaw("discard", new Uint8Array(1 * MiB).fill(0xab));
    try {
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
    } finally {
      await d.close();
    }
  }, 60_000);

  test("bad input: write past the end, truncate, create, missing name, read-only writes", async () => {
    const { d, workDir } = await serveRaw("bad", new Uint8Array(64 * 1024));
    const ro = await serveRaw("ro", randomBytes(64 * 1024), true);
    try {
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
      expect(errno(() => writeFileSync(join(workDir, "mnt", "new.img"), "x"))).toBe("EPERM");
      expect(errno(() => statSync(join(workDir, "mnt", "nope.img")))).toBe("ENOENT");

      expect(statSync(ro.d.path).mode & 0o777).toBe(0o444);
      expect(errno(() => openSync(ro.d.path, "r+"))).toBe("EROFS");
      expect(readFileSync(ro.d.path).equals(readFileSync(ro.backing))).toBe(true);
    } finally {
      await d.close();
      await ro.d.close();
    }
  }, 60_000);

  test("a read-only guest-RAM style export accepts read-write opens but refuses every write", async () => {
    const data = randomBytes(256 * 1024);
    const workDir = join(root, "mem");
    mkdirSync(workDir, { recursive: true });
    writeFileSync(join(workDir, "mem.raw"), data);
    const d = await svc.exportDisk({ id: "mem", target: { kind: "raw", path: join(workDir, "mem.raw"), read_only: true, accept_writable_open: true }, fileName: "mem.img" });
    try {
      expect(d.path).toBe(join(svc.dir, "mnt", "mem", "mem.img"));
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
    } finally {
      await d.close();
    }
  }, 60_000);

  test("close unmounts and forgets the device; a second close is a no-op; the id can be used again", async () => {
    const { d, workDir } = await serveRaw("cl", new Uint8Array(8192));
    expect((await svc.list()).map((x) => x.dev_id)).toContain("cl");
    await d.close();
    expect(fuseMounted(join(workDir, "mnt"))).toBe(false);
    expect(existsSync(d.path)).toBe(false);
    expect((await svc.list()).map((x) => x.dev_id)).not.toContain("cl");
    await d.close();
    const again = await svc.exportDisk({ id: "cl", target: { kind: "raw", path: join(workDir, "backing.raw"), read_only: true } });
    expect(readFileSync(again.path).length).toBe(8192);
    await again.close();
  }, 60_000);

  test("a missing backing file or a taken id fails with a typed error and leaves no mount", async () => {
    const workDir = join(root, "missing");
    const codes: string[] = [];
    for (const id of ["missing", "rd2"]) {
      try {
        await svc.exportDisk({ id, target: { kind: "raw", path: join(workDir, "nope.raw"), read_only: false }, mountPoint: join(workDir, "mnt") });
      } catch (e) {
        codes.push((e as { code: string }).code);
      }
    }
    expect(codes).toEqual(["disk.open_failed", "disk.open_failed"]);
    expect(fuseMounted(join(workDir, "mnt"))).toBe(false);
    const { d } = await serveRaw("taken", new Uint8Array(4096));
    try {
      let code = "";
      try {
        await svc.exportDisk({ id: "taken", target: { kind: "raw", path: join(root, "taken", "backing.raw"), read_only: true }, mountPoint: join(root, "taken", "mnt2") });
      } catch (e) {
        code = (e as { code: string }).code;
      }
      expect(code).toBe("disk.exists");
      expect(fuseMounted(join(root, "taken", "mnt2"))).toBe(false);
    } finally {
      await d.close();
    }
  }, 60_000);

  test("kill -9 of the daemon, twice: it is started again, takes the connection back, and I/O from another process never fails", async () => {
    const data = randomBytes(1 * MiB);
    const { d, backing } = await serveRaw("k9", data);
    try {
      const first = svc.pid;
      const before = svc.restarts;
      const progress = `${backing}.reads`;
      const reads = () => Number(readFileSync(progress, "utf8"));
      const reader = Bun.spawn([process.execPath, "-e", READER, d.path, backing, progress], { stdout: "pipe", stderr: "inherit" });
      await waitFor("the reader's first reads", () => reads() >= 5, { retryErrors: true });
      for (let k = 1; k <= 2; k++) {
        const pid = svc.pid;
        process.kill(pid, "SIGKILL");
        await waitFor(`restart ${k}`, () => svc.restarts >= before + k);
        expect(svc.restarts).toBe(before + k);
        expect(alive(pid)).toBe(false);
        const n = reads();
        await waitFor(`reads through daemon ${k + 1}`, () => reads() >= n + 5);
      }
      writeFileSync(`${progress}.stop`, "");
      expect(await reader.exited).toBe(0);
      const res = JSON.parse(await new Response(reader.stdout).text());
      expect(res.bad).toBe(0);
      expect(res.ok).toBeGreaterThan(10);
      expect(svc.pid).not.toBe(first);
      expect(fuseMounted(join(root, "k9", "mnt"))).toBe(true);
      const f = await svc.features();
      expect(f.pid).toBe(svc.pid);
      expect(f.restarts_recovered).toBe(1);
      expect((await svc.list()).find((x) => x.dev_id === "k9")?.path).toBe(d.path);
      // served by the new daemon: its counters start at its own reads
      expect((await d.stats()).image_opens).toBe(1);
    } finally {
      await d.close();
    }
    expect(fuseMounted(join(root, "k9", "mnt"))).toBe(false);
  }, 60_000);

  test("the compiled single binary (bun build --compile, worker modules embedded) runs the daemon and serves a disk", async () => {
    const workDir = join(root, "compiled");
    mkdirSync(workDir, { recursive: true });
    const bin = join(workDir, "agentenv");
    const build = Bun.spawnSync([process.execPath, "build", "--compile", ...compileEntrypoints(), "--outfile", bin], { stderr: "pipe" });
    expect(build.stderr.toString()).toBe("");
    expect(build.exitCode).toBe(0);
    const data = randomBytes(3 * MiB);
    writeFileSync(join(workDir, "b.raw"), data);
    const dir = join(workDir, "run");
    const settings = daemonSettings({ ...diskConfig(), pool: { enabled: false, lowWatermark: 0, highWatermark: 0 } }, dir);
    const daemon = Bun.spawn([bin, "ublk-daemon", "--dir", dir, "--settings", JSON.stringify(settings)], { stdout: "pipe", stderr: "inherit", cwd: "/" });
    try {
      const first = await (daemon.stdout as ReadableStream<Uint8Array>).getReader().read();
      expect(new TextDecoder().decode(first.value)).toBe(`ready ${join(dir, "daemon.sock")}\n`);
      const c = await DaemonClient.connect(join(dir, "daemon.sock"), { timeoutMs: 10_000, maxFrameBytes: 1 << 20 });
      try {
        const dev = await c.request({ kind: "create_runtime_device", dev_id: "c1", target: { kind: "raw", path: join(workDir, "b.raw"), read_only: true } });
        // 1 MiB O_DIRECT reads: answered by the reader threads (the embedded worker module)
        const fd = openSync(dev.path, 0o40000);
        const buf = Buffer.alloc(3 * MiB);
        try {
          for (let off = 0; off < 3 * MiB; off += MiB) expect(readSync(fd, buf, off, MiB, off)).toBe(MiB);
        } finally {
          closeSync(fd);
        }
        expect(buf.equals(data)).toBe(true);
        const st = await c.request({ kind: "stats", dev_id: "c1" });
        // a READ carries at most max_write bytes: each 1 MiB read is ceil(MiB / max_write) of them
        expect(st.stats.reads).toBe(3 * Math.ceil(MiB / settings.fuse.maxWrite));
        expect(st.stats.bytes_read).toBe(3 * MiB);
        await c.request({ kind: "shutdown" });
      } finally {
        c.close();
      }
      expect(await daemon.exited).toBe(0);
      expect(fuseMounted(join(dir, "mnt", "c1"))).toBe(false);
    } finally {
      if (alive(daemon.pid)) daemon.kill("SIGKILL");
    }
  }, 180_000);

  test("with no restarts left a dead daemon is not replaced; closing the disk detaches its mount", async () => {
    const r2 = join(root, "norestart");
    const s2 = await startService(r2, { maxRestarts: 0 });
    try {
      const { d, workDir } = await serveRaw("norestart", new Uint8Array(8192), false, s2);
      process.kill(s2.pid, "SIGKILL");
      // requests fail daemon_failed once the service has handled the death (no restarts left)
      await waitFor("the service to give the daemon up", () => s2.list().then(() => "", (e: unknown) => errorCode(e) === "disk.daemon_failed"));
      expect(alive(s2.pid)).toBe(false);
      expect(s2.restarts).toBe(0);
      await d.close();
      expect(fuseMounted(join(workDir, "mnt"))).toBe(false);
    } finally {
      await stopService(s2, r2);
    }
  }, 60_000);

  test("a node that crashed leaves its daemon serving; the next node's start shuts it down and every mount is gone", async () => {
    const r3 = join(root, "crash");
    mkdirSync(r3, { recursive: true });
    const nodeScript = `
      const { DiskService, diskConfig } = await import(${JSON.stringify(join(import.meta.dir, "../../../src/storage/daemon/index.ts"))});
      const [root] = process.argv.slice(1);
      const fs = require("node:fs");
      const svc = await DiskService.start({ dir: root + "/run", config: diskConfig() });
      const out = { daemon: svc.pid, disks: [] };
      for (const id of ["crash-a", "crash-b"]) {
        fs.mkdirSync(root + "/" + id, { recursive: true });
        fs.writeFileSync(root + "/" + id + "/b.raw", new Uint8Array(8192).fill(3));
        const d = await svc.exportDisk({ id, target: { kind: "raw", path: root + "/" + id + "/b.raw", read_only: false }, mountPoint: root + "/" + id + "/mnt" });
        out.disks.push(d.path);
      }
      console.log(JSON.stringify(out));
      await Bun.sleep(60000);`;
    const node = Bun.spawn([process.execPath, "-e", nodeScript, r3], { stdout: "pipe", stderr: "inherit" });
    const crashed = JSON.parse(await firstLine(node)) as { daemon: number; disks: string[] };
    node.kill("SIGKILL");
    await node.exited;
    let next: DiskService | undefined;
    try {
      // the daemon lives on in its own session and still serves
      expect(alive(crashed.daemon)).toBe(true);
      for (const p of crashed.disks) expect(readFileSync(p).every((b) => b === 3)).toBe(true);
      next = await startService(r3);
      expect(exited(crashed.daemon)).toBe(true); // gone, or a zombie its new parent has not reaped yet
      for (const p of crashed.disks) expect(fuseMounted(join(p, ".."))).toBe(false);
      expect(await next.list()).toEqual([]);
    } finally {
      if (alive(crashed.daemon)) process.kill(crashed.daemon, "SIGKILL");
      await stopService(next, r3);
    }
  }, 60_000);

  test("a node and its daemon both killed: the next daemon finds no holder and cleans every device up", async () => {
    const r4 = join(root, "both");
    mkdirSync(join(r4, "x"), { recursive: true });
    writeFileSync(join(r4, "x", "b.raw"), new Uint8Array(8192));
    const nodeScript = `
      const { DiskService, diskConfig } = await import(${JSON.stringify(join(import.meta.dir, "../../../src/storage/daemon/index.ts"))});
      const [root] = process.argv.slice(1);
      const svc = await DiskService.start({ dir: root + "/run", config: diskConfig() });
      const d = await svc.exportDisk({ id: "x", target: { kind: "raw", path: root + "/x/b.raw", read_only: false }, mountPoint: root + "/x/mnt" });
      console.log(JSON.stringify({ daemon: svc.pid, path: d.path }));
      await Bun.sleep(60000);`;
    const node = Bun.spawn([process.execPath, "-e", nodeScript, r4], { stdout: "pipe", stderr: "inherit" });
    let next: DiskService | undefined;
    try {
      const { daemon: daemonPid, path } = JSON.parse(await firstLine(node)) as { daemon: number; path: string };
      expect(readFileSync(path).length).toBe(8192);
      expect(Number(readFileSync(join(r4, "run", "daemon.lock"), "utf8").trim())).toBe(daemonPid);
      node.kill("SIGKILL");
      process.kill(daemonPid, "SIGKILL");
      await node.exited;
      await waitFor("the daemon to be gone", () => !alive(daemonPid));
      next = await startService(r4);
      expect(fuseMounted(join(r4, "x", "mnt"))).toBe(false);
      expect(await next.list()).toEqual([]);
      expect(readFileSync(join(r4, "run", "daemon.log"), "utf8")).toContain("device not recovered: cleaned up");
    } finally {
      if (alive(node.pid)) node.kill("SIGKILL");
      await stopService(next, r4);
    }
  }, 60_000);
});
