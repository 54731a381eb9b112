// Integration: the disk daemon's requests over its real Unix socket, one `agentenv ublk-daemon`
// for the file (needs root: FUSE). Raw frames for malformed and oversize input; every request
// kind against real devices: shared refcounted read-only devices (the snapshot memory image
// case: opened once, mapped by many), the warm pool, restack, recovery of a restacked stack after
// kill -9, update_size (growing a served disk), hold, delete, shutdown; devices lost under their
// users (a FUSE mount unmounted from outside, a device the restarted daemon cannot serve again)
// reported as `device_lost` events and on the node's handles. The FUSE engine stands in here for
// ublk, which this host's kernel lacks (../ublk-vm.test.ts shows the same with ublk in a guest).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, existsSync, fstatSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, rmSync, statSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { daemonPaths } from "../../../src/storage/daemon/daemon.ts";
import { daemonSettings, diskConfig, reapStaleMounts } from "../../../src/storage/daemon/index.ts";
import { encodeFrame, FrameReader } from "../../../src/storage/daemon/protocol.ts";
import { DiskError, upperPaths, type DiskService } from "../../../src/storage/daemon/index.ts";
import { MNT_DETACH, umount2 } from "../../../src/ffi/mount.ts";
import { renameSync } from "node:fs";
import { openStack } from "../../../src/storage/overlaybd/index.ts";
import { alive, firstLine } from "../../helpers/proc.ts";
import { fuseMounted, startService, stopService } from "./fixtures/service.ts";
import { twoLayerTemplate } from "./fixtures/template.ts";
import { waitFor } from "../../helpers/wait.ts";

const MiB = 1 << 20;
const SIZE = 8 * MiB;
let root: string;
let svc: DiskService;
let lowers: string[];
let expected: Uint8Array;

beforeAll(async () => {
  root = mkdtempSync("/tmp/aenv-daemon-test-");
  ({ lowers, expected } = await twoLayerTemplate(root, "template", SIZE));
  svc = await startService(root, { maxFrameBytes: 64 * 1024 });
}, 60_000);
afterAll(async () => {
  await stopService(svc, root);
  rmSync(root, { recursive: true, force: true });
});

/** A raw connection to the daemon (default: this file's): send bytes, collect decoded answers, see when it closes. */
async function rawConn(socket = daemonPaths(svc.dir).socket): Promise<{ send(b: Uint8Array): void; next(): Promise<Record<string, unknown>>; closed: Promise<void>; end(): void }> {
  const reader = new FrameReader(1 << 20);
  const got: Record<string, unknown>[] = [];
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => (resolveClosed = r));
  const sock = await Bun.connect({
    unix: socket,
    socket: {
      data(_s, chunk) {
        for (const f of reader.push(chunk)) if (f.ok) got.push(f.value);
      },
      close() {
        resolveClosed();
      },
    },
  });
  return {
    send: (b) => void sock.write(b),
    async next() {
      await waitFor("an answer from the daemon", () => got.length > 0);
      return got.shift()!;
    },
    closed,
    end: () => sock.end(),
  };
}

async function code(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    return (e as { code: string }).code;
  }
  return "resolved";
}

