/**
 * Guest kernel: the fragment/config checks and cache key (unit), and the kernel built by
 * `agentenv kernel build` (scripts/test.sh pre-step) booted under real QEMU microvm/TCG with a
 * tiny busybox rootfs: it must show /dev/ublk-control, ublk and io_uring built in, and an
 * io_uring READ must complete inside the guest (test/vmm/kernel/fixtures/uring_probe.c).
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { resolveKernelPath } from "../../../src/vmm/index.ts";
import { fragmentMismatches, hasPvhNote, kernelCacheKey, kernelFragment } from "../../../src/vmm/kernel/build.ts";
import { hostTscKhz } from "../../../src/vmm/qemu/host.ts";
import { TEST_HOME, testConfig, testDriver } from "../qemu/helpers.ts";

describe("kernel config fragment", () => {
  test("every fragment line survives when .config has it; mismatches are named", () => {
    const frag = "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_N=32\n# comment\n";
    expect(fragmentMismatches(frag, "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_N=32\n")).toEqual([]);
    expect(fragmentMismatches(frag, "CONFIG_A=y\nCONFIG_N=32\n")).toEqual([]); // absent counts as unset
    expect(fragmentMismatches(frag, "# CONFIG_A is not set\nCONFIG_B=y\nCONFIG_N=8\n")).toEqual([
      "CONFIG_A=y -> n",
      "CONFIG_B=n -> y",
      "CONFIG_N=32 -> 8",
    ]);
  });

  test("the shipped fragment asks for ublk, io_uring, cmdline virtio-mmio, VMGenID and no modules", () => {
    const f = kernelFragment();
    for (const k of ["CONFIG_BLK_DEV_UBLK=y", "CONFIG_IO_URING=y", "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y", "CONFIG_PVH=y", "CONFIG_FUSE_FS=y", "CONFIG_IP_PNP=y", "CONFIG_VMGENID=y"]) {
      expect(f).toContain(`\n${k}\n`);
    }
    expect(f).not.toMatch(/^CONFIG_MODULES=y/m);
  });

  test("cache key depends on source version and fragment, and is stable", () => {
    const a = kernelCacheKey("linux-source-6.1=6.1.192-3", "CONFIG_A=y\n");
    expect(a).toMatch(/^[0-9a-f]{16}$/);
    expect(kernelCacheKey("linux-source-6.1=6.1.192-3", "CONFIG_A=y\n")).toBe(a);
    expect(kernelCacheKey("linux-source-6.1=6.1.193-1", "CONFIG_A=y\n")).not.toBe(a);
    expect(kernelCacheKey("linux-source-6.1=6.1.192-3", "CONFIG_A=n\n")).not.toBe(a);
  });

  test("hasPvhNote rejects files that are not a PVH vmlinux", () => {
    const d = mkdtempSync(join(tmpdir(), "c1k-"));
    try {
      writeFileSync(join(d, "text"), "not an elf at all");
      expect(hasPvhNote(join(d, "text"))).toBe(false);
      expect(hasPvhNote("/bin/true")).toBe(false); // an ELF without the Xen PVH note
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });
});

describe("built guest kernel under QEMU", () => {
  let kernelPath = "";
  let dir = "";
  beforeAll(() => {
    kernelPath = resolveKernelPath(testConfig()); // throws vmm.kernel_missing when the pre-step did not run
    dir = mkdtempSync(join(tmpdir(), "c1kboot-"));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test("the cached kernel is a PVH ELF and its .config kept every fragment line", () => {
    expect(hasPvhNote(kernelPath)).toBe(true);
    const cfg = readFileSync(join(kernelPath, "..", "config"), "utf8");
    expect(fragmentMismatches(kernelFragment(), cfg)).toEqual([]);
    expect(cfg).toMatch(/^# CONFIG_MODULES is not set$/m);
  });

  /** A 16 MiB ext4 with static busybox, the io_uring probe and an /init that reports and reboots. */
  function makeRootfs(): string {
    const root = join(dir, "root");
    for (const d of ["bin", "proc", "sys", "dev", "tmp"]) mkdirSync(join(root, d), { recursive: true });
    copyFileSync("/bin/busybox", join(root, "bin/busybox"));
    const cc = Bun.spawnSync(["gcc", "-static", "-O2", "-o", join(root, "uring_probe"), join(import.meta.dir, "fixtures/uring_probe.c")], { stderr: "pipe" });
    expect(cc.stderr.toString()).toBe("");
    expect(cc.exitCode).toBe(0);
    writeFileSync(
      join(root, "init"),
      [
        "#!/bin/busybox sh",
        "B=/bin/busybox", // the root is read-only: call applets through busybox, no --install
        "$B mount -t proc proc /proc; $B mount -t sysfs sys /sys",
        'echo "KT-UBLK $($B ls -l /dev/ublk-control)"',
        'echo "KT-CONFIG $($B zcat /proc/config.gz | $B grep -E \'^CONFIG_(IO_URING|BLK_DEV_UBLK)=\' | $B tr \'\\n\' \' \')"',
        'echo "KT-VIRTIO $($B readlink -f /sys/bus/virtio/devices/virtio0)"',
        "/uring_probe /proc/version",
        'echo "KT-DONE rc=$?"',
        "$B reboot -f",
        "",
      ].join("\n"),
    );
    chmodSync(join(root, "init"), 0o755);
    const img = join(dir, "kt.ext4");
    const mk = Bun.spawnSync(["mkfs.ext4", "-q", "-F", "-d", root, img, "16M"], { stderr: "pipe" });
    expect(mk.exitCode).toBe(0);
    return img;
  }

  function expectGuestReport(out: string): void {
    expect(out).toMatch(/KT-UBLK crw------- +1 0 +0 +10, +\d+ .*\/dev\/ublk-control/); // misc char device 10:N
    expect(out).toContain("CONFIG_IO_URING=y");
    expect(out).toContain("CONFIG_BLK_DEV_UBLK=y");
    const m = out.match(/URING fd=(\d+) res=(\d+) data=(.*)/);
    expect(m).not.toBeNull();
    expect(Number(m![2])).toBeGreaterThan(20);
    expect(m![3]).toStartWith("Linux version 6.1.");
    expect(out).toContain("KT-DONE rc=0");
  }

  test("boots (ACPI virtio-mmio discovery), shows /dev/ublk-control, and runs an io_uring read", async () => {
    const img = makeRootfs();
    const { driver, dispose } = testDriver();
    try {
      const vm = await driver.boot({
        id: `kt${process.pid}`,
        workDir: join(dir, "vm"),
        kernelPath,
        bootArgs: "root=/dev/vda ro init=/init",
        vcpus: 1,
        memoryMiB: 256,
        drives: [{ id: "root", path: img, readOnly: true, isRoot: true }],
      });
      const code = await Promise.race([vm.exited, Bun.sleep(90_000).then(() => "timeout")]);
      const out = readFileSync(vm.consolePath, "utf8");
      if (code === "timeout") await vm.stop();
      expect(code).toBe(0); // guest reboot -f + -no-reboot: QEMU exits 0
      expectGuestReport(out);
      expect(out).toMatch(/KT-VIRTIO \S*LNRO0005:\d+\/virtio0/); // found through the ACPI DSDT
      expect(vm.state).toBe("failed"); // it exited on its own, not through stop()
    } finally {
      dispose();
    }
  }, 120_000);

  test("finds its disk the Firecracker way: no ACPI, virtio_mmio.device= on the command line", async () => {
    const img = join(dir, "kt.ext4");
    const consolePath = join(dir, "fc-style.log");
    const tsc = hostTscKhz();
    // QEMU microvm without ACPI and without its own cmdline additions; the first virtio-mmio slot
    // is 512 bytes at 0xfeb00e00, IRQ 12 (docs/guest-kernel.md §6)
    const q = Bun.spawn([
      "qemu-system-x86_64", "-M", "microvm,acpi=off,auto-kernel-cmdline=off", "-accel", "tcg", "-cpu", "max", "-m", "256M",
      "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-global", "virtio-mmio.force-legacy=false",
      "-serial", `file:${consolePath}`, "-kernel", kernelPath,
      "-append", `console=ttyS0 quiet ${tsc ? `tsc_early_khz=${tsc}` : ""} pci=off reboot=t root=/dev/vda ro init=/init virtio_mmio.device=512@0xfeb00e00:12`,
      "-drive", `id=d0,file=${img},format=raw,if=none,readonly=on`, "-device", "virtio-blk-device,drive=d0",
    ], { stderr: "pipe" });
    const code = await Promise.race([q.exited, Bun.sleep(90_000).then(() => "timeout")]);
    if (code === "timeout") q.kill("SIGKILL");
    expect(code).toBe(0);
    const out = readFileSync(consolePath, "utf8");
    expectGuestReport(out);
    expect(out).toMatch(/KT-VIRTIO \S*virtio-mmio\.0\/virtio0/); // the command-line platform device
  }, 120_000);
});

