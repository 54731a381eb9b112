/** Unit tests: QEMU argv, kernel command-line pieces, host detection (no VM started). */
import { describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { kernelClockArg, kernelIpArg, prefixToNetmask, qemuOptions, QemuDriver, VmmError, type VmSpec } from "../../../src/vmm/index.ts";
import { loadConfig } from "../../../src/config/index.ts";
import { buildQemuArgs, type QemuArgsOptions } from "../../../src/vmm/qemu/args.ts";
import { detectAccel, hostTscKhz } from "../../../src/vmm/qemu/host.ts";

const spec: VmSpec = {
  id: "sb-1",
  workDir: "/tmp/sb-1",
  kernelPath: "/k/vmlinux",
  bootArgs: "root=/dev/vda rw",
  vcpus: 2,
  memoryMiB: 512,
  drives: [
    { id: "data", path: "/d/data.img", readOnly: true, isRoot: false },
    { id: "root", path: "/d/root.img", readOnly: false, isRoot: true },
  ],
  net: { netnsPath: "/run/netns/x", tapName: "tap0", mac: "02:ae:00:00:00:01", guestIp: "169.254.0.21", gatewayIp: "169.254.0.22", prefixLen: 30 },
};
const opts: QemuArgsOptions = {
  accel: "tcg",
  tcgTbSizeMiB: 0,
  cpu: "max",
  tscKhz: 2596134,
  memPath: "/dev/shm/a/sb-1.mem",
  memShared: true,
  qmpFd: 3,
  consoleFd: 4,
  cmdline: "console=ttyS0 root=/dev/vda",
  incoming: false,
  balloon: false,
  memMerge: false,
};

function flag(a: string[], f: string): string[] {
  return a.flatMap((v, i) => (v === f ? [a[i + 1]!] : []));
}

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(VmmError);
    return (e as VmmError).code;
  }
  return "no error";
}

