/**
 * The base template built by `agentenv template build-base` (scripts/test.sh pre-step) in the test
 * cache: its ext4 image holds Debian and a uid-1000 `user` but no init and no envd (VMs boot
 * through the tools drive, which the same build makes current); its overlaybd layer reads back
 * identical to the raw image; a second build is a cache hit.
 */
import { describe, expect, test } from "bun:test";
import { closeSync, mkdirSync, mkdtempSync, openSync, readSync, rmSync, statSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
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
    // login shells without forks (trimLoginProfiles): bash reads $EUID, root's mesg only on a terminal
    expect(debugfs(t.rootfsPath, "cat /etc/profile")).toContain('if [ "${EUID:-$(id -u)}" -eq 0 ]; then\n');
    expect(debugfs(t.rootfsPath, "cat /etc/profile")).not.toContain('"$(id -u)"');
    expect(debugfs(t.rootfsPath, "cat /root/.profile")).toContain("case $- in *i*) mesg n 2> /dev/null || true ;; esac\n");
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
      toolTimeoutMs: cfg.template.tool_timeout_ms,
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

  test("a rebuild adds a new layer and never rewrites the one templates and sandboxes stack on", async () => {
    const cfg = testConfig();
    const home = mkdtempSync(join(tmpdir(), "aenv-rebase-"));
    try {
      // the test home's mmdebstrap tree and tools drive: only mkfs + import run here
      mkdirSync(join(home, "templates"));
      symlinkSync(join(TEST_HOME, "templates", ".cache"), join(home, "templates", ".cache"));
      symlinkSync(join(TEST_HOME, "tools"), join(home, "tools"));
      const opts = { homePath: home, suite: cfg.template.suite, mirror: cfg.template.mirror, packages: cfg.template.packages, sizeMiB: 1024, toolTimeoutMs: cfg.template.tool_timeout_ms, tools: { ...cfg.tools, envd: cfg.envd } };
      const first = await buildBase(opts);
      const layer1 = join(home, "templates", "base", first.manifest.layers[0]!);
      const st1 = statSync(layer1);
      // same inputs, but the image is gone: built again (the same build key)
      rmSync(join(home, "templates", "base", "rootfs.ext4"));
      const second = await buildBase(opts);
      expect(second.built).toBe(true);
      expect(second.manifest.buildKey).toBe(first.manifest.buildKey);
      expect(second.manifest.layers).toHaveLength(1);
      expect(second.manifest.layers[0]).not.toBe(first.manifest.layers[0]);
      expect(second.manifest.layers[0]).toMatch(new RegExp(`^rootfs-${first.manifest.buildKey}-[0-9a-f]{8}\\.layer$`));
      // the first layer is the same file, untouched
      const again = statSync(layer1);
      expect([again.ino, again.size, again.mtimeMs]).toEqual([st1.ino, st1.size, st1.mtimeMs]);
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  }, 300_000);
});
