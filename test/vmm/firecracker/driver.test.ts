// The Firecracker driver against a stand-in `firecracker` (fake-firecracker.ts) that serves the
// API on the driver's Unix socket and validates every body against
// ../shared/contracts/firecracker-api.yaml. Real parts: process spawn, nsenter into a real
// network namespace (ip netns), HTTP over the Unix socket, VMM records, signals.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { VmmError, type VmmErrorCode } from "../../../src/vmm/errors.ts";
import { ConfigError } from "../../../src/config/index.ts";
import { DIRTY_MEM_FILE, FirecrackerApi, FirecrackerDriver, createFirecrackerDriver, bootRequests, firecrackerConfig, pageRanges, validateSpec, type FirecrackerConfig } from "../../../src/vmm/firecracker/index.ts";
import type { MemoryCapture, VmSpec } from "../../../src/vmm/types.ts";
import { writeMemoryLayer } from "../../../src/snapshot/index.ts";
import { openStack } from "../../../src/storage/overlaybd/index.ts";

let root: string;
let runtimeDir: string;
let cfg: FirecrackerConfig;
let kernel: string;
const netnsName = `aenv-fctest-${process.pid}`;

beforeAll(() => {
  root = mkdtempSync("/tmp/aenv-fc-test-");
  runtimeDir = join(root, "run");
  const fake = join(root, "firecracker");
  writeFileSync(fake, `#!/bin/sh\nexec "${process.execPath}" "${join(import.meta.dir, "fake-firecracker.ts")}" "$@"\n`);
  chmodSync(fake, 0o755);
  cfg = { ...firecrackerConfig(), binary: fake, socketTimeoutMs: 20000, stopTimeoutMs: 3000 };
  kernel = join(root, "vmlinux");
  writeFileSync(kernel, "not really a kernel");
});
afterAll(() => {
  Bun.spawnSync(["ip", "netns", "delete", netnsName]);
  rmSync(root, { recursive: true, force: true });
});

function makeSpec(id: string, extra: Partial<VmSpec> = {}): VmSpec {
  const workDir = join(root, id);
  mkdirSync(workDir, { recursive: true });
  const rootfs = join(workDir, "root.img");
  const data = join(workDir, "data.img");
  writeFileSync(rootfs, new Uint8Array(4096));
  writeFileSync(data, new Uint8Array(4096));
  return {
    id, workDir, kernelPath: kernel, bootArgs: "init=/sbin/aenv-init", vcpus: 2, memoryMiB: 256,
    drives: [
      { id: "data", path: data, readOnly: true, isRoot: false },
      { id: "rootfs", path: rootfs, readOnly: false, isRoot: true },
    ],
    ...extra,
  };
}

interface Logged { method: string; path: string; status: number; body?: any; fault?: string; state: string }
function requests(spec: VmSpec): Logged[] {
  const f = join(spec.workDir, "firecracker.sock.requests.jsonl");
  if (!existsSync(f)) return [];
  return readFileSync(f, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l));
}
const seq = (l: Logged[]) => l.map((r) => `${r.method} ${r.path} ${r.status}`);

