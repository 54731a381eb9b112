/**
 * The base template built by `agentenv template build-base` (scripts/test.sh pre-step) in the test
 * cache: its ext4 image holds Debian and a uid-1000 `user` but no init and no envd (VMs boot
 * through the tools drive, which the same build makes current); its overlaybd layer reads back
 * identical to the raw image; a second build is a cache hit.
 */
import { describe, expect, test } from "bun:test";
import { closeSync, openSync, readSync } from "node:fs";
import { join } from "node:path";
import { openStack } from "../../src/storage/overlaybd/index.ts";
import { BASE_BOOT_ARGS, buildBase, readManifest, resolveTemplate } from "../../src/template/index.ts";
import { resolveTools } from "../../src/tools/index.ts";
import { TEST_HOME, testConfig } from "../vmm/qemu/helpers.ts";

function debugfs(img: string, req: string): string {
  const r = Bun.spawnSync(["debugfs", "-R", req, img], { stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`debugfs ${req}: ${r.stderr.toString()}`);
  return r.stdout.toString();
}

describe("base template", () => {
  test("image contents: user account, hosts; no init and no envd of its own", () => {
    const t = resolveTemplate(TEST_HOME, "base");
    expect(t.bootArgs).toBe(BASE_BOOT_ARGS);
    expect(BASE_BOOT_ARGS).toBe("");
    expect(debugfs(t.rootfsPath, "stat /sbin/aenv-init")).toBe(""); // not found (debugfs says so on stderr)
    expect(debugfs(t.rootfsPath, "stat /usr/local/bin/agentenv")).toBe("");
    expect(debugfs(t.rootfsPath, "cat /etc/passwd")).toMatch(/^user:x:1000:1000::\/home\/user:\/bin\/bash$/m);
    expect(debugfs(t.rootfsPath, "cat /etc/passwd")).toMatch(/^root:x:0:0:/m);
    expect(debugfs(t.rootfsPath, "stat /home/user")).toMatch(/User:\s+1000\s+Group:\s+1000/);
    expect(debugfs(t.rootfsPath, "cat /etc/sudoers.d/user")).toBe("user ALL=(ALL:ALL) NOPASSWD: ALL\n");
    expect(debugfs(t.rootfsPath, "cat /etc/hosts")).toContain("127.0.0.1\tlocalhost\n");
    expect(debugfs(t.rootfsPath, "cat /etc/resolv.conf")).toBe("# written by the guest init at boot\n"); // no build-host resolver
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
      tools: { ...cfg.tools, envd: cfg.envd },
    };
    // the first run rebuilds only if sources changed since the pre-step (shared work tree)
    const first = await buildBase(opts);
    const phases: string[] = [];
    const again = await buildBase({ ...opts, onProgress: (p) => phases.push(p) });
    expect(again.built).toBe(false);
    expect(phases).toEqual(["tools cached", "cached"]);
    expect(again.manifest).toEqual(first.manifest);
    expect(again.manifest).toEqual(readManifest(TEST_HOME, "base"));
    // the build made its tools drive the current one
    expect(again.tools).toEqual(first.tools);
    expect(resolveTools(TEST_HOME)).toEqual(first.tools);
  }, 300_000);
});
