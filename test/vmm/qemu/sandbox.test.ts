/**
 * Integration: real QEMU microvm/TCG VMs booted from the base template (built by the
 * scripts/test.sh pre-step) with the guest kernel from `kernel build`, each on a FUSE-served
 * overlaybd root disk (template layer + its own upper, served by the disk daemon: DiskService.rootDisk), in its
 * own netns with a tap; the test talks to envd inside over TCP. Sandbox A runs `uname -a` and
 * writes a file; after A stops, sandbox B (same template) does not see the file, while A's upper,
 * served again, still holds it. Also: a VMM that dies is noticed and its files are removed.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { diskConfig, DiskService, type DiskExport } from "../../../src/storage/daemon/index.ts";
import { resolveTemplate, type ResolvedTemplate } from "../../../src/template/index.ts";
import { resolveKernelPath, type QemuVm } from "../../../src/vmm/index.ts";
import { ENVD_PORT, runInGuest, waitEnvd } from "./envd-client.ts";
import { TEST_HOME, TestNet, testBoot, testConfig, testDriver } from "./helpers.ts";

const cfg = testConfig();
let tpl: ResolvedTemplate;
let kernelPath: string;
let root: string;
let disks: DiskService;
const drv = testDriver();
const cleanups: (() => Promise<void> | void)[] = [];

beforeAll(async () => {
  kernelPath = resolveKernelPath(cfg);
  tpl = resolveTemplate(TEST_HOME, "base");
  root = mkdtempSync(join(tmpdir(), "c1sb-"));
  disks = await DiskService.start({ dir: join(drv.runtimeDir, "disk"), config: diskConfig(cfg) });
});

afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
  await disks?.close();
  rmSync(root, { recursive: true, force: true });
  drv.dispose();
});

interface Sandbox {
  vm: QemuVm;
  disk: DiskExport;
  net: TestNet;
  dir: string;
}

async function startSandbox(name: string): Promise<Sandbox> {
  const dir = join(root, name);
  const disk = await disks.rootDisk({ id: `c1-${process.pid}-${name}`, lowers: tpl.rootLayers, sandboxDir: dir });
  cleanups.push(() => disk.close());
  const net = new TestNet();
  cleanups.push(() => net.destroy());
  const boot = testBoot(disk.path, { args: tpl.bootArgs });
  const vm = await drv.driver.boot({
    id: `c1-${process.pid}-${name}`,
    workDir: join(dir, "vm"),
    kernelPath,
    bootArgs: boot.bootArgs,
    vcpus: 1,
    memoryMiB: 512,
    drives: boot.drives,
    net: net.spec,
  });
  cleanups.push(() => vm.stop());
  return { vm, disk, net, dir };
}

describe("sandboxes from the base template", () => {
  test("A writes a file through envd; B from the same template does not see it; A's upper keeps it", async () => {
    expect(tpl.rootLayers.length).toBe(1);
    const beforeBoot = Date.now();
    const a = await startSandbox("a");
    const afterBoot = Date.now();
    const base = a.net.url(ENVD_PORT);
    try {
      await waitEnvd(base, 90_000);
    } catch (e) {
      throw new Error(`${(e as Error).message}\nconsole:\n${a.vm.consoleTail(3000)}`);
    }
    const uname = await runInGuest(base, "uname -a");
    expect(uname.exitCode).toBe(0);
    expect(uname.stdout).toMatch(/^Linux agentenv 6\.1\.\d+ #1 SMP .* x86_64 GNU\/Linux\n$/);
    // the guest clock was set from aenv.clock= (the host's time at boot, ms) by init, in whole
    // seconds, and has run since by the guest's own clock: between that second and that second
    // plus the guest's uptime (both read in the guest, no window against the host's clock)
    const clock = await runInGuest(base, "date +%s; cut -d' ' -f1 /proc/uptime; cat /proc/cmdline");
    const [date, uptime, cmdline] = clock.stdout.split("\n");
    const bootMs = Number(/(?:^| )aenv\.clock=(\d+)(?: |$)/.exec(cmdline!)?.[1]);
    expect(bootMs).toBeGreaterThanOrEqual(beforeBoot);
    expect(bootMs).toBeLessThanOrEqual(afterBoot);
    expect(Number(date)).toBeGreaterThanOrEqual(Math.floor(bootMs / 1000));
    expect(Number(date)).toBeLessThanOrEqual(Math.floor(bootMs / 1000) + Number(uptime));
    // resolver: the default gateway (the tap's host side), written by init
    expect((await runInGuest(base, "cat /etc/resolv.conf")).stdout).toBe(`nameserver ${a.net.spec.gatewayIp}\n`);
    const who = await runInGuest(base, "id -u; id -un; echo $HOME", "user");
    expect(who).toEqual({ stdout: "1000\nuser\n/home/user\n", stderr: "", exitCode: 0 });
    const w = await runInGuest(base, "echo sandbox-a-was-here > /home/user/marker.txt && sync && cat /home/user/marker.txt", "user");
    expect(w).toEqual({ stdout: "sandbox-a-was-here\n", stderr: "", exitCode: 0 });
    await a.vm.stop();
    expect(a.vm.state).toBe("stopped");
    expect(await a.vm.exited).toBe(0);
    await a.disk.close();

    const b = await startSandbox("b");
    await waitEnvd(b.net.url(ENVD_PORT), 90_000);
    const r = await runInGuest(b.net.url(ENVD_PORT), "cat /home/user/marker.txt; echo rc=$?; cat /etc/debian_version");
    expect(r.stdout).toMatch(/^rc=1\n12\.\d+\n$/);
    expect(r.stderr).toContain("No such file or directory");
    await b.vm.stop();
    await b.disk.close();

    // A's upper still holds the write: serve A's stack again and read the file with debugfs
    const again = await disks.rootDisk({ id: `c1-${process.pid}-a2`, lowers: tpl.rootLayers, sandboxDir: a.dir });
    try {
      const cat = Bun.spawnSync(["debugfs", "-R", "cat /home/user/marker.txt", again.path], { stderr: "pipe" });
      expect(cat.stdout.toString()).toBe("sandbox-a-was-here\n");
    } finally {
      await again.close();
    }
    // the template layer was only read (older builds' layers may sit beside it)
    expect(readdirSync(tpl.dir).filter((f) => !f.endsWith(".layer")).sort()).toEqual(["manifest.json", "rootfs.ext4"]);
    expect(tpl.rootLayers.every((l) => existsSync(l))).toBe(true);
  }, 300_000);

  test("a VMM killed from outside is noticed: state failed, record and RAM file removed", async () => {
    const s = await startSandbox("k");
    const rec = join(drv.runtimeDir, "vmm", `${s.vm.id}.json`);
    expect(existsSync(rec)).toBe(true);
    expect(existsSync(s.vm.memPath)).toBe(true);
    process.kill(s.vm.pid, "SIGKILL");
    expect(await s.vm.exited).toBeNull();
    expect(s.vm.state).toBe("failed");
    expect(existsSync(rec)).toBe(false);
    expect(existsSync(s.vm.memPath)).toBe(false);
    await expect(s.vm.pause()).rejects.toMatchObject({ code: "vmm.not_running" });
  }, 60_000);
});
