/**
 * A real microVM in a real slot: QEMU (microvm, TCG) started inside the slot's netns, attached to
 * the slot's tap by name, guest configured by the kernel's ip= from the slot's NetSpec. The guest
 * serves TCP 7000; each connection runs an egress probe inside the guest (busybox nc to the two
 * test servers) and returns the result, so the test observes guest-originated traffic through the
 * node → slot inbound path while changing the policy at runtime.
 * Needs root, qemu-system-x86_64, a static busybox and the guest kernel scripts/test.sh builds
 * (`$AENV_TEST_HOME_PATH/kernels/<key>/vmlinux`); fails naming what is missing when it is not.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { loadConfig } from "../../src/config/index.ts";
import { resolveKernelPath } from "../../src/vmm/index.ts";
import { type Agent, World } from "./harness.ts";
import { waitFor } from "../helpers/wait.ts";

const home = process.env.AENV_TEST_HOME_PATH ?? "/var/lib/agentenv-test";
/** The guest kernel the VMM uses (`[kernel] path`, else the cached build under the test home). */
function findKernel(): string | null {
  try {
    const p = resolveKernelPath(loadConfig({ env: { ...process.env, AENV_HOME_PATH: home } }));
    return existsSync(p) ? p : null;
  } catch {
    return null;
  }
}
const kernel = findKernel();
const busybox = ["/bin/busybox", "/usr/bin/busybox"].find((p) => existsSync(p));
const qemu = Bun.which("qemu-system-x86_64");

/** cpio "newc" archive (the initramfs format, see the kernel's Documentation/driver-api/early-userspace). */
function cpio(entries: { name: string; mode: number; data?: Uint8Array; rdev?: [number, number] }[]): Uint8Array {
  const parts: Uint8Array[] = [];
  const pad4 = (n: number) => (4 - (n % 4)) % 4;
  const hex = (v: number) => v.toString(16).padStart(8, "0");
  let ino = 1;
  for (const e of [...entries, { name: "TRAILER!!!", mode: 0 }]) {
    const data = (e as { data?: Uint8Array }).data ?? new Uint8Array();
    const rdev = (e as { rdev?: [number, number] }).rdev ?? [0, 0];
    const name = new TextEncoder().encode(e.name + "\0");
    const fields = [ino++, e.mode, 0, 0, 1, 0, data.length, 0, 0, rdev[0], rdev[1], name.length, 0];
    const head = new TextEncoder().encode("070701" + fields.map(hex).join(""));
    parts.push(head, name, new Uint8Array(pad4(head.length + name.length)), data, new Uint8Array(pad4(data.length)));
  }
  return Buffer.concat(parts);
}

const INIT = `#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox --install -s /bin
export PATH=/bin
nc -ll -p 7000 -e /bin/probe &
echo "@@GUEST-UP@@ $(ip -o -4 addr show dev eth0)"
while true; do sleep 60; done
`;
const PROBE = `#!/bin/sh
a=$(nc -w 3 169.254.200.2 8080 </dev/null 2>&1)
b=$(nc -w 3 169.254.200.3 8080 </dev/null 2>&1)
d=$(nslookup api.allowed.test 169.254.0.22 2>&1 | grep -c 169.254.200.2)
c=$(nc -w 3 169.254.200.2 8080 </dev/null 2>&1)
echo "A=[$a] B=[$b] D=[$d] C=[$c]"
`;

// Prerequisites are built by scripts/test.sh before the suite: missing ones fail the test
// (a silent skip would hide a broken kernel build).
const missing = [process.getuid?.() === 0 ? "" : "root", kernel ? "" : "guest kernel", busybox ? "" : "busybox", qemu ? "" : "qemu-system-x86_64"].filter(Boolean).join(", ");

