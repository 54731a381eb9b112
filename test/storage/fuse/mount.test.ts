// src/ffi/mount.ts: mountinfo parsing (proc(5) format) and the real mount(2)/umount2(2) error paths.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { listMounts, mount, MountError, umount2, MNT_DETACH } from "../../../src/ffi/mount.ts";

describe("mount ffi", () => {
  test("mountinfo lines parse, with octal escapes in paths", () => {
    const text = [
      "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
      "52 25 0:61 / /tmp/x/mnt rw,nosuid,nodev,relatime shared:300 - fuse.aenvdisk aenvdisk rw,user_id=0,group_id=0",
      "",
    ].join("\n");
    expect(listMounts(text)).toEqual([
      { dev: "98:0", mountPoint: "/mnt/with space", fstype: "ext3", source: "/dev/root" },
      { dev: "0:61", mountPoint: "/tmp/x/mnt", fstype: "fuse.aenvdisk", source: "aenvdisk" },
    ]);
  });

  test("this process's mount table includes /", () => {
    expect(listMounts().some((m) => m.mountPoint === "/")).toBe(true);
  });

  test("umount2 of a directory that is not a mount point returns EINVAL; a missing path ENOENT", () => {
    const dir = mkdtempSync("/tmp/aenv-mount-test-");
    try {
      expect(umount2(dir, MNT_DETACH)).toBe(22);
      expect(umount2(`${dir}/missing`, MNT_DETACH)).toBe(2);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("mount of an unknown filesystem type throws MountError with errno ENODEV", () => {
    const dir = mkdtempSync("/tmp/aenv-mount-test-");
    try {
      let err: unknown;
      try {
        mount("none", dir, "no-such-fs-type", 0, "");
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(MountError);
      expect((err as MountError).code).toBe("mount.failed");
      expect((err as MountError).details.errno).toBe(19);
      expect((err as MountError).details.target).toBe(dir);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("arguments with NUL bytes are refused before the syscall", () => {
    expect(() => mount("a\0b", "/tmp", "tmpfs", 0, "")).toThrow(MountError);
  });
});
