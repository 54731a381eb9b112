/**
 * The base template built by `agentenv template build-base` (scripts/test.sh pre-step) in the test
 * cache: its ext4 image holds our init, the compiled agentenv binary and a uid-1000 `user`; its
 * overlaybd layer reads back identical to the raw image; a second build is a cache hit.
 */
import { describe, expect, test } from "bun:test";
import { closeSync, openSync, readSync } from "node:fs";
import { join } from "node:path";
import { openStack } from "../../src/storage/overlaybd/index.ts";
import { BASE_BOOT_ARGS, buildBase, GUEST_LIB_DIR, guestBinaries, guestInitScript, readManifest, resolveTemplate } from "../../src/template/index.ts";
import { TEST_HOME, testConfig } from "../vmm/qemu/helpers.ts";

function debugfs(img: string, req: string): string {
  const r = Bun.spawnSync(["debugfs", "-R", req, img], { stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`debugfs ${req}: ${r.stderr.toString()}`);
  return r.stdout.toString();
}

describe("base template", () => {
  test("image contents: init, agentenv, user account, hosts", () => {
    const t = resolveTemplate(TEST_HOME, "base");
    expect(t.bootArgs).toBe(BASE_BOOT_ARGS);
    expect(debugfs(t.rootfsPath, "cat /sbin/aenv-init")).toBe(guestInitScript());
    expect(debugfs(t.rootfsPath, "stat /sbin/aenv-init")).toMatch(/Mode:\s+0755/);
    const bin = debugfs(t.rootfsPath, "stat /usr/local/bin/agentenv");
    expect(bin).toMatch(/Mode:\s+0755/);
    expect(Number(/Size: (\d+)/.exec(bin)![1])).toBeGreaterThan(50 << 20); // a bun --compile binary
    expect(debugfs(t.rootfsPath, "cat /etc/passwd")).toMatch(/^user:x:1000:1000::\/home\/user:\/bin\/bash$/m);
    expect(debugfs(t.rootfsPath, "cat /etc/passwd")).toMatch(/^root:x:0:0:/m);
    expect(debugfs(t.rootfsPath, "stat /home/user")).toMatch(/User:\s+1000\s+Group:\s+1000/);
    expect(debugfs(t.rootfsPath, "cat /etc/sudoers.d/user")).toBe("user ALL=(ALL:ALL) NOPASSWD: ALL\n");
    expect(debugfs(t.rootfsPath, "cat /etc/hosts")).toContain("127.0.0.1\tlocalhost\n");
    expect(debugfs(t.rootfsPath, "cat /etc/resolv.conf")).toBe("# written by /sbin/aenv-init at boot\n"); // no build-host resolver
    expect(debugfs(t.rootfsPath, "cat /etc/debian_version")).toMatch(/^12\.\d+\n$/);
    expect(debugfs(t.rootfsPath, "stat /usr/bin/python3")).toContain("Type: symlink");
  });

  test("the overlaybd layer reads back the same bytes as the raw image", async () => {
    const t = resolveTemplate(TEST_HOME, "base");
    const img = await openStack({ lowers: t.rootLayers });
    const fd = openSync(t.rootfsPath, "r");
    try {
      expect(img.size).toBe(t.diskBytes);
      const a = Buffer.alloc(1 << 20);
      const b = Buffer.alloc(1 << 20);
      // superblock region, and spots across the disk (data and holes)
      for (const off of [0, 1 << 20, 64 << 20, 300 << 20, t.diskBytes - (1 << 20)]) {
        await img.pread(a, off);
        readSync(fd, b, 0, b.length, off);
        expect(a.equals(b)).toBe(true);
      }
    } finally {
      closeSync(fd);
      await img.close();
    }
  });

  test("build-base is idempotent: a second run is a cache hit", async () => {
    const cfg = testConfig();
    const opts = {
      homePath: TEST_HOME,
      suite: cfg.template.suite,
      mirror: cfg.template.mirror,
      packages: cfg.template.packages,
      sizeMiB: cfg.template.rootfs_size_mib,
    };
    // the first run rebuilds only if sources changed since the pre-step (shared work tree)
    const first = await buildBase(opts);
    const phases: string[] = [];
    const t0 = performance.now();
    const again = await buildBase({ ...opts, onProgress: (p) => phases.push(p) });
    expect(again.built).toBe(false);
    expect(phases).toEqual(["cached"]);
    expect(again.manifest).toEqual(first.manifest);
    expect(again.manifest).toEqual(readManifest(TEST_HOME, "base"));
    expect(performance.now() - t0).toBeLessThan(10_000);
  }, 300_000);
});

test("guestBinaries: envd for images is the base template's binary pointed at its own glibc loader", () => {
  const home = require("node:fs").mkdtempSync(join(require("node:os").tmpdir(), "aenv-guest-"));
  try {
    // a home whose templates/ is the test cache (as e2e nodes have it)
    require("node:fs").symlinkSync(join(TEST_HOME, "templates"), join(home, "templates"));
    const g = guestBinaries(home);
    const run = (cmd: string[]) => Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe" });
    expect(run(["patchelf", "--print-interpreter", g.agentenvPath]).stdout.toString().trim()).toBe(`${GUEST_LIB_DIR}/ld-linux-x86-64.so.2`);
    expect(run(["patchelf", "--print-rpath", g.agentenvPath]).stdout.toString().trim()).toBe(GUEST_LIB_DIR);
    const libs = require("node:fs").readdirSync(g.libDir).sort();
    expect(libs).toContain("libc.so.6");
    expect(libs).toContain("ld-linux-x86-64.so.2");
    // it runs with exactly those libraries: the loader from the lib dir, no system search path
    const r = run([join(g.libDir, "ld-linux-x86-64.so.2"), "--inhibit-cache", "--library-path", g.libDir, g.agentenvPath, "version"]);
    expect(r.exitCode).toBe(0);
    expect(guestBinaries(home).key).toBe(g.key); // cached
    // the static busybox for images without a shell (busybox-static is installed here)
    expect(run(["ldd", g.busyboxPath!]).exitCode).not.toBe(0);
    expect(run([g.busyboxPath!, "echo", "static"]).stdout.toString()).toBe("static\n");
  } finally {
    require("node:fs").rmSync(home, { recursive: true, force: true });
  }
});
