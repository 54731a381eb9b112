/**
 * Shared pieces of the VM tests: the test configuration (fixed cache dir so the kernel and the
 * base template are built once per machine by scripts/test.sh), a QEMU driver with private
 * runtime and memory dirs, console waits, and a minimal per-VM network: a netns holding the tap
 * and a veth to the host, all on 169.254.0.0/16, so the test process reaches the guest directly.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig, type Config } from "../../../src/config/index.ts";
import { resolveTools, toolsBoot, type ToolsBoot } from "../../../src/tools/index.ts";
import { QemuDriver, qemuOptions, type NetSpec } from "../../../src/vmm/index.ts";
import { waitFor } from "../../helpers/wait.ts";

/** Data directory the test builds live in (scripts/test.sh exports the same). */
export const TEST_HOME = process.env.AENV_TEST_HOME_PATH ?? "/var/lib/agentenv-test";

/** Config as the tests see it: defaults + AENV_HOME_PATH=TEST_HOME. */
export function testConfig(extra: Record<string, string> = {}): Config {
  return loadConfig({ env: { ...process.env, AENV_HOME_PATH: TEST_HOME, ...extra } });
}

/**
 * Drives and kernel arguments that boot `rootDisk` through the test home's tools drive (built by
 * the scripts/test.sh pre-step with the base template), as sandboxes boot.
 */
export function testBoot(rootDisk: string, o: { readOnly?: boolean; args?: string } = {}): ToolsBoot {
  return toolsBoot(resolveTools(TEST_HOME).path, rootDisk, o.args ?? "", { rootReadOnly: o.readOnly });
}

/**
 * A QEMU driver whose records, sockets and RAM files live in fresh temp dirs; `dispose()` removes
 * them. `extra`: config overrides (AENV__section__key), e.g. no free page reporting for tests that
 * restore from plain memory files (the driver refuses those with the balloon: `punchSafe`).
 */
export function testDriver(extra: Record<string, string> = {}): { driver: QemuDriver; runtimeDir: string; dispose: () => void } {
  const runtimeDir = mkdtempSync(join(tmpdir(), "c1rt-"));
  const memoryDir = mkdtempSync("/dev/shm/c1mem-");
  const driver = new QemuDriver({ ...qemuOptions(testConfig(extra)), runtimeDir, memoryDir });
  return {
    driver,
    runtimeDir,
    dispose: () => {
      rmSync(runtimeDir, { recursive: true, force: true });
      rmSync(memoryDir, { recursive: true, force: true });
    },
  };
}

/** Wait until the console file matches `re`; returns the match. */
export async function waitConsole(path: string, re: RegExp, timeoutMs: number): Promise<RegExpMatchArray> {
  return await waitFor(`console ${path} to match ${re}`, () => {
    try {
      return readFileSync(path, "utf8").match(re);
    } catch {
      return null;
    }
  }, { timeoutMs });
}

function sh(cmd: string[]): string {
  const r = Bun.spawnSync(cmd, { stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`${cmd.join(" ")} failed: ${r.stderr.toString()}`);
  return r.stdout.toString();
}

/**
 * A VM network for tests: netns `c1t<pid>-<o>` with tap0 169.254.<o>.22/30 (guest .21) and veth
 * `veth0` 169.254.<o>.26/30 whose host end (.25) routes the tap link, so the test process talks
 * to the guest at `guestIp`. `<o>` is picked at random among /24s no route uses yet, so test
 * processes running at the same time (another checkout, CI) do not collide. No NAT, no other
 * addresses.
 */
export class TestNet {
  readonly netnsName: string;
  readonly hostVeth: string;
  readonly spec: NetSpec;

  constructor() {
    const used = sh(["ip", "-4", "route", "show"]);
    let o = 0;
    for (let i = 0; i < 100 && !o; i++) {
      const c = 20 + Math.floor(Math.random() * 230);
      if (!used.includes(`169.254.${c}.`)) o = c;
    }
    if (!o) throw new Error("no free 169.254.x.0/24 for a test network");
    this.netnsName = `c1t${process.pid}-${o}`;
    this.hostVeth = `c1h${o}-${process.pid % 100000}`;
    const net = `169.254.${o}`;
    this.spec = {
      netnsPath: `/run/netns/${this.netnsName}`,
      tapName: "tap0",
      mac: `02:c1:00:00:00:${o.toString(16).padStart(2, "0")}`,
      guestIp: `${net}.21`,
      gatewayIp: `${net}.22`,
      prefixLen: 30,
    };
    const ns = ["ip", "-n", this.netnsName];
    try {
      sh(["ip", "netns", "add", this.netnsName]);
      sh([...ns, "link", "set", "lo", "up"]);
      sh([...ns, "tuntap", "add", "dev", "tap0", "mode", "tap"]);
      sh([...ns, "addr", "add", `${net}.22/30`, "dev", "tap0"]);
      sh([...ns, "link", "set", "tap0", "up"]);
      sh(["ip", "link", "add", this.hostVeth, "type", "veth", "peer", "name", "veth0", "netns", this.netnsName]);
      sh(["ip", "addr", "add", `${net}.25/30`, "dev", this.hostVeth]);
      sh(["ip", "link", "set", this.hostVeth, "up"]);
      sh([...ns, "addr", "add", `${net}.26/30`, "dev", "veth0"]);
      sh([...ns, "link", "set", "veth0", "up"]);
      sh(["ip", "netns", "exec", this.netnsName, "sysctl", "-qw", "net.ipv4.ip_forward=1"]);
      sh(["ip", "route", "add", `${net}.20/30`, "via", `${net}.26`, "dev", this.hostVeth]);
    } catch (e) {
      this.destroy();
      throw e;
    }
  }

  /** Base URL of a guest TCP port. */
  url(port: number): string {
    return `http://${this.spec.guestIp}:${port}`;
  }

  /** Delete the netns (its tap and veth end go with it, and so do the host veth and route). */
  destroy(): void {
    Bun.spawnSync(["ip", "link", "del", this.hostVeth], { stderr: "ignore" });
    Bun.spawnSync(["ip", "netns", "del", this.netnsName], { stderr: "ignore" });
  }
}
