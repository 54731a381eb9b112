/**
 * Snapshot/restore under real QEMU microvm/TCG: a guest (base template, guest kernel) runs a
 * counter printing to the serial console; the VM is paused, snapshotted (device state + RAM file),
 * stopped, and two clones are restored from the same files: each keeps counting from where the
 * original stopped, guest uptime continues, and the snapshot's memory file is not modified.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { resolveTemplate } from "../../../src/template/index.ts";
import { processStartTime, reapLeftovers, resolveKernelPath, type VmSpec } from "../../../src/vmm/index.ts";
import { TEST_HOME, testBoot, testConfig, testDriver, waitConsole, waitFor } from "./helpers.ts";

const drv = testDriver();
let dir: string;
let spec: (id: string) => VmSpec;

const COUNTER = /COUNTER (\d+) up=([\d.]+)/g;

function counters(path: string): { n: number; up: number }[] {
  const text = existsSync(path) ? readFileSync(path, "utf8") : "";
  return [...text.matchAll(COUNTER)].map((m) => ({ n: Number(m[1]), up: Number(m[2]) }));
}

function sha(path: string): string {
  return createHash("sha256").update(readFileSync(path)).digest("hex");
}

beforeAll(() => {
  const cfg = testConfig();
  const kernelPath = resolveKernelPath(cfg);
  const tpl = resolveTemplate(TEST_HOME, "base");
  dir = mkdtempSync(join(tmpdir(), "c1snap-"));
  const script = 'i=0; while :; do i=$((i+1)); echo "COUNTER $i up=$(cut -d" " -f1 /proc/uptime)"; sleep 0.2; done';
  // read-only template image: the counter needs no disk writes, and clones share it safely
  const boot = testBoot(tpl.rootfsPath, { readOnly: true, args: `aenv.envd=0 aenv.run=${btoa(script)}` });
  spec = (id) => ({
    id: `c1s${process.pid}${id}`,
    workDir: join(dir, id),
    kernelPath,
    bootArgs: boot.bootArgs,
    vcpus: 1,
    memoryMiB: 256,
    drives: boot.drives,
  });
});

afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
  drv.dispose();
});

describe("QEMU snapshot and restore", () => {
  test("a counter keeps counting after restore, in two clones of one snapshot", async () => {
    const vm = await drv.driver.boot(spec("orig"));
    const files = { statePath: join(dir, "vm.state"), memPath: join(dir, "vm.mem"), kind: "full" as const };
    let memSha = "";
    let last = { n: 0, up: 0 };
    try {
      await waitConsole(vm.consolePath, /COUNTER 5 /, 90_000);
      await expect(vm.snapshot(files)).rejects.toMatchObject({ code: "vmm.not_paused" });
      await vm.pause();
      await Bun.sleep(300);
      last = counters(vm.consolePath).at(-1)!;
      await vm.snapshot(files);
      // paused means paused: nothing was printed while the snapshot was written
      expect(counters(vm.consolePath).at(-1)).toEqual(last);
      expect(statSync(files.statePath).size).toBeGreaterThan(10_000);
      expect(statSync(files.statePath).size).toBeLessThan(4 << 20); // device state only: RAM stays in the memory file
      expect(statSync(files.memPath).size).toBe(256 << 20);
      memSha = sha(files.memPath);
      // the source may go on after a snapshot
      await vm.resume();
      await waitConsole(vm.consolePath, new RegExp(`COUNTER ${last.n + 2} `), 20_000);
    } finally {
      await vm.stop();
    }
    expect(vm.state).toBe("stopped");

    const c1 = await drv.driver.restore(spec("clone1"), files, { resume: true });
    const c2 = await drv.driver.restore(spec("clone2"), files, { resume: false });
    try {
      expect(c1.state).toBe("running");
      expect(c2.state).toBe("paused");
      expect([vm.memShared, c1.memShared, c2.memShared]).toEqual([true, false, false]); // clones map RAM copy-on-write
      expect(c1.memPath).toBe(files.memPath);
      await waitFor("clone1 to count 5 more", () => (counters(c1.consolePath).at(-1)?.n ?? 0) >= last.n + 5, 30_000);
      expect(counters(c2.consolePath)).toEqual([]); // still paused
      await c2.resume();
      await waitFor("clone2 to count 5 more", () => (counters(c2.consolePath).at(-1)?.n ?? 0) >= last.n + 5, 30_000);
      for (const c of [c1, c2]) {
        const seen = counters(c.consolePath);
        expect(seen[0]!.n).toBeGreaterThanOrEqual(last.n);
        expect(seen[0]!.n).toBeLessThanOrEqual(last.n + 1);
        expect(seen[0]!.up).toBeGreaterThanOrEqual(last.up); // guest uptime continues, no reboot
        expect(seen.map((s) => s.n)).toEqual(seen.map((_, i) => seen[0]!.n + i));
        expect(readFileSync(c.consolePath, "utf8")).not.toContain("@@AENV-INIT@@"); // no fresh boot: init ran only in the original
      }
      // a restored VM can itself be snapshotted and restored
      await c1.pause();
      const f2 = { statePath: join(dir, "c1.state"), memPath: join(dir, "c1.mem"), kind: "full" as const };
      await c1.snapshot(f2);
      const n1 = counters(c1.consolePath).at(-1)!.n;
      await c1.stop();
      const c3 = await drv.driver.restore(spec("clone3"), f2, { resume: true });
      try {
        await waitFor("clone3 to count on", () => (counters(c3.consolePath).at(-1)?.n ?? 0) >= n1 + 3, 30_000);
        expect(counters(c3.consolePath)[0]!.n).toBeLessThanOrEqual(n1 + 1);
      } finally {
        await c3.stop();
      }
    } finally {
      await c1.stop();
      await c2.stop();
    }
    expect(sha(files.memPath)).toBe(memSha); // clones mapped it copy-on-write
  }, 240_000);

  test("reapLeftovers at start kills a VMM a crashed node left running and removes its files", async () => {
    const vm = await drv.driver.boot(spec("orphan"));
    await waitConsole(vm.consolePath, /COUNTER 1 /, 90_000);
    // a new node process would only find the record in the runtime dir: reap from there
    expect(await reapLeftovers(drv.runtimeDir)).toEqual([vm.id]);
    expect(await vm.exited).toBeNull(); // SIGKILLed
    expect(processStartTime(vm.pid)).toBeNull();
    expect(existsSync(vm.memPath)).toBe(false);
    expect(existsSync(join(drv.runtimeDir, "vmm", `${vm.id}.json`))).toBe(false);
    expect(existsSync(join(drv.runtimeDir, "vmm", `${vm.id}.qmp`))).toBe(false);
  }, 120_000);

  test("restore reports missing snapshot files", async () => {
    await expect(
      drv.driver.restore(spec("none"), { statePath: join(dir, "absent.state"), memPath: join(dir, "absent.mem"), kind: "full" }, { resume: true }),
    ).rejects.toMatchObject({ code: "vmm.snapshot_missing" });
  });
});