describe("kernel CLI and resolution", () => {
  test("`agentenv kernel build` with the cache present prints the cached vmlinux path", () => {
    const r = Bun.spawnSync([process.execPath, join(import.meta.dir, "../../../src/cli/main.ts"), "kernel", "build"], {
      env: { ...process.env, AENV_HOME_PATH: TEST_HOME, AENV_LOG_LEVEL: "warn" },
      stderr: "pipe",
    });
    expect(r.exitCode).toBe(0);
    expect(r.stdout.toString()).toBe(resolveKernelPath(testConfig()) + "\n");
    expect(r.stderr.toString()).toMatch(/^kernel [0-9a-f]{16} \(linux-source-6\.1=.*\) cached\n$/);
  });

  test("resolveKernelPath: an explicit path wins; a missing one is vmm.kernel_missing", () => {
    expect(resolveKernelPath(testConfig({ AENV__kernel__path: "/bin/true" }))).toBe("/bin/true");
    expect(() => resolveKernelPath(testConfig({ AENV__kernel__path: "/no/such/vmlinux" }))).toThrow(
      expect.objectContaining({ code: "vmm.kernel_missing" }),
    );
    expect(() => resolveKernelPath(testConfig({ AENV_HOME_PATH: "/nonexistent-c1" }))).toThrow(expect.objectContaining({ code: "vmm.kernel_missing" }));
  });
});