describe("disk daemon protocol", () => {
  test("malformed frames and bad requests get typed answers and the connection goes on", async () => {
    const c = await rawConn();
    try {
      const bad = new TextEncoder().encode("{oops");
      const f = new Uint8Array(4 + bad.length);
      new DataView(f.buffer).setUint32(0, bad.length, false);
      f.set(bad, 4);
      c.send(f);
      expect(await c.next()).toMatchObject({ kind: "invalid_request", code: "disk.malformed_frame" });
      c.send(encodeFrame({ kind: "format_disk", seq: 5 }));
      expect(await c.next()).toMatchObject({ kind: "invalid_request", seq: 5, code: "disk.bad_request", details: { field: "kind", value: "format_disk" } });
      c.send(encodeFrame({ kind: "delete", seq: 6, dev_id: "../etc" }));
      expect(await c.next()).toMatchObject({ kind: "invalid_request", seq: 6, code: "disk.bad_request", details: { field: "dev_id" } });
      c.send(encodeFrame({ kind: "delete", seq: 7, dev_id: "nope" }));
      expect(await c.next()).toMatchObject({ kind: "error", seq: 7, code: "disk.not_found", details: { devId: "nope" } });
      // two requests in one write, answered in order
      c.send(new Uint8Array([...encodeFrame({ kind: "list", seq: 8 }), ...encodeFrame({ kind: "get_features", seq: 9 })]));
      const answers = [await c.next(), await c.next()].sort((a, b) => (a.seq as number) - (b.seq as number));
      expect(answers.map((a) => [a.kind, a.seq])).toEqual([["devices", 8], ["features", 9]]);
    } finally {
      c.end();
    }
  });

  test("an oversize frame is refused and the daemon closes that connection; others keep working", async () => {
    const c = await rawConn();
    const head = new Uint8Array(4);
    new DataView(head.buffer).setUint32(0, 64 * 1024 + 1, false);
    c.send(head);
    expect(await c.next()).toMatchObject({ kind: "invalid_request", code: "disk.frame_too_large", details: { length: 64 * 1024 + 1, max: 64 * 1024 } });
    await c.closed;
    const f = await svc.features();
    expect(f.max_frame_bytes).toBe(64 * 1024);
  });

  test("a failure of another subsystem in the daemon arrives as disk.backend_failed naming its own code", async () => {
    // a lower that exists but is no overlaybd layer: openStack in the daemon throws overlaybd.bad_magic
    const garbage = join(root, "garbage.layer");
    writeFileSync(garbage, Buffer.alloc(8192));
    const err = await svc.exportDisk({ id: "bad1", target: { kind: "overlaybd", lowers: [garbage] } }).then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(DiskError);
    expect(err).toMatchObject({
      code: "disk.backend_failed",
      message: `overlaybd.bad_magic: not an LSMT header/trailer (magic mismatch) (${garbage} @0)`,
      details: { cause: "overlaybd.bad_magic", file: garbage, offset: 0, kind: "create_runtime_device" },
    });
    // on the wire too, and the connection goes on
    const c = await rawConn();
    try {
      c.send(encodeFrame({ kind: "create_runtime_device", seq: 11, dev_id: "bad2", target: { kind: "overlaybd", lowers: [garbage] } }));
      expect(await c.next()).toMatchObject({ kind: "error", seq: 11, code: "disk.backend_failed", details: { cause: "overlaybd.bad_magic" } });
      c.send(encodeFrame({ kind: "list", seq: 12 }));
      expect(await c.next()).toMatchObject({ kind: "devices", seq: 12 });
    } finally {
      c.end();
    }
    expect((await svc.list()).map((d) => d.dev_id)).not.toContain("bad1");
  });

  test("get_features names the engines of this host and the daemon's pid", async () => {
    const f = await svc.features();
    expect(f).toMatchObject({ kind: "features", pid: svc.pid, engines: ["fuse"], default_engine: "fuse", ublk_control: existsSync("/dev/ublk-control"), fuse_threads: 2 });
    expect(await code(svc.exportDisk({ id: "u1", engine: "ublk", target: { kind: "raw", path: join(root, "x.raw"), read_only: true } }))).toBe("disk.unsupported");
  });

  test("shared read-only device: opened once, refcounted, one page cache for every reader, gone with the last release", async () => {
    const a = await svc.acquireShared({ key: "snap-1", lowers, fileName: "mem.img", acceptWritableOpen: true });
    const b = await svc.acquireShared({ key: "snap-1", lowers, fileName: "mem.img", acceptWritableOpen: true });
    expect(b.id).toBe(a.id);
    expect(b.path).toBe(a.path);
    expect(a.access).toBe("shared");
    let s = await a.stats();
    expect(s.refcount).toBe(2);
    expect(s.image_opens).toBe(1);
    // a VMM opens guest RAM read-write (MAP_PRIVATE); writes are refused
    const fd = openSync(a.path, "r+");
    try {
      expect(() => writeSync(fd, Buffer.alloc(4096), 0, 4096, 0)).toThrow();
    } finally {
      closeSync(fd);
    }
    // two readers in other processes: the second is served from the shared page cache
    const read = () => Bun.spawnSync([process.execPath, "-e", `require("node:fs").readFileSync(${JSON.stringify(a.path)})`]).exitCode;
    expect(read()).toBe(0);
    const afterFirst = (await a.stats()).bytes_read;
    expect(afterFirst).toBeGreaterThanOrEqual(SIZE);
    expect(read()).toBe(0);
    s = await a.stats();
    expect(s.bytes_read).toBe(afterFirst);
    // such an opener's hole punch (QEMU giving back guest RAM the guest reported free) is a
    // discard hint: answered, counted, and the image reads as before; zeroing a range is refused
    const punch = Bun.spawnSync(["fallocate", "--punch-hole", "--keep-size", "--offset", "4096", "--length", "8192", a.path]);
    expect(punch.exitCode).toBe(0);
    expect((await a.stats()).discards).toBe(s.discards + 1);
    expect(Bun.spawnSync(["fallocate", "--zero-range", "--keep-size", "--offset", "4096", "--length", "8192", a.path]).exitCode).not.toBe(0);
    expect(Bun.spawnSync(["fallocate", "--punch-hole", "--keep-size", "--offset", String(SIZE), "--length", "8192", a.path]).exitCode).not.toBe(0);
    expect((await a.stats()).discards).toBe(s.discards + 1);
    expect(readFileSync(a.path).equals(Buffer.from(expected))).toBe(true);
    await a.close();
    await a.close(); // idempotent: one reference dropped once
    s = await b.stats();
    expect(s.refcount).toBe(1);
    expect(fuseMounted(join(svc.dir, "shared", "snap-1"))).toBe(true);
    await b.close();
    expect(fuseMounted(join(svc.dir, "shared", "snap-1"))).toBe(false);
    expect(await code(svc.stats(a.id))).toBe("disk.not_found");
    // a writable target cannot be shared
    expect(await code(svc.request({ kind: "acquire", access_mode: "shared", share_key: "w", target: { kind: "overlaybd", lowers, upper: upperPaths(join(root, "w")) } }))).toBe("disk.bad_request");
  });

  test("a private mapper's discard (QEMU free page reporting): its copies go, it reads the image again, other mappers keep theirs", async () => {
    const d = await svc.acquireShared({ key: "snap-discard", lowers, fileName: "mem.img", acceptWritableOpen: true });
    try {
      // two processes map the image MAP_PRIVATE (as QEMU maps a memory image) and write the same
      // 8 KiB at 1 MiB (image bytes there: the pattern); then the first gives the range back the
      // way QEMU 7.2's ram_block_discard_range does: fallocate(PUNCH_HOLE) on the file, then
      // madvise(DONTNEED) on its mapping; the second reads its own bytes last
      const off = 1 * MiB;
      const script = `
import json, mmap, os, subprocess, sys
path, off, fill, discard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
fd = os.open(path, os.O_RDWR)
m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
m[off:off + 8192] = bytes([fill]) * 8192
print("written", flush=True)
sys.stdin.readline()
if discard:
    subprocess.run(["fallocate", "--punch-hole", "--keep-size", "--offset", str(off), "--length", "8192", path], check=True)
    m.madvise(mmap.MADV_DONTNEED, off, 8192)
print(json.dumps({"hex": m[off:off + 8192].hex()}), flush=True)
`;
      const run = (fill: number, discard: boolean) => Bun.spawn(["python3", "-c", script, d.path, String(off), String(fill), discard ? "1" : "0"], { stdin: "pipe", stdout: "pipe" });
      const lines = (p: ReturnType<typeof run>) => {
        const r = p.stdout.getReader();
        let buf = "";
        return async () => {
          while (!buf.includes("\n")) {
            const c = await r.read();
            if (c.done) throw new Error("mapper ended early");
            buf += new TextDecoder().decode(c.value);
          }
          const l = buf.slice(0, buf.indexOf("\n"));
          buf = buf.slice(buf.indexOf("\n") + 1);
          return l;
        };
      };
      const a = run(0xaa, true);
      const b = run(0xbb, false);
      const [la, lb] = [lines(a), lines(b)];
      expect(await la()).toBe("written");
      expect(await lb()).toBe("written");
      a.stdin.write("\n");
      a.stdin.flush();
      const afterA = Buffer.from(JSON.parse(await la()).hex, "hex");
      b.stdin.write("\n");
      b.stdin.flush();
      const afterB = Buffer.from(JSON.parse(await lb()).hex, "hex");
      expect(await a.exited).toBe(0);
      expect(await b.exited).toBe(0);
      // the discarded range reads the image's bytes again: not zeros, not what the mapper wrote
      expect(afterA.equals(Buffer.from(expected.subarray(off, off + 8192)))).toBe(true);
      expect(afterA.some((x) => x !== 0)).toBe(true);
      // the other VM's private copies are its own
      expect(afterB.equals(Buffer.alloc(8192, 0xbb))).toBe(true);
      expect((await d.stats()).discards).toBe(1);
      expect(readFileSync(d.path).equals(Buffer.from(expected))).toBe(true);
    } finally {
      await d.close();
    }
  });

  test("exclusive acquire binds a pre-created export of the warm pool, which refills", async () => {
    const before = (await svc.features()).pooled.fuse ?? 0;
    expect(before).toBeGreaterThanOrEqual(1);
    const d = await svc.rootDisk({ id: "pool1", lowers, sandboxDir: join(root, "pool1") });
    try {
      expect(d.fromPool).toBe(true);
      expect(d.path).toBe(join(root, "pool1", "mnt", "root.img"));
      expect(readFileSync(d.path).equals(Buffer.from(expected))).toBe(true);
      // the pre-created mount point is gone, the sandbox's remains
      expect(fuseMounted(join(root, "pool1", "mnt"))).toBe(true);
      // refilled to the high watermark
      await waitFor("the pool refilled to 2", async () => ((await svc.features()).pooled.fuse ?? 0) === 2);
      // the consumed export's pre-created mount point went with it: one directory per pooled export
      const poolDirs = readdirSync(join(svc.dir, "pool"));
      expect(poolDirs.length).toBe(2);
      expect(poolDirs.every((n) => fuseMounted(join(svc.dir, "pool", n)))).toBe(true);
    } finally {
      await d.close();
    }
    expect(fuseMounted(join(root, "pool1", "mnt"))).toBe(false);
  });

  test("restack seals the upper into a layer between writes; after kill -9 the daemon serves the restacked stack", async () => {
    const sb = join(root, "rs");
    const d = await svc.rootDisk({ id: "rs", lowers, sandboxDir: sb });
    try {
      const fd = openSync(d.path, "r+");
      try {
        writeSync(fd, Buffer.alloc(4096, 0x11), 0, 4096, MiB);
      } finally {
        closeSync(fd);
      }
      const next = { data: join(sb, "upper", "n1.data"), index: join(sb, "upper", "n1.index") };
      const layer = await svc.restack("rs", join(sb, "layer1"), next);
      expect(layer).toBe(join(sb, "layer1"));
      const fd2 = openSync(d.path, "r+");
      try {
        writeSync(fd2, Buffer.alloc(4096, 0x22), 0, 4096, MiB + 4096);
      } finally {
        closeSync(fd2);
      }
      const want = Buffer.from(expected);
      want.fill(0x11, MiB, MiB + 4096);
      want.fill(0x22, MiB + 4096, MiB + 8192);
      expect(readFileSync(d.path).equals(want)).toBe(true);
      // the new layer holds the first write, the new upper the second
      const img = await openStack({ lowers: [...lowers, layer] });
      try {
        const b = new Uint8Array(8192);
        await img.pread(b, MiB);
        expect(b.subarray(0, 4096).every((x) => x === 0x11)).toBe(true);
        expect(Buffer.from(b.subarray(4096)).equals(Buffer.from(expected.subarray(MiB + 4096, MiB + 8192)))).toBe(true);
      } finally {
        await img.close();
      }
      process.kill(svc.pid, "SIGKILL");
      const restarts = svc.restarts;
      await waitFor("the daemon to be started again", () => svc.restarts > restarts);
      expect(readFileSync(d.path).equals(want)).toBe(true);
      expect(await code(svc.restack("rs", null, { data: "rel", index: "/x" }))).toBe("disk.bad_request");
    } finally {
      await d.close();
    }
    expect(await code(svc.restack("rs", null, { data: join(sb, "n2.data"), index: join(sb, "n2.index") }))).toBe("disk.not_found");
  }, 60_000);

  test("update_size grows a served root disk: an open reader sees the size, the new range is zeros and writable, kill -9 keeps it", async () => {
    const sb = join(root, "grow");
    const d = await svc.rootDisk({ id: "grow", lowers, sandboxDir: sb });
    try {
      const fd = openSync(d.path, "r+");
      try {
        expect(fstatSync(fd).size).toBe(SIZE);
        writeSync(fd, Buffer.alloc(4096, 0x33), 0, 4096, SIZE - 4096);
        expect(await svc.updateSize("grow", SIZE + 4 * MiB)).toBe(SIZE + 4 * MiB);
        // the reader that had the file open sees the new size (cached attributes dropped)
        expect(fstatSync(fd).size).toBe(SIZE + 4 * MiB);
        const tail = Buffer.alloc(4 * MiB + 4096, 0xff);
        expect(readSync(fd, tail, 0, tail.length, SIZE - 4096)).toBe(tail.length);
        expect(tail.subarray(0, 4096).every((x) => x === 0x33)).toBe(true);
        expect(tail.subarray(4096).every((x) => x === 0)).toBe(true);
        writeSync(fd, Buffer.alloc(4096, 0x44), 0, 4096, SIZE + 4 * MiB - 4096);
        // writes past the new end still fail
        expect(() => writeSync(fd, Buffer.alloc(512, 1), 0, 512, SIZE + 4 * MiB)).toThrow();
      } finally {
        closeSync(fd);
      }
      const want = Buffer.concat([Buffer.from(expected), Buffer.alloc(4 * MiB)]);
      want.fill(0x33, SIZE - 4096, SIZE);
      want.fill(0x44, SIZE + 4 * MiB - 4096);
      expect(readFileSync(d.path).equals(want)).toBe(true);
      // the size lives in the upper: a restarted daemon serves the grown disk
      process.kill(svc.pid, "SIGKILL");
      const restarts = svc.restarts;
      await waitFor("the daemon to be started again", () => svc.restarts > restarts);
      expect(svc.restarts).toBe(restarts + 1);
      expect(statSync(d.path).size).toBe(SIZE + 4 * MiB);
      expect(readFileSync(d.path).equals(want)).toBe(true);
      const img = await openStack({ lowers, upper: upperPaths(sb) });
      try {
        expect(img.size).toBe(SIZE + 4 * MiB);
      } finally {
        await img.close();
      }
    } finally {
      await d.close();
    }
  }, 60_000);

  test("update_size while another process reads the disk: its reads wait across each grow and never fail", async () => {
    const sb = join(root, "grow2");
    const d = await svc.rootDisk({ id: "grow2", lowers, sandboxDir: sb });
    const exp = join(root, "grow2.expected");
    const out = join(root, "grow2.log");
    writeFileSync(exp, expected.subarray(0, MiB));
    const lines = () => (existsSync(out) ? readFileSync(out, "utf8").split("\n").filter(Boolean) : []);
    // one line per whole 1 MiB O_DIRECT read compared with the template's bytes
    const loop = `while :; do if dd if=${d.path} bs=64k count=16 iflag=direct 2>/dev/null | cmp -s - ${exp}; then echo ok; else echo bad; fi; done >> ${out}`;
    const reader = Bun.spawn(["sh", "-c", loop], { detached: true });
    let before = 0;
    try {
      before = await waitFor("three reads before the grows", () => lines().length >= 3 && lines().length);
      for (let k = 1; k <= 5; k++) expect(await svc.updateSize("grow2", SIZE + k * MiB)).toBe(SIZE + k * MiB);
      const mid = lines().length;
      await waitFor("three reads after the grows", () => lines().length >= mid + 3);
      expect(statSync(d.path).size).toBe(SIZE + 5 * MiB);
    } finally {
      process.kill(-reader.pid, "SIGKILL");
      await reader.exited;
      await d.close();
    }
    const l = lines();
    expect(l.length).toBeGreaterThanOrEqual(before + 3);
    expect(l.filter((x) => x !== "ok")).toEqual([]);
  }, 60_000);

  test("update_size, hold, delete and a raw device's restack answer with typed errors", async () => {
    const raw = join(root, "r.raw");
    writeFileSync(raw, new Uint8Array(64 * 1024));
    const d = await svc.exportDisk({ id: "r1", target: { kind: "raw", path: raw, read_only: false } });
    try {
      expect(await svc.request({ kind: "update_size", dev_id: "r1", new_size: 64 * 1024 })).toMatchObject({ kind: "size_updated", size: 64 * 1024 });
      // a raw disk grows: the file and the served file, the new range zeros
      expect(await svc.updateSize("r1", 128 * 1024)).toBe(128 * 1024);
      expect(statSync(raw).size).toBe(128 * 1024);
      expect(statSync(d.path).size).toBe(128 * 1024);
      expect(readFileSync(d.path).equals(Buffer.alloc(128 * 1024))).toBe(true);
      expect(await code(svc.updateSize("r1", 64 * 1024))).toBe("disk.bad_request");
      expect(await code(svc.request({ kind: "update_size", dev_id: "r1", new_size: 1000 }))).toBe("disk.bad_request");
      expect(await code(svc.request({ kind: "update_size", dev_id: "zz", new_size: 512 }))).toBe("disk.not_found");
      const ro = await svc.acquireShared({ key: "grow-ro", rawPath: raw });
      try {
        expect(await code(svc.updateSize(ro.id, 256 * 1024))).toBe("disk.unsupported");
      } finally {
        await ro.close();
      }
      expect(await code(svc.request({ kind: "hold", dev_id: "r1", holder_pid: 2 ** 22 + 7, holder_fd: 3 }))).toBe("disk.bad_request");
      expect(await code(svc.request({ kind: "hold", dev_id: "zz", holder_pid: process.pid, holder_fd: 3 }))).toBe("disk.not_found");
      expect(await code(svc.restack("r1", null, { data: join(root, "a.data"), index: join(root, "a.index") }))).toBe("disk.unsupported");
      expect(await code(svc.request({ kind: "release", dev_id: "zz" }))).toBe("disk.not_found");
    } finally {
      await d.close();
    }
    expect(await code(svc.request({ kind: "delete", dev_id: "r1" }))).toBe("disk.not_found");
  });

  test("at shutdown the daemon writes every answer before it closes its socket: the shutdown's own, and a refusal of what came after", async () => {
    const dir = join(root, "drain");
    const settings = daemonSettings(diskConfig(), dir);
    const daemon = Bun.spawn([process.execPath, join(import.meta.dir, "../../../src/cli/main.ts"), "ublk-daemon", "--dir", dir, "--settings", JSON.stringify(settings)], { stdout: "pipe", stderr: "inherit" });
    try {
      expect(await firstLine(daemon)).toBe(`ready ${daemonPaths(dir).socket}`);
      const c = await rawConn(daemonPaths(dir).socket);
      // one write: the shutdown, then a request the daemon takes while it shuts down
      c.send(new Uint8Array([...encodeFrame({ kind: "shutdown", seq: 1 }), ...encodeFrame({ kind: "list", seq: 2 })]));
      const answers = [await c.next(), await c.next()].sort((a, b) => (a.seq as number) - (b.seq as number));
      expect(answers).toMatchObject([
        { kind: "ok", seq: 1 },
        { kind: "error", seq: 2, code: "disk.busy" },
      ]);
      await c.closed;
      expect(await daemon.exited).toBe(0);
      expect(existsSync(daemonPaths(dir).socket)).toBe(false);
    } finally {
      if (alive(daemon.pid)) daemon.kill("SIGKILL");
      reapStaleMounts([dir]);
    }
  });

  test("a device unmounted from outside is lost: every connection gets device_lost, the handle's lost resolves, list reports it, release is not_found", async () => {
    const events = await rawConn();
    try {
      const d = await svc.rootDisk({ id: "lost1", lowers, sandboxDir: join(root, "lost1") });
      const seen: string[] = [];
      void d.lost.then((w) => seen.push(w));
      expect(readFileSync(d.path).equals(Buffer.from(expected))).toBe(true);
      expect(umount2(join(root, "lost1", "mnt"), MNT_DETACH)).toBe(0);
      const ev = await events.next();
      expect(ev).toMatchObject({ kind: "device_lost", dev_id: "lost1", engine: "fuse", reason: "its fuse device stopped being served: ENODEV" });
      expect(ev.seq).toBeUndefined();
      expect(typeof ev.at).toBe("number");
      expect(await d.lost).toBe("its fuse device stopped being served: ENODEV");
      expect(seen).toEqual(["its fuse device stopped being served: ENODEV"]);
      const l = await svc.request({ kind: "list" });
      expect(l.devices.map((x) => x.dev_id)).not.toContain("lost1");
      expect(l.lost).toContainEqual({ dev_id: "lost1", engine: "fuse", reason: "its fuse device stopped being served: ENODEV", at: ev.at as number });
      expect(await code(svc.stats("lost1"))).toBe("disk.not_found");
      // a release of a lost device is not_found naming the loss; the daemon forgets the loss then
      const rel = await svc.request({ kind: "release", dev_id: "lost1" }).catch((e) => e);
      expect(rel).toMatchObject({ code: "disk.not_found", details: { devId: "lost1", lost: "its fuse device stopped being served: ENODEV" } });
      expect((await svc.request({ kind: "list" })).lost.map((x) => x.dev_id)).not.toContain("lost1");
      // the node's close after a loss is local clean-up only
      await d.close();
      expect(fuseMounted(join(root, "lost1", "mnt"))).toBe(false);
      // another device of the same daemon is unharmed
      const other = await svc.rootDisk({ id: "lost1b", lowers, sandboxDir: join(root, "lost1b") });
      expect(readFileSync(other.path).equals(Buffer.from(expected))).toBe(true);
      await other.close();
    } finally {
      events.end();
    }
  });

  test("a device the restarted daemon cannot serve again (its layer is gone) is lost on the node's handle; the others recover", async () => {
    const own = join(root, "lost2-tpl");
    mkdirSync(own);
    const t = await twoLayerTemplate(own, "t", SIZE, 7);
    const d = await svc.rootDisk({ id: "lost2", lowers: t.lowers, sandboxDir: join(root, "lost2") });
    const keep = await svc.rootDisk({ id: "lost2keep", lowers, sandboxDir: join(root, "lost2keep") });
    // a reader (as a VMM) with the disk open across the loss, reading again when told
    const go = join(root, "lost2.go");
    const reader = Bun.spawn(["sh", "-c", `exec 3<${d.path}; echo open; while [ ! -e ${go} ]; do sleep 0.05; done; dd bs=4096 count=1 iflag=direct <&3 >/dev/null 2>&1; echo rc=$?`], { stdout: "pipe" });
    try {
      expect(readFileSync(d.path).equals(Buffer.from(t.expected))).toBe(true);
      const out = reader.stdout.getReader();
      expect(new TextDecoder().decode((await out.read()).value)).toBe("open\n");
      // the running daemon keeps the layer open; the next one cannot open it
      renameSync(t.lowers[1]!, `${t.lowers[1]}.away`);
      const restarts = svc.restarts;
      process.kill(svc.pid, "SIGKILL");
      const why = await d.lost;
      expect(svc.restarts).toBe(restarts + 1);
      expect(why).toStartWith("not recovered after a daemon restart: ");
      expect(why).toContain(t.lowers[1]!);
      // nobody serves it: the node let go of its connection copy, so the open file's I/O fails
      // at once instead of waiting for good
      writeFileSync(go, "");
      expect(await reader.exited).toBe(0);
      expect(new TextDecoder().decode((await out.read()).value)).not.toBe("rc=0\n");
      const l = await svc.request({ kind: "list" });
      expect(l.devices.map((x) => x.dev_id)).toContain("lost2keep");
      expect(l.devices.map((x) => x.dev_id)).not.toContain("lost2");
      expect(l.lost.find((x) => x.dev_id === "lost2")?.reason).toBe(why);
      expect(readFileSync(keep.path).equals(Buffer.from(expected))).toBe(true);
      // a loss of keep would have come before the list answer (the daemon's messages arrive in order)
      expect(await Promise.race([keep.lost, Promise.resolve("not lost")])).toBe("not lost");
    } finally {
      reader.kill("SIGKILL");
      await d.close();
      await keep.close();
    }
    expect(fuseMounted(join(root, "lost2", "mnt"))).toBe(false);
  }, 60_000);

  test("shutdown removes every device and its mount point directories and the daemon exits 0; requests after it fail", async () => {
    const r2 = join(root, "sd");
    mkdirSync(r2, { recursive: true });
    writeFileSync(join(r2, "b.raw"), new Uint8Array(8192));
    // empty mount points an earlier daemon left go at start; a directory with content stays
    for (const d of ["pool/pool-1-1", "pool/pool-1-2", "shared/mem-stale", "shared/kept"]) mkdirSync(join(r2, "run", d), { recursive: true });
    writeFileSync(join(r2, "run", "shared", "kept", "f"), "x");
    const s2 = await startService(r2);
    try {
      expect(existsSync(join(s2.dir, "pool", "pool-1-1"))).toBe(false);
      expect(existsSync(join(s2.dir, "pool", "pool-1-2"))).toBe(false);
      expect(existsSync(join(s2.dir, "shared", "mem-stale"))).toBe(false);
      expect(readFileSync(join(s2.dir, "shared", "kept", "f"), "utf8")).toBe("x");
      const pooled = (await s2.features()).pooled.fuse ?? 0;
      expect(pooled).toBeGreaterThanOrEqual(1);
      expect(readdirSync(join(s2.dir, "pool")).length).toBe(pooled);
      const shared = await s2.request({ kind: "acquire", access_mode: "shared", share_key: "sk", target: { kind: "raw", path: join(r2, "b.raw"), read_only: true } });
      expect(fuseMounted(join(s2.dir, "shared", "sk"))).toBe(true);
      expect(shared.kind).toBe("device_acquired");
      const d = await s2.exportDisk({ id: "sd", target: { kind: "raw", path: join(r2, "b.raw"), read_only: false }, mountPoint: join(r2, "mnt") });
      expect(fuseMounted(join(r2, "mnt"))).toBe(true);
      const pid = s2.pid;
      await s2.close();
      expect(alive(pid)).toBe(false);
      expect(fuseMounted(join(r2, "mnt"))).toBe(false);
      expect(fuseMounted(join(s2.dir, "pool"))).toBe(false);
      // nothing of the pool's or the shared export's mount points is left
      expect(readdirSync(join(s2.dir, "pool"))).toEqual([]);
      expect(readdirSync(join(s2.dir, "shared"))).toEqual(["kept"]);
      expect(existsSync(daemonPaths(s2.dir).socket)).toBe(false);
      expect(await code(s2.list())).toBe("disk.daemon_unavailable");
      await d.close(); // after the daemon: only local clean-up, no error
    } finally {
      await stopService(s2, r2);
    }
  });
});