describe("buildQemuArgs", () => {
  test("microvm with shared file RAM, QMP, console, root drive first, rng, tap", () => {
    const a = buildQemuArgs(spec, opts);
    expect(flag(a, "-M")).toEqual(["microvm,memory-backend=mem,pit=off,mem-merge=off"]);
    expect(flag(a, "-accel")).toEqual(["tcg"]);
    expect(flag(a, "-cpu")).toEqual(["max"]);
    expect(flag(a, "-m")).toEqual(["512M"]);
    expect(flag(a, "-smp")).toEqual(["2"]);
    expect(flag(a, "-object")).toEqual([
      "memory-backend-file,id=mem,size=512M,mem-path=/dev/shm/a/sb-1.mem,share=on",
      "rng-random,id=rng0,filename=/dev/urandom",
    ]);
    // QMP on the listening socket the driver passed as fd 3, as a control monitor; the serial
    // console on the one passed as fd 4, QEMU waiting at start for the node to connect
    expect(flag(a, "-chardev")).toEqual(["socket,id=qmp,fd=3,server=on,wait=off", "socket,id=con,fd=4,server=on,wait=on"]);
    expect(flag(a, "-mon")).toEqual(["chardev=qmp,mode=control"]);
    expect(flag(a, "-qmp")).toEqual([]);
    expect(flag(a, "-serial")).toEqual(["chardev:con"]);
    expect(flag(a, "-kernel")).toEqual(["/k/vmlinux"]);
    expect(flag(a, "-append")).toEqual(["console=ttyS0 root=/dev/vda"]);
    expect(flag(a, "-drive")).toEqual([
      "id=root,file=/d/root.img,format=raw,if=none,readonly=off",
      "id=data,file=/d/data.img,format=raw,if=none,readonly=on",
    ]);
    expect(flag(a, "-device")).toEqual([
      "virtio-blk-device,drive=root",
      "virtio-blk-device,drive=data",
      "virtio-rng-device,rng=rng0",
      "virtio-net-device,netdev=net0,mac=02:ae:00:00:00:01",
    ]);
    expect(flag(a, "-netdev")).toEqual(["tap,id=net0,ifname=tap0,script=no,downscript=no"]);
    expect(flag(a, "-global")).toEqual(["virtio-mmio.force-legacy=false"]);
    for (const f of ["-nodefaults", "-no-reboot", "-nographic"]) expect(a).toContain(f);
    expect(a).not.toContain("-incoming");
    expect(flag(buildQemuArgs(spec, { ...opts, tcgTbSizeMiB: 64 }), "-accel")).toEqual(["tcg,tb-size=64"]);
    expect(flag(buildQemuArgs(spec, { ...opts, accel: "kvm", tcgTbSizeMiB: 64 }), "-accel")).toEqual(["kvm"]);
  });

  test("the free page reporting balloon comes last, after every other device, only when asked for", () => {
    const a = buildQemuArgs(spec, { ...opts, balloon: true });
    expect(flag(a, "-device")).toEqual([
      "virtio-blk-device,drive=root",
      "virtio-blk-device,drive=data",
      "virtio-rng-device,rng=rng0",
      "virtio-net-device,netdev=net0,mac=02:ae:00:00:00:01",
      "virtio-balloon-device,free-page-reporting=on,page-poison=off",
    ]);
    expect(flag(buildQemuArgs(spec, opts), "-device").some((d) => d.startsWith("virtio-balloon"))).toBe(false);
    // a restore of a snapshot taken with microvm's PIT keeps it
    expect(flag(buildQemuArgs(spec, { ...opts, pit: true }), "-M")).toEqual(["microvm,memory-backend=mem,mem-merge=off"]);
    expect(flag(buildQemuArgs(spec, { ...opts, memMerge: true }), "-M")).toEqual(["microvm,memory-backend=mem,pit=off,mem-merge=on"]);
  });

  test("restore maps RAM privately and waits for migrate-incoming", () => {
    const a = buildQemuArgs({ ...spec, net: undefined }, { ...opts, memShared: false, incoming: true });
    expect(flag(a, "-object")[0]).toEndWith(",share=off");
    expect(flag(a, "-incoming")).toEqual(["defer"]);
    expect(flag(a, "-netdev")).toEqual([]);
  });

  test("bad input is rejected with vmm.bad_spec", () => {
    expect(code(() => buildQemuArgs({ ...spec, id: "a b" }, opts))).toBe("vmm.bad_spec");
    expect(code(() => buildQemuArgs({ ...spec, vcpus: 0 }, opts))).toBe("vmm.bad_spec");
    expect(code(() => buildQemuArgs({ ...spec, memoryMiB: 10 }, opts))).toBe("vmm.bad_spec");
    expect(code(() => buildQemuArgs({ ...spec, drives: spec.drives.filter((d) => !d.isRoot) }, opts))).toBe("vmm.bad_spec");
    expect(code(() => buildQemuArgs({ ...spec, drives: spec.drives.map((d) => ({ ...d, isRoot: true })) }, opts))).toBe("vmm.bad_spec");
    expect(code(() => buildQemuArgs({ ...spec, kernelPath: "vmlinux" }, opts))).toBe("vmm.bad_spec");
    expect(code(() => buildQemuArgs({ ...spec, drives: [{ id: "r", path: "/a,b", readOnly: false, isRoot: true }] }, opts))).toBe("vmm.bad_spec");
    expect(code(() => buildQemuArgs(spec, { ...opts, memPath: "/x/$(rm)" }))).toBe("vmm.bad_spec");
    // stdin, stdout and stderr are not a QMP socket; nor is a fractional or negative number
    for (const qmpFd of [0, 2, -1, 3.5]) expect(code(() => buildQemuArgs(spec, { ...opts, qmpFd }))).toBe("vmm.bad_spec");
    for (const consoleFd of [1, -1, 4.5, 3]) expect(code(() => buildQemuArgs(spec, { ...opts, consoleFd }))).toBe("vmm.bad_spec");
    expect(code(() => buildQemuArgs({ ...spec, net: { ...spec.net!, mac: "zz" } }, opts))).toBe("vmm.bad_spec");
    expect(code(() => buildQemuArgs({ ...spec, net: { ...spec.net!, tapName: "a-very-long-tap-name" } }, opts))).toBe("vmm.bad_spec");
    for (const serial of ["", "a,b", "x".repeat(21), "vol-1"]) {
      expect(code(() => buildQemuArgs({ ...spec, drives: [...spec.drives, { id: "v", path: "/d/v.img", readOnly: true, isRoot: false, serial }] }, opts))).toBe("vmm.bad_spec");
    }
  });

  test("a drive serial (a volume's id) is the virtio-blk serial the guest finds it by", () => {
    const a = buildQemuArgs({ ...spec, drives: [...spec.drives, { id: "vol0", path: "/d/v.img", readOnly: true, isRoot: false, serial: "abc123def456ghi789jk" }] }, opts);
    expect(flag(a, "-device")).toContain("virtio-blk-device,drive=vol0,serial=abc123def456ghi789jk");
  });
});

