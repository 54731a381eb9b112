// Integration: a node adopts the disk daemon a killed node left (issue 27), against the real
// `agentenv ublk-daemon` over real FUSE mounts (root: FUSE). A stand-in node
// (fixtures/adopt-node.ts) makes root disks, a raw export and a shared device, writes a pattern
// into one disk and is SIGKILLed; the daemon lives on. A service started in adopt mode keeps that
// daemon, re-claims the disk (the same bytes read through the same path), one reference of the
// shared device, reaps what nobody claimed, and survives a crash of the adopted daemon (it took
// over the FUSE connection copies). When the daemon died too while no node watched, a new one
// starts and the disk is reported lost, its upper files (the sandbox's bytes) still on disk.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, fsyncSync, mkdirSync, mkdtempSync, openSync, readSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import { DISK_PROTOCOL_VERSION, diskConfig, DiskService, sharedDeviceId, upperPaths, type DiskClaim, type DiskExport } from "../../../src/storage/daemon/index.ts";
import { openStack } from "../../../src/storage/overlaybd/index.ts";
import { alive, exited } from "../../helpers/proc.ts";
import { fuseMounted, stopService } from "./fixtures/service.ts";
import { twoLayerTemplate } from "./fixtures/template.ts";
import { waitFor } from "../../helpers/wait.ts";

const MiB = 1 << 20;
const PATTERN = new Uint8Array(64 * 1024).map((_, i) => (i * 7 + 3) & 0xff);
let root: string;
let lowers: string[];
const services: DiskService[] = [];
const pids: number[] = [];

beforeAll(async () => {
  root = mkdtempSync("/tmp/aenv-disk-adopt-");
  ({ lowers } = await twoLayerTemplate(root, "template", 8 * MiB));
}, 60_000);
afterAll(async () => {
  for (const s of services) await stopService(s, root);
  for (const p of pids) if (alive(p)) process.kill(p, "SIGKILL");
  rmSync(root, { recursive: true, force: true });
});

/** Run the stand-in node on `dir` (its own directory under root) until its first line; returns what it made. */
async function deadNode(dir: string): Promise<{ daemonPid: number; a: string; b: string; c: string; mem: string; mem_id: string }> {
  const node = Bun.spawn([process.execPath, join(import.meta.dir, "fixtures", "adopt-node.ts"), dir, JSON.stringify(lowers)], { stdout: "pipe", stderr: "inherit" });
  pids.push(node.pid);
  const reader = node.stdout.getReader();
  let text = "";
  while (!text.includes("\n")) {
    const r = await reader.read();
    if (r.done) throw new Error(`stand-in node ended: ${text}`);
    text += new TextDecoder().decode(r.value);
  }
  const made = JSON.parse(text);
  pids.push(made.daemonPid);
  node.kill("SIGKILL");
  await node.exited;
  return made;
}

function readAt(path: string, offset: number, len: number): Uint8Array {
  const fd = openSync(path, "r");
  try {
    const b = new Uint8Array(len);
    expect(readSync(fd, b, 0, len, offset)).toBe(len);
    return b;
  } finally {
    closeSync(fd);
  }
}

function claimed(c: DiskClaim): DiskExport {
  if (c.kind !== "claimed") throw new Error(`not claimed: ${JSON.stringify(c)}`);
  return c.disk;
}

async function adopt(dir: string): Promise<DiskService> {
  const svc = await DiskService.start({ dir: join(dir, "run"), config: { ...diskConfig(), readyTimeoutMs: 20_000 }, mode: "adopt" });
  services.push(svc);
  return svc;
}

