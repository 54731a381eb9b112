/**
 * Volumes without VMs, over the real node (API, orchestrator, SQLite) and the real volume disks:
 * POST/GET/DELETE /volumes, and the content API driven by the unmodified e2b SDK's `Volume`
 * object while no sandbox holds the volume (the node mounts its ext4 through a FUSE export and a
 * loop device), beside read-only holders, and refused while a writer that is not running holds
 * it. Holders are loopback sandboxes made by the orchestrator's create (createLoopback). Needs
 * root, /dev/fuse and loop devices.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Volume, VolumePathNotFoundError } from "e2b";
import { listMounts } from "../../src/ffi/mount.ts";
import { api, createLoopback, startNodeNoVm, type TestNode } from "./helpers.ts";
import { waitFor } from "../helpers/wait.ts";

let node: TestNode;

beforeAll(async () => {
  node = await startNodeNoVm({ AENV__volumes__size_mib: "64" }, undefined, {});
  process.env.E2B_API_URL = node.url;
  process.env.E2B_VOLUME_API_URL = node.url;
  process.env.E2B_API_KEY = node.apiKey;
});
afterAll(async () => {
  await node.dispose();
});

async function json(res: Response): Promise<{ status: number; body: any }> {
  return { status: res.status, body: res.status === 204 ? null : await res.json() };
}
const mountsUnder = (dir: string) => listMounts().filter((m) => m.mountPoint.startsWith(dir));

test("POST/GET/DELETE /volumes: E2B shapes, DNS-label names, 404 and 409 with the E2B body", async () => {
  for (const name of ["", "Data", "-a", "a-", "a_b", "a.b", "x".repeat(64)]) {
    const r = await json(await api(node, "/volumes", { method: "POST", body: JSON.stringify({ name }) }));
    expect([name, r.status, r.body.code]).toEqual([name, 400, 400]);
  }
  const created = await json(await api(node, "/volumes", { method: "POST", body: JSON.stringify({ name: "vol-a" }) }));
  expect(created.status).toBe(201);
  expect(Object.keys(created.body).sort()).toEqual(["name", "token", "volumeID"]);
  expect(created.body.volumeID).toMatch(/^[a-z0-9]{20}$/);
  expect(created.body.token).toMatch(/^[0-9a-f]{64}$/);
  // the disk: an overlaybd layer holding an empty ext4 and an upper
  expect(existsSync(join(node.home, "volumes", created.body.volumeID, "base.layer"))).toBe(true);
  expect(existsSync(join(node.home, "volumes", created.body.volumeID, "upper", "upper.data"))).toBe(true);
  const dup = await json(await api(node, "/volumes", { method: "POST", body: JSON.stringify({ name: "vol-a" }) }));
  expect(dup.status).toBe(409);
  expect((await json(await api(node, "/volumes"))).body).toEqual([{ volumeID: created.body.volumeID, name: "vol-a" }]);
  expect((await json(await api(node, `/volumes/${created.body.volumeID}`))).body).toEqual(created.body);
  const unknown = await json(await api(node, "/volumes/nosuchvolume"));
  expect(unknown.status).toBe(404);
  expect(unknown.body).toMatchObject({ code: 404, error_code: "orchestrator.volume_not_found" });
  expect((await api(node, "/volumes", { key: null })).status).toBe(401);
  expect((await json(await api(node, `/volumes/${created.body.volumeID}`, { method: "DELETE" }))).status).toBe(204);
  expect(existsSync(join(node.home, "volumes", created.body.volumeID))).toBe(false);
  expect((await json(await api(node, `/volumes/${created.body.volumeID}`, { method: "DELETE" }))).status).toBe(404);
  expect((await json(await api(node, `/volumes/${created.body.volumeID}`))).status).toBe(404);
});

test("the SDK's Volume content API on a volume no sandbox holds (host mount, closed when idle)", async () => {
  const vol = await Volume.create("vol-b");
  expect(vol.name).toBe("vol-b");
  const again = await Volume.connect(vol.volumeId);
  expect(again.token).toBe(vol.token);

  const dir = await vol.makeDir("/data");
  expect(dir).toMatchObject({ name: "data", path: "/data", type: "directory", uid: 1000, gid: 1000, mode: 0o755 });
  const info = await vol.writeFile("/data/hello.txt", "hello from the SDK");
  expect(info).toMatchObject({ name: "hello.txt", type: "file", size: 18, uid: 1000, mode: 0o644 });
  expect(info.mtime).toBeInstanceOf(Date);
  expect(await vol.readFile("/data/hello.txt")).toBe("hello from the SDK");
  // 6 MiB, streamed both ways, byte-exact
  const big = new Uint8Array(6 << 20);
  for (let i = 0; i < big.length; i++) big[i] = (i * 2654435761) >>> 24;
  await vol.writeFile("/data/big.bin", big.buffer as ArrayBuffer);
  const back = await vol.readFile("/data/big.bin", { format: "bytes" });
  expect(back.length).toBe(big.length);
  expect(Buffer.compare(Buffer.from(back), Buffer.from(big))).toBe(0);

  expect(await vol.exists("/data/hello.txt")).toBe(true);
  expect(await vol.exists("/data/nope")).toBe(false);
  expect((await vol.list("/")).map((e) => [e.path, e.type])).toEqual([
    ["/data", "directory"],
    ["/lost+found", "directory"],
  ]);
  expect((await vol.list("/", { depth: 2 })).map((e) => e.path)).toEqual(["/data", "/data/big.bin", "/data/hello.txt", "/lost+found"]);
  expect(await vol.updateMetadata("/data/hello.txt", { mode: 0o600, uid: 0, gid: 0 })).toMatchObject({ mode: 0o600, uid: 0, gid: 0 });
  expect((await vol.getInfo("/data/hello.txt")).mode).toBe(0o600);
  expect((await vol.makeDir("/a/b/c", { force: true })).path).toBe("/a/b/c");
  await vol.remove("/a");
  expect(await vol.exists("/a/b")).toBe(false);
  await expect(vol.readFile("/data/nope")).rejects.toBeInstanceOf(VolumePathNotFoundError);
  await expect(vol.getInfo("/nope")).rejects.toBeInstanceOf(VolumePathNotFoundError);

  // bad input: wrong token, escaping path, bad depth
  const stranger = new Volume(vol.volumeId, vol.name, "0".repeat(64), vol.domain);
  await expect(stranger.list("/")).rejects.toThrow(/401|token/);
  const esc = await fetch(`${node.url}/volumecontent/${vol.volumeId}/path?path=${encodeURIComponent("/data/../../etc")}`, { headers: { authorization: `Bearer ${vol.token}` } });
  expect(esc.status).toBe(400);
  const deep = await fetch(`${node.url}/volumecontent/${vol.volumeId}/dir?path=/&depth=0`, { headers: { authorization: `Bearer ${vol.token}` } });
  expect(deep.status).toBe(400);
  const other = await fetch(`${node.url}/volumecontent/nosuchvolume/dir?path=/`, { headers: { authorization: `Bearer ${vol.token}` } });
  expect(other.status).toBe(404);

  // the node's mount is closed once idle (200 ms in these tests), and the data is on the volume's disk
  const hostDir = join(node.home, "run", "volumes", vol.volumeId);
  await waitFor("the idle volume mount to close", () => mountsUnder(hostDir).length === 0, { timeoutMs: 5000 });
  expect(await vol.readFile("/data/hello.txt")).toBe("hello from the SDK");
  expect(readFileSync(join(node.home, "volumes", vol.volumeId, "upper", "upper.data")).length).toBeGreaterThan(6 << 20);
});

test("holders: delete in use is 409; a paused writer blocks content access; read-only holders allow reads only", async () => {
  const vol = await Volume.create("vol-c");
  await vol.writeFile("/note.txt", "shared note");
  const mount = { name: "vol-c", path: "/mnt/c" };

  const holdw1 = (await createLoopback(node, { volumeMounts: [{ ...mount, readOnly: false }] })).id;
  await node.orch.pause(holdw1);
  const del = await json(await api(node, `/volumes/${vol.volumeId}`, { method: "DELETE" }));
  expect(del.status).toBe(409);
  expect(del.body).toMatchObject({ code: 409, error_code: "orchestrator.volume_in_use", message: expect.stringContaining(holdw1) });
  await expect(vol.readFile("/note.txt")).rejects.toThrow(/409|paused/);
  // a second writer or a reader cannot join a writer
  for (const readOnly of [false, true]) {
    const r = await json(await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", volumeMounts: [{ name: "vol-c", path: "/mnt/c", readOnly }] }) }));
    expect([readOnly, r.status, r.body.error_code]).toEqual([readOnly, 409, "orchestrator.volume_in_use"]);
  }
  await node.orch.kill(holdw1);

  const holdr1 = (await createLoopback(node, { volumeMounts: [{ ...mount, readOnly: true }] })).id;
  const holdr2 = (await createLoopback(node, { volumeMounts: [{ ...mount, readOnly: true }] })).id;
  expect(await vol.readFile("/note.txt")).toBe("shared note");
  expect((await vol.list("/")).map((e) => e.name)).toContain("note.txt");
  await expect(vol.writeFile("/note.txt", "changed")).rejects.toThrow(/409|read-only/);
  await expect(vol.remove("/note.txt")).rejects.toThrow(/409|read-only/);
  const w = await json(await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", volumeMounts: [{ name: "vol-c", path: "/mnt/c" }] }) }));
  expect(w.status).toBe(409);
  expect(w.body.message).toContain("read-only");
  expect((await json(await api(node, `/volumes/${vol.volumeId}`, { method: "DELETE" }))).status).toBe(409);
  await node.orch.kill(holdr1);
  await node.orch.kill(holdr2);

  // free again: writable through the node, deletable
  await vol.writeFile("/note.txt", "changed");
  expect(await vol.readFile("/note.txt")).toBe("changed");
  expect(await Volume.destroy(vol.volumeId)).toBe(true);
  expect(await Volume.destroy(vol.volumeId)).toBe(false);
});

test("volumeMounts on create: unknown names, bad or shadowing paths are a 400 naming the problem", async () => {
  await Volume.create("vol-d");
  const create = async (volumeMounts: unknown) => json(await api(node, "/v2/sandboxes", { method: "POST", body: JSON.stringify({ templateID: "base", volumeMounts }) }));
  const cases: [unknown, string][] = [
    [[{ name: "vol-d", path: "data" }], 'volumeMounts[0].path "data" must be an absolute path'],
    [[{ name: "vol-d", path: "/" }], 'volumeMounts[0].path "/" may not be / (it would shadow the whole guest filesystem)'],
    [[{ name: "vol-d", path: "/proc" }], 'volumeMounts[0].path "/proc" may not be /proc or below it (it would shadow the guest\'s /proc)'],
    [[{ name: "vol-d", path: "/sys/fs/x" }], 'volumeMounts[0].path "/sys/fs/x" may not be /sys or below it (it would shadow the guest\'s /sys)'],
    [[{ name: "vol-d", path: "/dev" }], 'volumeMounts[0].path "/dev" may not be /dev or below it (it would shadow the guest\'s /dev)'],
    [[{ name: "vol-d", path: "/a/../b" }], 'volumeMounts[0].path "/a/../b" must be canonical (no empty, . or .. segments, no trailing /)'],
    [[{ name: "nosuch", path: "/data" }], 'volumeMounts[0].name: no volume named "nosuch"'],
    [[{ name: "vol-d", path: "/data" }, { name: "vol-d", path: "/data2" }], "volumeMounts[1]: volume vol-d is mounted twice"],
  ];
  for (const [mounts, message] of cases) {
    const r = await create(mounts);
    expect({ status: r.status, body: r.body }).toEqual({ status: 400, body: { code: 400, message, error_code: "orchestrator.bad_request" } });
  }
  expect((await create([{ name: "vol-d" }])).status).toBe(400);
  // nothing was created or left holding the volume
  expect(node.orch.volumes.holders((await Volume.list()).find((v) => v.name === "vol-d")!.volumeId)).toEqual([]);
});