describe("TCG translation cache sizes", () => {
  test("a restored VM gets [qemu] tcg_tb_size_restore_mib, a booted one tcg_tb_size_mib", () => {
    const o = qemuOptions(loadConfig({ env: {} }));
    expect([o.tcgTbSizeMiB, o.tcgTbSizeRestoreMiB]).toEqual([256, 32]);
    const d = new QemuDriver({ ...o, accel: "tcg", tscKhz: 2596134, tcgTbSizeMiB: 128, tcgTbSizeRestoreMiB: 24 });
    expect(d.tcgTbSizeMiBFor(false)).toBe(128);
    expect(d.tcgTbSizeMiBFor(true)).toBe(24);
    expect(flag(buildQemuArgs(spec, { ...opts, tcgTbSizeMiB: d.tcgTbSizeMiBFor(true) }), "-accel")).toEqual(["tcg,tb-size=24"]);
    const env = loadConfig({ env: { AENV__qemu__tcg_tb_size_restore_mib: "0" } });
    expect(qemuOptions(env).tcgTbSizeRestoreMiB).toBe(0); // 0: QEMU's own default
    expect(() => loadConfig({ env: { AENV__qemu__tcg_tb_size_restore_mib: "-1" } })).toThrow(expect.objectContaining({ code: "config.bad_value" }));
  });
});