async function expectVmmError(p: Promise<unknown> | (() => unknown), code: VmmErrorCode): Promise<VmmError> {
  let err: unknown;
  try {
    await (typeof p === "function" ? p() : p);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(VmmError);
  expect((err as VmmError).code).toBe(code);
  return err as VmmError;
}

describe("request building", () => {
  test("boot args: config base, ip= for the NIC, then the spec's args", () => {
    const spec = makeSpec("args", {
      net: { netnsPath: "/var/run/netns/x", tapName: "tap0", mac: "02:00:00:00:00:01", guestIp: "169.254.0.1", gatewayIp: "169.254.0.2", prefixLen: 30 },
    });
    const boot = bootRequests(spec, cfg).find((r) => r.path === "/boot-source")!;
    expect((boot.body as any).boot_args).toBe(`${cfg.bootArgs} ip=169.254.0.1::169.254.0.2:255.255.255.252::eth0:off init=/sbin/aenv-init`);
  });

  const bad: [string, Partial<VmSpec>, string][] = [
    ["id with underscore", { id: "bad_id" }, "id"],
    ["id longer than 64", { id: "a".repeat(65) }, "id"],
    ["zero vcpus", { vcpus: 0 }, "vcpus"],
    ["33 vcpus", { vcpus: 33 }, "vcpus"],
    ["fractional memory", { memoryMiB: 1.5 }, "memoryMiB"],
    ["relative kernel path", { kernelPath: "vmlinux" }, "kernelPath"],
    ["two root drives", { drives: [{ id: "a", path: "/a", readOnly: false, isRoot: true }, { id: "b", path: "/b", readOnly: false, isRoot: true }] }, "drives"],
    ["duplicate drive id", { drives: [{ id: "a", path: "/a", readOnly: false, isRoot: true }, { id: "a", path: "/b", readOnly: true, isRoot: false }] }, "drives.id"],
    ["relative drive path", { drives: [{ id: "a", path: "a.img", readOnly: false, isRoot: true }] }, "drives.path"],
    ["metadata without a NIC", { metadata: { a: 1 } }, "metadata"],
  ];
  for (const [name, patch, field] of bad) {
    test(`rejects ${name}`, async () => {
      const spec = { ...makeSpec("bad"), ...patch };
      const e = await expectVmmError(() => validateSpec(spec), "vmm.bad_spec");
      expect(e.details.field).toBe(field);
    });
  }
  test("rejects a bad MAC", async () => {
    const spec = makeSpec("badmac", { net: { netnsPath: "/x", tapName: "t", mac: "02:00:00:00:00", guestIp: "169.254.0.1", gatewayIp: "169.254.0.2", prefixLen: 30 } });
    await expectVmmError(() => validateSpec(spec), "vmm.bad_spec");
  });
});

describe("Firecracker driver against the schema-validating stand-in", () => {
  test("boot, pause, snapshot (full and diff), resume, stop: exact request sequence, every body valid", async () => {
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const spec = makeSpec("vm-a");
    const vm = await driver.boot(spec);
    const rec = JSON.parse(readFileSync(join(runtimeDir, "vmm", "vm-a.json"), "utf8"));
    expect(rec.pid).toBe(vm.pid);
    expect(rec.driver).toBe("firecracker");
    expect(vm.consolePath).toBe(join(spec.workDir, "firecracker.log"));
    const start = JSON.parse(readFileSync(join(spec.workDir, "firecracker.sock.start.json"), "utf8"));
    expect(start.argv).toEqual(["--api-sock", join(spec.workDir, "firecracker.sock"), "--id", "vm-a"]);

    await vm.pause();
    await vm.snapshot({ statePath: join(spec.workDir, "full.state"), memPath: join(spec.workDir, "full.mem"), kind: "full" });
    await vm.snapshot({ statePath: join(spec.workDir, "diff.state"), memPath: join(spec.workDir, "diff.mem"), kind: "diff" });
    await vm.resume();
    const log = requests(spec);
    expect(seq(log)).toEqual([
      "GET / 200",
      "PUT /machine-config 204",
      "PUT /boot-source 204",
      "PUT /drives/rootfs 204",
      "PUT /drives/data 204",
      "PUT /entropy 204",
      "PUT /actions 204",
      "PATCH /vm 204",
      "PUT /snapshot/create 204",
      "PUT /snapshot/create 204",
      "PATCH /vm 204",
    ]);
    log.shift(); // GET / readiness probe
    expect(log[0]!.body).toEqual({ vcpu_count: 2, mem_size_mib: 256, smt: false, track_dirty_pages: true });
    expect(log[1]!.body).toEqual({ kernel_image_path: kernel, boot_args: `${cfg.bootArgs} init=/sbin/aenv-init` });
    expect(log[2]!.body).toEqual({
      drive_id: "rootfs", path_on_host: join(spec.workDir, "root.img"), is_root_device: true, is_read_only: false,
      cache_type: "Writeback", io_engine: "Sync",
    });
    expect(log[3]!.body.is_read_only).toBe(true);
    expect(log[4]!.body).toEqual({});
    expect(log[5]!.body).toEqual({ action_type: "InstanceStart" });
    expect(log[6]!.body).toEqual({ state: "Paused" });
    expect(log[7]!.body).toEqual({ snapshot_type: "Full", snapshot_path: join(spec.workDir, "full.state"), mem_file_path: join(spec.workDir, "full.mem") });
    expect(log[8]!.body.snapshot_type).toBe("Diff");
    expect(log[9]!.body).toEqual({ state: "Resumed" });
    expect(statSync(join(spec.workDir, "full.mem")).size).toBe(256 * 1024 * 1024);

    await vm.stop();
    expect(await vm.exited).toBe(0);
    expect(existsSync(join(spec.workDir, "firecracker.sock"))).toBe(false);
    expect(existsSync(join(runtimeDir, "vmm", "vm-a.json"))).toBe(false);
    await vm.stop(); // idempotent
  }, 60_000);

  test("driveResized: PATCH /drives/{id} with the drive's own path, running or paused; refused once stopped", async () => {
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const spec = makeSpec("vm-resize");
    const vm = await driver.boot(spec);
    const root = spec.drives.find((d) => d.id === "rootfs")!;
    await vm.driveResized(root, 8 * 1024 * 1024);
    await vm.pause();
    await vm.driveResized(root, 8 * 1024 * 1024);
    const log = requests(spec);
    expect(seq(log).slice(-3)).toEqual(["PATCH /drives/rootfs 204", "PATCH /vm 204", "PATCH /drives/rootfs 204"]);
    expect(log.at(-1)!.body).toEqual({ drive_id: "rootfs", path_on_host: root.path });
    await vm.stop();
    await expectVmmError(vm.driveResized(root, 1), "vmm.bad_state");
  }, 60_000);

  test("restore from a File memory backend: paused unless resumed, then usable", async () => {
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const src = makeSpec("vm-src");
    const vm = await driver.boot(src);
    await vm.pause();
    const files = { statePath: join(src.workDir, "s.state"), memPath: join(src.workDir, "s.mem"), kind: "full" as const };
    await vm.snapshot(files);
    await vm.stop();

    const spec = makeSpec("vm-restored");
    const r = await driver.restore(spec, files, { resume: false });
    await expectVmmError(r.pause(), "vmm.bad_state"); // already paused
    await r.resume();
    await r.pause();
    const log = requests(spec);
    expect(seq(log)).toEqual(["GET / 200", "PUT /snapshot/load 204", "PATCH /vm 204", "PATCH /vm 204"]);
    log.shift();
    expect(log[0]!.body).toEqual({
      snapshot_path: files.statePath, mem_backend: { backend_type: "File", backend_path: files.memPath },
      track_dirty_pages: true, resume_vm: false,
    });
    expect(log[0]!.state).toBe("Paused");
    await r.stop();

    const spec2 = makeSpec("vm-restored2");
    const r2 = await driver.restore(spec2, files, { resume: true });
    expect(requests(spec2)[1]!.body.resume_vm).toBe(true);
    expect(requests(spec2)[1]!.state).toBe("Running");
    await r2.pause();
    await r2.stop();
  }, 60_000);

  test("captures: a booted VM's is a Full snapshot; a restored VM's are Diff snapshots merged into one sparse file, the pages changed since the load, layered over the parent image", async () => {
    const P = 4096;
    const MEM = 256 * 1024 * 1024;
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const guestWrites = (spec: VmSpec, w: [number, number][]) => writeFileSync(join(spec.workDir, "firecracker.sock.guest-writes.json"), JSON.stringify(w));
    const pageBytes = (cap: MemoryCapture, page: number) => {
      if (cap.kind !== "changed") throw new Error("not a changed-pages capture");
      const b = new Uint8Array(P);
      cap.read(b, page * P);
      return [b[0], b[P - 1]];
    };

    // booted: Full, the whole RAM (the parent image of what follows)
    const src = makeSpec("vm-cap-src");
    const booted = await driver.boot(src);
    guestWrites(src, [[1, 0x11], [2, 0x22]]);
    await booted.pause();
    const full = await booted.captureSnapshot(join(src.workDir, "s.state"));
    expect(full).toMatchObject({ kind: "file", path: join(src.workDir, "s.state.mem"), overParent: false });
    expect(requests(src).at(-1)!.body).toEqual({ snapshot_type: "Full", snapshot_path: join(src.workDir, "s.state"), mem_file_path: join(src.workDir, "s.state.mem") });
    expect(statSync(join(src.workDir, "s.state.mem")).size).toBe(MEM);
    const parent = join(root, "cap-parent.layer");
    await writeMemoryLayer({ kind: "file", path: join(src.workDir, "s.state.mem"), overParent: false }, parent, { size: MEM, parentLayers: [] });
    await booted.stop();

    // restored with tracking: Diff into <workDir>/firecracker.dirty.mem
    const spec = makeSpec("vm-cap");
    const vm = await driver.restore(spec, { statePath: join(src.workDir, "s.state"), memPath: join(src.workDir, "s.state.mem"), kind: "full" }, { resume: true });
    const dirtyPath = join(spec.workDir, DIRTY_MEM_FILE);
    expect(JSON.parse(readFileSync(join(runtimeDir, "vmm", "vm-cap.json"), "utf8")).ownedFiles).toEqual([join(spec.workDir, "firecracker.sock"), dirtyPath]);
    guestWrites(spec, [[3, 0xaa], [4, 0xab], [100, 0xcc]]);
    await vm.pause();
    const c1 = await vm.captureSnapshot(join(spec.workDir, "c1.state"));
    expect(c1.kind).toBe("changed");
    expect(c1.kind === "changed" && c1.ranges).toEqual([[3 * P, 5 * P], [100 * P, 101 * P]]);
    expect(pageBytes(c1, 4)).toEqual([0xab, 0xab]);
    c1.release();
    await vm.resume();
    // more writes after a capture the VM ran on from: the next capture still has the first ones
    guestWrites(spec, [[4, 0xbb], [7, 0x07]]);
    await vm.pause();
    const c2 = await vm.captureSnapshot(join(spec.workDir, "c2.state"));
    expect(c2.kind === "changed" && c2.ranges).toEqual([[3 * P, 5 * P], [7 * P, 8 * P], [100 * P, 101 * P]]);
    expect([3, 4, 7, 100].map((pg) => pageBytes(c2, pg)[0])).toEqual([0xaa, 0xbb, 0x07, 0xcc]);
    expect(statSync(dirtyPath).size).toBe(MEM);
    // the new memory layer holds the 4 changed pages only; over the parent the image reads whole
    const top = join(root, "cap-top.layer");
    const w = await writeMemoryLayer(c2, top, { size: MEM, parentLayers: [parent] });
    expect(w.changedBytes).toBe(4 * P);
    expect(statSync(top).size).toBeLessThan(64 * 1024);
    c2.release();
    {
      await using img = await openStack({ lowers: [parent, top] });
      const b = new Uint8Array(101 * P);
      await img.pread(b, 0);
      expect([1, 2, 3, 4, 5, 7, 100].map((pg) => b[pg * P])).toEqual([0x11, 0x22, 0xaa, 0xbb, 0, 0x07, 0xcc]);
    }
    const log = requests(spec);
    expect(seq(log)).toEqual(["GET / 200", "PUT /snapshot/load 204", "PATCH /vm 204", "PUT /snapshot/create 204", "PATCH /vm 204", "PATCH /vm 204", "PUT /snapshot/create 204"]);
    expect(log[1]!.body.track_dirty_pages).toBe(true);
    expect(log[3]!.body).toEqual({ snapshot_type: "Diff", snapshot_path: join(spec.workDir, "c1.state"), mem_file_path: dirtyPath });
    expect(log[6]!.body).toEqual({ snapshot_type: "Diff", snapshot_path: join(spec.workDir, "c2.state"), mem_file_path: dirtyPath });
    await vm.stop();
    expect(existsSync(dirtyPath)).toBe(false); // goes with the VM

    // restored without tracking: a Full snapshot compared with the parent image
    const untracked = new FirecrackerDriver({ config: { ...cfg, trackDirtyPages: false }, runtimeDir });
    const spec3 = makeSpec("vm-cap-full");
    const vm3 = await untracked.restore(spec3, { statePath: join(src.workDir, "s.state"), memPath: join(src.workDir, "s.state.mem"), kind: "full" }, { resume: false });
    const c3 = await vm3.captureSnapshot(join(spec3.workDir, "c3.state"));
    expect(c3).toMatchObject({ kind: "file", path: join(spec3.workDir, "c3.state.mem"), overParent: true });
    expect(requests(spec3).at(-1)!.body.snapshot_type).toBe("Full");
    expect(requests(spec3)[1]!.body.track_dirty_pages).toBe(false);
    c3.release();
    expect(existsSync(join(spec3.workDir, "c3.state.mem"))).toBe(false);
    await vm3.stop();
  }, 60_000);

  test("pageRanges widens byte extents to whole pages and merges them", () => {
    expect(pageRanges([])).toEqual([]);
    expect(pageRanges([[0, 1], [4096, 8192], [8193, 9000], [5 * 4096, 6 * 4096]])).toEqual([[0, 3 * 4096], [5 * 4096, 6 * 4096]]);
  });

  test("with a NIC: runs in the netns, configures the NIC and MMDS, overrides the tap on restore", async () => {
    expect(Bun.spawnSync(["ip", "netns", "add", netnsName]).exitCode).toBe(0);
    const net = { netnsPath: `/var/run/netns/${netnsName}`, tapName: "tap-a", mac: "02:fc:00:00:00:01", guestIp: "169.254.0.1", gatewayIp: "169.254.0.2", prefixLen: 30 };
    const metadata = { sandbox: { id: "vm-net", token: "t0k" } };
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const spec = makeSpec("vm-net", { net, metadata });
    const vm = await driver.boot(spec);
    const start = JSON.parse(readFileSync(join(spec.workDir, "firecracker.sock.start.json"), "utf8"));
    expect(start.netns).toBe(`net:[${statSync(net.netnsPath).ino}]`);
    expect(start.netns).not.toBe(`net:[${statSync("/proc/self/ns/net").ino}]`);
    const log = requests(spec);
    expect(seq(log)).toEqual([
      "GET / 200", "PUT /machine-config 204", "PUT /boot-source 204", "PUT /drives/rootfs 204", "PUT /drives/data 204",
      "PUT /network-interfaces/eth0 204", "PUT /mmds/config 204", "PUT /mmds 204", "PUT /entropy 204", "PUT /actions 204",
    ]);
    log.shift();
    expect(log[4]!.body).toEqual({ iface_id: "eth0", host_dev_name: "tap-a", guest_mac: "02:fc:00:00:00:01" });
    expect(log[5]!.body).toEqual({ version: "V2", network_interfaces: ["eth0"] });
    expect(log[6]!.body).toEqual(metadata);
    expect(log[1]!.body.boot_args).toContain("ip=169.254.0.1::169.254.0.2:255.255.255.252::eth0:off");
    await vm.pause();
    const files = { statePath: join(spec.workDir, "n.state"), memPath: join(spec.workDir, "n.mem"), kind: "full" as const };
    await vm.snapshot(files);
    await vm.stop();

    const spec2 = makeSpec("vm-net2", { net: { ...net, tapName: "tap-b" }, metadata });
    const r = await driver.restore(spec2, files, { resume: true });
    const log2 = requests(spec2);
    expect(seq(log2)).toEqual(["GET / 200", "PUT /snapshot/load 204", "PUT /mmds 204"]);
    log2.shift();
    expect(log2[0]!.body.network_overrides).toEqual([{ iface_id: "eth0", host_dev_name: "tap-b" }]);
    expect(log2[1]!.body).toEqual(metadata);
    await r.stop();
  }, 60_000);

  test("Firecracker's error body is surfaced and the process is stopped (missing kernel, missing drive)", async () => {
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const spec = makeSpec("vm-nokernel", { kernelPath: join(root, "no-such-vmlinux") });
    const e = await expectVmmError(driver.boot(spec), "vmm.firecracker_api");
    expect(e.details.status).toBe(400);
    expect(e.details.path).toBe("/boot-source");
    expect(String(e.details.faultMessage)).toContain("kernel file cannot be opened");
    expect(seq(requests(spec))).toEqual(["GET / 200", "PUT /machine-config 204", "PUT /boot-source 400"]);
    expect(existsSync(join(runtimeDir, "vmm", "vm-nokernel.json"))).toBe(false);
    expect(existsSync(join(spec.workDir, "firecracker.sock"))).toBe(false);

    const spec2 = makeSpec("vm-nodrive");
    spec2.drives[1]!.path = join(root, "missing-root.img");
    const e2 = await expectVmmError(driver.boot(spec2), "vmm.firecracker_api");
    expect(String(e2.details.faultMessage)).toContain("Unable to create the block device");
    expect(e2.details.path).toBe("/drives/rootfs");
  }, 60_000);

  test("restore errors: missing memory file is surfaced", async () => {
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const spec = makeSpec("vm-badrestore");
    writeFileSync(join(spec.workDir, "x.state"), JSON.stringify({ fakeFirecrackerSnapshot: 1, machine: {} }));
    const e = await expectVmmError(
      driver.restore(spec, { statePath: join(spec.workDir, "x.state"), memPath: join(spec.workDir, "none.mem"), kind: "full" }, { resume: true }),
      "vmm.firecracker_api",
    );
    expect(String(e.details.faultMessage)).toContain("Cannot open the memory file");
  }, 60_000);

  test("the stand-in really validates: invalid bodies and wrong phases get Firecracker-style 400s", async () => {
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const spec = makeSpec("vm-raw");
    const vm = await driver.boot(spec);
    const api = new FirecrackerApi(join(spec.workDir, "firecracker.sock"), "vm-raw", 5000);
    const cases: [any, string][] = [
      [{ method: "PATCH", path: "/vm", body: { state: "Sleeping" } }, "deserializing"],
      [{ method: "PATCH", path: "/vm", body: { state: "Paused", extra: 1 } }, "deserializing"],
      [{ method: "PUT", path: "/machine-config", body: { vcpu_count: 2, mem_size_mib: 128 } }, "after starting"],
      [{ method: "PUT", path: "/snapshot/create", body: { snapshot_path: "/tmp/x", mem_file_path: "/tmp/y" } }, "must be paused"],
      [{ method: "PUT", path: "/drives/a", body: { drive_id: "b", is_root_device: false } }, "deserializing|does not match|after starting"],
      [{ method: "PUT", path: "/no-such-endpoint", body: {} }, "Invalid request method"],
    ];
    for (const [req, msg] of cases) {
      const e = await expectVmmError(api.send(req), "vmm.firecracker_api");
      expect(e.details.status).toBe(400);
      expect(String(e.details.faultMessage)).toMatch(new RegExp(msg));
    }
    // the driver refuses a snapshot of a running VM itself
    await expectVmmError(vm.snapshot({ statePath: "/tmp/s", memPath: "/tmp/m", kind: "full" }), "vmm.bad_state");
    await vm.stop();
  }, 60_000);

  test("spawn failures: missing binary, binary that exits, unreachable netns", async () => {
    const missing = new FirecrackerDriver({ config: { ...cfg, binary: join(root, "nope") }, runtimeDir });
    await expectVmmError(missing.boot(makeSpec("vm-nobin")), "vmm.spawn_failed");
    const exits = new FirecrackerDriver({ config: { ...cfg, binary: "/bin/false" }, runtimeDir });
    const e = await expectVmmError(exits.boot(makeSpec("vm-false")), "vmm.spawn_failed");
    expect(e.details.exitCode).toBe(1);
    expect(existsSync(join(runtimeDir, "vmm", "vm-false.json"))).toBe(false);
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const spec = makeSpec("vm-nons", {
      net: { netnsPath: join(root, "no-netns"), tapName: "t", mac: "02:00:00:00:00:02", guestIp: "169.254.0.5", gatewayIp: "169.254.0.6", prefixLen: 30 },
    });
    await expectVmmError(driver.boot(spec), "vmm.spawn_failed");
  }, 60_000);

  test("after a node crash, reapLeftovers kills the Firecracker process and removes its socket", async () => {
    const { reapLeftovers } = await import("../../../src/vmm/supervise.ts");
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const spec = makeSpec("vm-orphan");
    const vm = await driver.boot(spec);
    const sock = join(spec.workDir, "firecracker.sock");
    expect(existsSync(sock)).toBe(true);
    const reaped = await reapLeftovers(runtimeDir);
    expect(reaped).toContain("vm-orphan");
    expect(await vm.exited).toBeNull(); // SIGKILL
    expect(existsSync(sock)).toBe(false);
    expect(existsSync(join(runtimeDir, "vmm", "vm-orphan.json"))).toBe(false);
  }, 60_000);

  test("an API socket that never answers times out as vmm.spawn_failed and the process is stopped", async () => {
    const mute = join(root, "mute-firecracker");
    // creates the socket path (as a plain file) but never serves on it
    writeFileSync(mute, `#!/bin/sh\n: > "$2"\nexec sleep 60\n`);
    chmodSync(mute, 0o755);
    const driver = new FirecrackerDriver({ config: { ...cfg, binary: mute, socketTimeoutMs: 600 }, runtimeDir });
    const spec = makeSpec("vm-mute");
    const e = await expectVmmError(driver.boot(spec), "vmm.spawn_failed");
    expect(e.message).toContain("not answering");
    expect(existsSync(join(runtimeDir, "vmm", "vm-mute.json"))).toBe(false);
  }, 60_000);

  test("the VMM runs in its own session (Ctrl-C to the node's process group does not reach it); the record holds its pid", async () => {
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const vm = await driver.boot(makeSpec("vm-sid"));
    try {
      // /proc/<pid>/stat fields 5 (pgrp) and 6 (session), after the parenthesised comm
      const stat = (pid: number) => readFileSync(`/proc/${pid}/stat`, "utf8").slice(readFileSync(`/proc/${pid}/stat`, "utf8").lastIndexOf(")") + 2).split(" ");
      const [vmPgid, vmSid] = [Number(stat(vm.pid)[2]), Number(stat(vm.pid)[3])];
      expect(vmPgid).toBe(vm.pid);
      expect(vmSid).toBe(vm.pid);
      expect(vmSid).not.toBe(Number(stat(process.pid)[3]));
      expect(JSON.parse(readFileSync(join(runtimeDir, "vmm", "vm-sid.json"), "utf8")).pid).toBe(vm.pid);
    } finally {
      await vm.stop();
    }
    expect(existsSync(join(runtimeDir, "vmm", "vm-sid.json"))).toBe(false);
  }, 60_000);

  test("a VMM that dies is noticed: exited resolves, record removed, further calls refused", async () => {
    const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
    const vm = await driver.boot(makeSpec("vm-dies"));
    process.kill(vm.pid, "SIGKILL");
    expect(await vm.exited).toBeNull();
    expect(existsSync(join(runtimeDir, "vmm", "vm-dies.json"))).toBe(false);
    await expectVmmError(vm.pause(), "vmm.bad_state");
    await vm.stop();
  }, 60_000);
});

describe("firecracker config", () => {
  test("defaults load; bad enum values and timeouts are refused", async () => {
    const { loadConfig } = await import("../../../src/config/index.ts");
    const c = firecrackerConfig(loadConfig({ env: {} }));
    expect(c.mmdsVersion).toBe("V2");
    expect(c.driveCacheType).toBe("Writeback");
    const d = createFirecrackerDriver(loadConfig({ env: { AENV_RUNTIME_PATH: runtimeDir } }));
    expect(d.name).toBe("firecracker");
    const bad: Record<string, string> = {
      AENV__firecracker__mmds_version: "V3",
      AENV__firecracker__drive_io_engine: "Fast",
      AENV__firecracker__api_timeout_ms: "0",
      AENV__vm__stop_timeout_ms: "-5",
    };
    for (const [k, v] of Object.entries(bad)) {
      let err: unknown;
      try {
        loadConfig({ env: { [k]: v } });
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ConfigError);
      expect((err as ConfigError).code).toBe("config.bad_value");
      expect((err as ConfigError).details.key).toBe(k.slice(6).replace("__", "."));
      expect((err as ConfigError).details.value).toBe(v);
    }
  });
});
