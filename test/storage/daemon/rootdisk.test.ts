// Integration: a template of two overlaybd layers (made by src/storage/overlaybd importRaw) served
// to ten sandboxes at once by the one disk daemon over real FUSE mounts.
// Asserts: every sandbox reads the template byte-exactly, writes land only in that sandbox's
// upper, the layer files are opened O_RDONLY by the daemon and stay byte-identical.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, readlinkSync, readSync, rmSync, writeSync } from "node:fs";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { openStack } from "../../../src/storage/overlaybd/index.ts";
import { upperPaths, type DiskExport, type DiskService } from "../../../src/storage/daemon/index.ts";
import { startService, stopService } from "./fixtures/service.ts";
import { twoLayerTemplate } from "./fixtures/template.ts";

const MiB = 1 << 20;
const SIZE = 8 * MiB;
let root: string;
let svc: DiskService;
let lowers: string[];
let expected: Uint8Array;
const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

beforeAll(async () => {
  root = mkdtempSync("/tmp/aenv-rootdisk-test-");
  ({ lowers, expected } = await twoLayerTemplate(root, "template", SIZE));
  svc = await startService(root);
}, 60_000);

afterAll(async () => {
  await stopService(svc, root);
  rmSync(root, { recursive: true, force: true });
});

/** open(2) access mode of every fd of `pid` that points at `path` (0 = O_RDONLY). */
function accessModes(pid: number, path: string): number[] {
  const modes: number[] = [];
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    let target = "";
    try {
      target = readlinkSync(`/proc/${pid}/fd/${fd}`);
    } catch {
      continue;
    }
    if (target !== path) continue;
    const flags = /flags:\s+([0-7]+)/.exec(readFileSync(`/proc/${pid}/fdinfo/${fd}`, "utf8"))![1]!;
    modes.push(parseInt(flags, 8) & 3);
  }
  return modes;
}