describe("QEMU guest in a slot (real VM, real netns)", () => {
  let w: World;
  let agent: Agent;
  let vm: ReturnType<typeof Bun.spawn> | undefined;

  beforeAll(async () => {
    if (missing) return;
    w = new World();
    await w.servers({
      tcp: [
        ["169.254.200.2", 8080],
        ["169.254.200.3", 8080],
      ],
      dns: { ip: "169.254.200.2", port: 53, names: { "api.allowed.test": "169.254.200.2@60" } },
    });
    agent = (await w.agent()).agent;
  }, 60_000);

  afterAll(async () => {
    vm?.kill("SIGKILL");
    await vm?.exited;
    await agent?.call("shutdown");
    await w?.cleanup();
  }, 60_000);

  test("guest reaches the allowed server only; node reaches the guest; policy changes at runtime", async () => {
    if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
    const slot = await agent.ok("allocate", { sandboxId: "vm-1", policy: { allowOut: ["169.254.200.2"] } });
    const initrd = join(w.dir, "initrd.gz");
    const enc = (s: string) => new TextEncoder().encode(s);
    writeFileSync(
      initrd,
      gzipSync(
        cpio([
          { name: "bin", mode: 0o40755 },
          { name: "dev", mode: 0o40755 },
          { name: "proc", mode: 0o40755 },
          { name: "dev/console", mode: 0o20600, rdev: [5, 1] },
          { name: "bin/busybox", mode: 0o100755, data: readFileSync(busybox!) },
          { name: "bin/probe", mode: 0o100755, data: enc(PROBE) },
          { name: "init", mode: 0o100755, data: enc(INIT) },
        ]),
      ),
    );
    const mhz = Number(/cpu MHz\s*:\s*([0-9.]+)/.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1] ?? 2000);
    const consolePath = join(w.dir, "console.log");
    // ip=<client>:<server>:<gw>:<netmask>:<host>:<dev>:<autoconf> (kernel IP_PNP)
    const ip = `ip=${slot.guestIp}::${slot.gatewayIp}:255.255.255.252::eth0:off`;
    vm = Bun.spawn(
      [
        "nsenter", `--net=${slot.netnsPath}`, "--", qemu!,
        "-M", "microvm", "-accel", "tcg", "-cpu", "max", "-m", "128", "-smp", "1",
        "-nodefaults", "-nographic", "-no-reboot", "-global", "virtio-mmio.force-legacy=false",
        "-serial", `file:${consolePath}`,
        "-kernel", kernel!, "-initrd", initrd,
        "-append", `console=ttyS0 panic=-1 tsc_early_khz=${Math.round(mhz * 1000)} cryptomgr.notests ${ip}`,
        "-netdev", `tap,id=n0,ifname=${slot.tapName},script=no,downscript=no`,
        "-device", `virtio-net-device,netdev=n0,mac=${slot.mac}`,
      ],
      { stdout: "ignore", stderr: "pipe" },
    );
    const con = await waitFor("the guest's marker line", () => {
      if (vm!.exitCode !== null) throw new Error(`the VM exited (${vm!.exitCode})`);
      const text = existsSync(consolePath) ? readFileSync(consolePath, "utf8") : "";
      return text.includes("@@GUEST-UP@@") && text;
    }, { timeoutMs: 90_000, maxIntervalMs: 200 });
    expect(con).toContain(`inet ${slot.guestIp}/30`);

    // node → hostIp:7000 → DNAT → guest; the guest then probes egress from inside the VM
    const ask = () => w.tcp(w.nodeNs, slot.hostIp, 7000, 20_000);
    // the guest's listener may start a moment after its marker line
    let r = await waitFor("the guest's listener on 7000", () => {
      const x = ask();
      return x.ok && x;
    }, { timeoutMs: 30_000, maxIntervalMs: 250 });
    expect(r.data).toContain("A=[hello 169.254.200.2:8080]");
    expect(r.data).not.toContain("hello 169.254.200.3");

    await agent.ok("update", { sandboxId: "vm-1", policy: { allowOut: ["169.254.200.3"] } });
    r = ask();
    expect(r.data).toContain("B=[hello 169.254.200.3:8080]");
    expect(r.data).not.toContain("hello 169.254.200.2");

    await agent.ok("update", { sandboxId: "vm-1", policy: { allow_internet_access: false } });
    r = ask();
    expect(r.data).not.toContain("hello");
    expect(r.data).toMatch(/^A=\[.+\] B=\[.+\] D=\[[1-9]\] C=\[.+\]/);

    // domain rule from a real guest: closed until the guest resolves the name through the slot
    await agent.ok("update", { sandboxId: "vm-1", policy: { allowOut: ["*.allowed.test"] } });
    r = ask();
    expect(r.data).toMatch(/^A=\[[^\]]*\] B=\[[^\]]*\] D=\[[1-9]\] C=\[hello 169.254.200.2:8080\]/);
    expect(r.data).not.toContain("A=[hello");
    expect(await agent.ok("dnsAllowed", { sandboxId: "vm-1" })).toEqual(["169.254.200.2"]);
  }, 150_000);
});