describe("QEMU that does not come up", () => {
  test("a missing binary and one that exits at once are vmm.spawn_failed and leave no QMP or console socket, record or RAM file", async () => {
    const root = mkdtempSync(join(tmpdir(), "qemu-nospawn-"));
    try {
      const o = { ...qemuOptions(loadConfig({ env: {} })), accel: "tcg" as const, tscKhz: 2596134, runtimeDir: join(root, "run"), memoryDir: join(root, "mem"), socketTimeoutMs: 5000 };
      const boot = async (binary: string, id: string) => {
        try {
          await new QemuDriver({ ...o, binary }).boot({ ...spec, id, workDir: join(root, id), net: undefined });
        } catch (e) {
          expect(e).toBeInstanceOf(VmmError);
          return (e as VmmError).code;
        }
        return "booted";
      };
      expect(await boot(join(root, "no-such-qemu"), "sb-missing")).toBe("vmm.spawn_failed");
      expect(await boot("/bin/false", "sb-false")).toBe("vmm.spawn_failed");
      for (const id of ["sb-missing", "sb-false"]) {
        expect(existsSync(join(root, "run", "vmm", `${id}.qmp`))).toBe(false);
        expect(existsSync(join(root, "run", "vmm", `${id}.con`))).toBe(false);
        expect(existsSync(join(root, "run", "vmm", `${id}.json`))).toBe(false);
        expect(existsSync(join(root, "mem", `${id}.mem`))).toBe(false);
      }
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

describe("kernel command-line pieces", () => {
  test("netmask and ip=", () => {
    expect(prefixToNetmask(30)).toBe("255.255.255.252");
    expect(prefixToNetmask(0)).toBe("0.0.0.0");
    expect(prefixToNetmask(32)).toBe("255.255.255.255");
    expect(prefixToNetmask(17)).toBe("255.255.128.0");
    expect(kernelIpArg({ guestIp: "169.254.0.21", gatewayIp: "169.254.0.22", prefixLen: 30 })).toBe(
      "ip=169.254.0.21::169.254.0.22:255.255.255.252::eth0:off",
    );
    expect(code(() => prefixToNetmask(33))).toBe("vmm.bad_spec");
    expect(code(() => kernelIpArg({ guestIp: "169.254.0.256", gatewayIp: "169.254.0.22", prefixLen: 30 }))).toBe("vmm.bad_spec");
    expect(code(() => kernelIpArg({ guestIp: "169.254.0.21", gatewayIp: "x", prefixLen: 30 }))).toBe("vmm.bad_spec");
  });

  test("the QEMU driver's command line: console, TSC hint under TCG, no legacy PTYs, then the spec's arguments", () => {
    const o = { ...qemuOptions(loadConfig({ env: {} })), accel: "tcg" as const, tscKhz: 2596134 };
    const words = new QemuDriver(o).cmdline({ ...spec, net: undefined, bootArgs: "root=/dev/vda" }).split(" ");
    expect(words.slice(0, 7)).toEqual(["console=ttyS0", "quiet", "panic=1", "pci=off", "pty.legacy_count=0", "tsc_early_khz=2596134", "tsc=reliable"]);
    expect(words.at(-1)).toBe("root=/dev/vda");
    expect(new QemuDriver({ ...o, accel: "kvm" }).cmdline({ ...spec, net: undefined, bootArgs: "" }).split(" ")).not.toContain("tsc_early_khz=2596134");
  });

  test("clock argument carries unix ms", () => {
    expect(kernelClockArg(1795948000123.7)).toBe("aenv.clock=1795948000123");
  });
});

describe("host detection", () => {
  test("kvm_pvm or no usable /dev/kvm means TCG", () => {
    const d = mkdtempSync(join(tmpdir(), "c1host-"));
    try {
      mkdirSync(join(d, "sys/module/kvm_pvm"), { recursive: true });
      mkdirSync(join(d, "dev"));
      expect(detectAccel(join(d, "sys"), "/dev")).toBe("tcg");
      expect(detectAccel(join(d, "nosys"), join(d, "dev"))).toBe("tcg"); // no kvm node
      writeFileSync(join(d, "dev/kvm"), "");
      expect(detectAccel(join(d, "nosys"), join(d, "dev"))).toBe("kvm");
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });

  test("TSC kHz from cpuinfo", () => {
    const d = mkdtempSync(join(tmpdir(), "c1cpu-"));
    try {
      writeFileSync(join(d, "cpuinfo"), "processor\t: 0\ncpu MHz\t\t: 2596.134\ncpu MHz\t\t: 1.0\n");
      expect(hostTscKhz(join(d, "cpuinfo"))).toBe(2596134);
      writeFileSync(join(d, "none"), "processor\t: 0\n");
      expect(hostTscKhz(join(d, "none"))).toBeNull();
      expect(hostTscKhz(join(d, "missing"))).toBeNull();
    } finally {
      rmSync(d, { recursive: true, force: true });
    }
  });
});

describe("createDriver", () => {
  test("auto without a firecracker binary gives QEMU; bad or unavailable choices are errors", async () => {
    const { loadConfig } = await import("../../../src/config/index.ts");
    const { createDriver, QemuDriver } = await import("../../../src/vmm/index.ts");
    const env = (extra: Record<string, string>) => loadConfig({ env: { AENV__firecracker__binary: "/nonexistent/firecracker", ...extra } });
    const auto = await createDriver(env({}));
    expect(auto).toBeInstanceOf(QemuDriver);
    expect(auto.name).toBe("qemu");
    if (existsSync("/sys/module/kvm_pvm")) expect((auto as InstanceType<typeof QemuDriver>).accel).toBe("tcg");
    expect((await createDriver(env({ AENV__vm__driver: "qemu" }))).name).toBe("qemu");
    await expect(createDriver(env({ AENV__vm__driver: "firecracker" }))).rejects.toMatchObject({ code: "vmm.driver_unavailable" });
    // with the binary present (any executable stands in; nothing is spawned here) auto picks Firecracker
    expect((await createDriver(env({ AENV__firecracker__binary: "/bin/true" }))).name).toBe("firecracker");
    expect((await createDriver(env({ AENV__firecracker__binary: "/bin/true", AENV__vm__driver: "qemu" }))).name).toBe("qemu");
    // an unknown driver or accelerator is refused when the config is loaded
    expect(() => env({ AENV__vm__driver: "vbox" })).toThrow(expect.objectContaining({ code: "config.bad_value", details: expect.objectContaining({ key: "vm.driver" }) }));
    expect(() => env({ AENV__qemu__accel: "hvf" })).toThrow(expect.objectContaining({ code: "config.bad_value", details: expect.objectContaining({ key: "qemu.accel" }) }));
  });
});