describe("disk daemon adoption", () => {
  test("the node is killed: the next adopts its daemon, re-claims a disk with its bytes and a shared reference, reaps the rest, survives a daemon crash after", async () => {
    const dir = join(root, "n1");
    const made = await deadNode(dir);
    expect(alive(made.daemonPid)).toBe(true);
    const svc = await adopt(dir);
    expect([svc.adopted, svc.pid]).toEqual([true, made.daemonPid]);
    expect((await svc.list()).map((d) => d.dev_id).sort()).toEqual(["a", "b", "c", sharedDeviceId("mem")]);

    const a = claimed(await svc.claim("a"));
    expect([a.id, a.path, a.engine, a.access]).toEqual(["a", made.a, "fuse", "exclusive"]);
    expect(readAt(a.path, MiB, PATTERN.length)).toEqual(PATTERN);
    const m = claimed(await svc.claim(sharedDeviceId("mem")));
    expect([m.id, m.path, m.access]).toEqual([made.mem_id, made.mem, "shared"]);
    expect(await svc.claim("nope")).toEqual({ kind: "missing" });

    // what nobody claimed goes: "b" and "c" whole, the second reference of the shared device
    expect((await svc.reapUnclaimed()).sort()).toEqual(["b", "c", sharedDeviceId("mem")]);
    const left = await svc.list();
    expect(left.map((d) => [d.dev_id, d.refcount]).sort()).toEqual([["a", 1], [sharedDeviceId("mem"), 1]]);
    expect(fuseMounted(join(dir, "sb-b", "mnt"))).toBe(false);
    expect(await svc.claim("b")).toEqual({ kind: "missing" });

    // the adopted daemon dies: the service starts it again, and the claimed disk is served again
    // from this node's copy of its connection
    process.kill(made.daemonPid, "SIGKILL");
    let lostReason: string | undefined;
    void a.lost.then((r) => (lostReason = r));
    await waitFor("the daemon to be started again", () => svc.restarts > 0);
    expect(svc.restarts).toBe(1);
    expect(svc.pid).not.toBe(made.daemonPid);
    expect(readAt(a.path, MiB, PATTERN.length)).toEqual(PATTERN);
    expect((await svc.stats("a")).image_opens).toBe(1);
    expect(lostReason).toBeUndefined();
    await a.close();
    await m.close();
    expect(await svc.list()).toEqual([]);
  }, 120_000);

  test("node and daemon both killed: a new daemon starts; the disk is reported lost, its bytes still in the sandbox's upper", async () => {
    const dir = join(root, "n2");
    const made = await deadNode(dir);
    process.kill(made.daemonPid, "SIGKILL");
    await waitFor("the old daemon to exit", () => exited(made.daemonPid));
    const svc = await adopt(dir);
    expect(svc.adopted).toBe(false);
    expect(svc.pid).not.toBe(made.daemonPid);
    const r = await svc.claim("a");
    expect(r.kind).toBe("lost");
    expect((r as { reason: string }).reason).toContain("no live holder");
    expect(await svc.list()).toEqual([]);
    expect(await svc.reapUnclaimed()).toEqual([]);
    // the sandbox's writes are in its upper: a paused sandbox made of it loses no byte
    const img = await openStack({ lowers, upper: upperPaths(join(dir, "sb-a")) });
    try {
      const b = new Uint8Array(PATTERN.length);
      expect(await img.pread(b, MiB)).toBe(b.length);
      expect(b).toEqual(PATTERN);
    } finally {
      await img.close();
    }
  }, 120_000);

  test("claim outside adopt mode is refused; a fresh-mode start shuts a left daemon down as before", async () => {
    const dir = join(root, "n3");
    const made = await deadNode(dir);
    const svc = await DiskService.start({ dir: join(dir, "run"), config: { ...diskConfig(), readyTimeoutMs: 20_000 } });
    services.push(svc);
    expect(svc.adopted).toBe(false);
    expect(exited(made.daemonPid)).toBe(true);
    expect(await svc.list()).toEqual([]);
    await expect(svc.claim("a")).rejects.toMatchObject({ code: "disk.bad_request" });
  }, 120_000);

  test("detach (the upgrade path): the daemon and its devices stay for the next service, which claims the disk with its bytes", async () => {
    const dir = join(root, "n4");
    const first = await DiskService.start({ dir: join(dir, "run"), config: { ...diskConfig(), readyTimeoutMs: 20_000 } });
    const d = await first.rootDisk({ id: "d", lowers, sandboxDir: join(dir, "sb-d") });
    const fd = openSync(d.path, "r+");
    writeSync(fd, PATTERN, 0, PATTERN.length, 2 * MiB);
    fsyncSync(fd);
    closeSync(fd);
    const pid = first.pid;
    first.detach();
    await expect(first.list()).rejects.toMatchObject({ code: "disk.daemon_unavailable" });
    expect(alive(pid)).toBe(true);
    const next = await adopt(dir);
    expect([next.adopted, next.pid]).toEqual([true, pid]);
    const again = claimed(await next.claim("d"));
    expect(again.path).toBe(d.path);
    expect(readAt(again.path, 2 * MiB, PATTERN.length)).toEqual(PATTERN);
    await again.close();
    expect(await next.reapUnclaimed()).toEqual([]);
  }, 120_000);

  test("a daemon of another protocol version (an earlier release) is not adopted: it is shut down and a new one starts", async () => {
    const dir = join(root, "n5", "run");
    mkdirSync(dir, { recursive: true });
    const old = Bun.spawn([process.execPath, join(import.meta.dir, "fixtures", "old-daemon.ts"), "ublk-daemon", "--dir", dir], { stdout: "pipe", stderr: "inherit" });
    pids.push(old.pid);
    await old.stdout.getReader().read();
    const svc = await DiskService.start({ dir, config: { ...diskConfig(), readyTimeoutMs: 20_000 }, mode: "adopt" });
    services.push(svc);
    expect(await old.exited).toBe(0); // it got the shutdown request
    expect(svc.adopted).toBe(false);
    expect(svc.pid).not.toBe(old.pid);
    expect((await svc.features()).protocol).toBe(DISK_PROTOCOL_VERSION);
  }, 60_000);
});