describe("root disks: template layers + per-sandbox upper over FUSE", () => {
  test("ten sandboxes share the template layers read-only; writes stay in each sandbox's upper", async () => {
    const before = lowers.map((l) => sha(readFileSync(l)));
    const disks: DiskExport[] = [];
    try {
      for (let i = 0; i < 10; i++) {
        disks.push(await svc.rootDisk({ id: `sb${i}`, lowers, sandboxDir: join(root, `sb${i}`) }));
      }
      for (const [i, d] of disks.entries()) expect(d.path).toBe(join(root, `sb${i}`, "mnt", "root.img"));
      // the first came from the warm pool (prefilled at start), all are served by the one daemon
      expect(disks[0]!.fromPool).toBe(true);
      expect((await svc.list()).map((x) => x.dev_id).sort()).toEqual(disks.map((d) => d.id).sort());
      // both template layers are open once per sandbox disk, and only for reading
      for (const l of lowers) {
        const modes = accessModes(svc.pid, l);
        expect(modes.length).toBe(10);
        expect(modes.every((m) => m === 0)).toBe(true);
      }
      // every sandbox sees the merged template byte-exactly
      for (const d of disks) expect(sha(readFileSync(d.path))).toBe(sha(expected));
      // each sandbox writes its own marker into the shared region and into the hole
      for (const [i, d] of disks.entries()) {
        const fd = openSync(d.path, "r+");
        try {
          writeSync(fd, Buffer.from(`sandbox-${i}`.padEnd(4096, "!")), 0, 4096, 3 * MiB + i * 4096);
          writeSync(fd, Buffer.from(`hole-${i}`), 0, `hole-${i}`.length, 5 * MiB + 17);
        } finally {
          closeSync(fd);
        }
      }
      for (const [i, d] of disks.entries()) {
        const got = readFileSync(d.path);
        for (let j = 0; j < 10; j++) {
          const block = got.subarray(3 * MiB + j * 4096, 3 * MiB + (j + 1) * 4096);
          if (j === i) expect(block.toString().startsWith(`sandbox-${i}!`)).toBe(true);
          else expect(block.every((b) => b === 0x5a)).toBe(true); // others' writes are invisible
        }
        expect(got.subarray(5 * MiB + 17, 5 * MiB + 17 + `hole-${i}`.length).toString()).toBe(`hole-${i}`);
      }
    } finally {
      for (const d of disks) await d.close();
    }
    // template layers unchanged; each upper is its own pair of files holding its own writes
    expect(lowers.map((l) => sha(readFileSync(l)))).toEqual(before);
    const uppers = new Set<string>();
    for (let i = 0; i < 10; i++) {
      const u = upperPaths(join(root, `sb${i}`));
      uppers.add(u.data);
      const img = await openStack({ lowers, upper: u });
      try {
        const buf = new Uint8Array(4096);
        await img.pread(buf, 3 * MiB + i * 4096);
        expect(Buffer.from(buf).toString().startsWith(`sandbox-${i}!`)).toBe(true);
        await img.pread(buf, 3 * MiB + ((i + 1) % 10) * 4096);
        expect(buf.every((b) => b === 0x5a)).toBe(true);
      } finally {
        await img.close();
      }
    }
    expect(uppers.size).toBe(10);
  }, 120_000);

  test("a restarted sandbox keeps its upper; a new sandbox starts fresh", async () => {
    const again = await svc.rootDisk({ id: "sb3", lowers, sandboxDir: join(root, "sb3") });
    const fresh = await svc.rootDisk({ id: "sbnew", lowers, sandboxDir: join(root, "sbnew") });
    try {
      const fd = openSync(again.path, "r");
      const buf = Buffer.alloc(16);
      readSync(fd, buf, 0, 16, 3 * MiB + 3 * 4096);
      closeSync(fd);
      expect(buf.toString()).toBe("sandbox-3!!!!!!!");
      expect(sha(readFileSync(fresh.path))).toBe(sha(expected));
    } finally {
      await again.close();
      await fresh.close();
    }
  }, 60_000);

  test("concurrent unaligned O_DIRECT writes from 6 processes into shared sectors: each range ends with its writer's last pattern", async () => {
    const d = await svc.rootDisk({ id: "sbrace", lowers, sandboxDir: join(root, "sbrace") });
    try {
      // writer k owns bytes [base + k*100, base + k*100 + 100) of the same two sectors and rewrites them
      // 150 times with its own changing pattern; each WRITE is a read-modify-write in the image
      const base = 2 * MiB + 37;
      const script = `
        const fs = require("node:fs");
        const [path, k, base] = process.argv.slice(1).map((v, i) => (i === 0 ? v : Number(v)));
        const fd = fs.openSync(path, fs.constants.O_RDWR | 0o40000);
        for (let r = 0; r < 150; r++) fs.writeSync(fd, Buffer.alloc(100, (k * 40 + r) & 255), 0, 100, base + k * 100);
        fs.closeSync(fd);`;
      const procs = Array.from({ length: 6 }, (_, k) => Bun.spawn([process.execPath, "-e", script, d.path, String(k), String(base)], { stderr: "inherit" }));
      expect(await Promise.all(procs.map((p) => p.exited))).toEqual([0, 0, 0, 0, 0, 0]);
      const got = readFileSync(d.path);
      for (let k = 0; k < 6; k++) {
        const want = (k * 40 + 149) & 255;
        expect(got.subarray(base + k * 100, base + k * 100 + 100).every((b) => b === want)).toBe(true);
      }
      // bytes around the written span keep the template's content
      expect(got.subarray(base - 37, base).equals(Buffer.from(expected.subarray(base - 37, base)))).toBe(true);
      expect(got.subarray(base + 600, base + 700).equals(Buffer.from(expected.subarray(base + 600, base + 700)))).toBe(true);
    } finally {
      await d.close();
    }
  }, 60_000);

  test("a virtual size above the template's grows the disk: the template, then zeros, writable to the end", async () => {
    const d = await svc.rootDisk({ id: "sbbig", lowers, sandboxDir: join(root, "sbbig"), virtualSize: SIZE + 4 * MiB });
    try {
      const got = readFileSync(d.path);
      expect(got.length).toBe(SIZE + 4 * MiB);
      expect(sha(got.subarray(0, SIZE))).toBe(sha(expected));
      expect(got.subarray(SIZE).every((b) => b === 0)).toBe(true);
      const fd = openSync(d.path, "r+");
      try {
        expect(writeSync(fd, Buffer.from("end"), 0, 3, SIZE + 4 * MiB - 3)).toBe(3);
      } finally {
        closeSync(fd);
      }
      expect(readFileSync(d.path).subarray(SIZE + 4 * MiB - 3).toString()).toBe("end");
    } finally {
      await d.close();
    }
  }, 60_000);

  test("bad input: no lowers, relative paths, unaligned size, missing layer", async () => {
    const base = { id: "bad", sandboxDir: join(root, "bad") };
    const cases: [Record<string, unknown>, string][] = [
      [{ lowers: [] }, "disk.bad_spec"],
      [{ lowers: ["rel/layer"] }, "disk.bad_spec"],
      [{ lowers, sandboxDir: "rel" }, "disk.bad_spec"],
      [{ lowers, virtualSize: 1000 }, "disk.bad_spec"],
      [{ lowers: [join(root, "nope.layer")] }, "disk.open_failed"],
    ];
    for (const [patch, code] of cases) {
      let err: any;
      try {
        await svc.rootDisk({ ...base, lowers, ...patch } as any);
      } catch (e) {
        err = e;
      }
      expect(err?.code).toBe(code);
    }
    expect(existsSync(join(root, "bad", "mnt"))).toBe(false);
  }, 60_000);
});
