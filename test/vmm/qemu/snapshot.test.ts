/**
 * Snapshot/restore under real QEMU microvm/TCG: a guest (base template, guest kernel) runs a
 * counter printing to the serial console; the VM is paused, captured (device state without RAM +
 * its shared RAM file, copied as the memory image), stopped, and two clones are restored from the
 * same files: each keeps counting from where the original stopped, guest uptime continues, and
 * the memory image is not modified. A restored clone captured again yields a device state just as
 * small (its privately mapped RAM is filtered out of QEMU's stream) plus only the pages it
 * changed, and a restore from the image with those pages applied continues its count.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { closeSync, copyFileSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { resolveTemplate } from "../../../src/template/index.ts";
import { processStartTime, reapLeftovers, resolveKernelPath, type VmSpec } from "../../../src/vmm/index.ts";
import { TEST_HOME, testBoot, testConfig, testDriver, waitConsole } from "./helpers.ts";
import { waitFor } from "../../helpers/wait.ts";

// restores map plain copies of the RAM file: no free page reporting balloon, whose discards
// would punch them (the driver refuses that; test/vmm/qemu/balloon.test.ts restores with one)
const drv = testDriver({ AENV__qemu__free_page_reporting: "false" });
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
      await expect(vm.captureSnapshot(files.statePath)).rejects.toMatchObject({ code: "vmm.not_paused" });
      await vm.pause();
      await Bun.sleep(300);
      last = counters(vm.consolePath).at(-1)!;
      const cap = await vm.captureSnapshot(files.statePath);
      // a booted VM's RAM is its shared file: the capture names it, the caller copies it
      expect(cap).toMatchObject({ kind: "file", path: vm.memPath, overParent: false });
      copyFileSync(vm.memPath, files.memPath);
      cap.release();
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
      await waitFor("clone1 to count 5 more", () => (counters(c1.consolePath).at(-1)?.n ?? 0) >= last.n + 5, { timeoutMs: 30_000 });
      expect(counters(c2.consolePath)).toEqual([]); // still paused
      await c2.resume();
      await waitFor("clone2 to count 5 more", () => (counters(c2.consolePath).at(-1)?.n ?? 0) >= last.n + 5, { timeoutMs: 30_000 });
      for (const c of [c1, c2]) {
        const seen = counters(c.consolePath);
        expect(seen[0]!.n).toBeGreaterThanOrEqual(last.n);
        expect(seen[0]!.n).toBeLessThanOrEqual(last.n + 1);
        expect(seen[0]!.up).toBeGreaterThanOrEqual(last.up); // guest uptime continues, no reboot
        expect(seen.map((s) => s.n)).toEqual(seen.map((_, i) => seen[0]!.n + i));
        expect(readFileSync(c.consolePath, "utf8")).not.toContain("@@AENV-INIT@@"); // no fresh boot: init ran only in the original
      }
      // a restored VM captured again: small state, only the pages it changed
      await c1.pause();
      const f2 = { statePath: join(dir, "c1.state"), memPath: join(dir, "c1.mem"), kind: "full" as const };
      const cap = await c1.captureSnapshot(f2.statePath);
      if (cap.kind !== "changed") throw new Error(`expected a changed-pages capture, got ${cap.kind}`);
      const changed = cap.ranges.reduce((a, [x, y]) => a + (y - x), 0);
      expect(statSync(f2.statePath).size).toBeLessThan(4 << 20); // QEMU streamed 256 MiB of private RAM; the filter kept none
      expect(changed).toBeGreaterThan(0);
      expect(changed).toBeLessThan(64 << 20); // a counter changes a few MiB, not the guest's 256
      for (const [a, b] of cap.ranges) expect(a % 4096 === 0 && b % 4096 === 0 && b > a).toBe(true);
      // the memory of the next restore: the image with the changed pages on top
      copyFileSync(files.memPath, f2.memPath);
      const fd = openSync(f2.memPath, "r+");
      for (const [a, b] of cap.ranges) {
        const buf = new Uint8Array(b - a);
        cap.read(buf, a);
        writeSync(fd, buf, 0, buf.length, a);
      }
      closeSync(fd);
      cap.release();
      const n1 = counters(c1.consolePath).at(-1)!.n;
      await c1.stop();
      const c3 = await drv.driver.restore(spec("clone3"), f2, { resume: true });
      try {
        await waitFor("clone3 to count on", () => (counters(c3.consolePath).at(-1)?.n ?? 0) >= n1 + 3, { timeoutMs: 30_000 });
        expect(counters(c3.consolePath)[0]!.n).toBeLessThanOrEqual(n1 + 1);
        expect(counters(c3.consolePath)[0]!.n).toBeGreaterThanOrEqual(n1);
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
