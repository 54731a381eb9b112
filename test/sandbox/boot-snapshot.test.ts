/**
 * Boot snapshots without a VM: which boot snapshot a shape (vCPUs, memory, volume slots) finds
 * in a repository, the restore's guards that fire before anything is started, and the guest
 * scripts that find and re-probe volume drives, run by the real dash and busybox sh against a
 * made-up /sys/block, /sys/bus and /dev in a mount namespace of their own (root).
 */
import { afterEach, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { LocalRepository, type SnapshotManifest } from "../../src/snapshot/index.ts";
import { commitFake } from "../snapshot/helpers.ts";
import { bootShapeKey, findBootSnapshot, reprobeVolumesInGuest, staleBootSnapshots, restoreBootSnapshot, type BootRestoreDeps } from "../../src/sandbox/boot-snapshot.ts";
import { FIND_DEV_SH, MOUNT_SCRIPT, REPROBE_SCRIPT } from "../../src/sandbox/volumes.ts";
import type { VmSpec } from "../../src/vmm/index.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
const tmp = (p: string) => {
  const d = mkdtempSync(join(tmpdir(), p));
  dirs.push(d);
  return d;
};

const KEYS = { driver: "qemu" as const, machineKey: "00000000000000a1", kernelKey: "k1", toolsImage: "/x/tools/t1/tools.img" };

/** Publish a boot manifest of `vcpus`/`memoryMiB` with `volumeSlots` (undefined: the field is absent). */
function commitBoot(repo: LocalRepository, vcpus: number, memoryMiB: number, volumeSlots: number | undefined): SnapshotManifest {
  return commitFake(repo, {
    kind: "boot",
    sandboxId: null,
    disk: [`disk-${Math.random()}`],
    memory: [`mem-${Math.random()}`],
    vm: { vcpus, memoryMiB, kernelKey: KEYS.kernelKey, machine: KEYS.machineKey, ...(volumeSlots === undefined ? {} : { volumeSlots }) },
    tools: { content: `tools-${Math.random()}`, key: "t1" },
  });
}

describe("finding a boot snapshot", () => {
  test("a shape finds only the boot snapshot of its vCPUs, memory and number of volume slots; no field = 0 slots", () => {
    const repo = new LocalRepository(join(tmp("bootsnap-"), "snapshots"), { verifyDigests: true, gcGraceMs: 0 });
    const none = commitBoot(repo, 1, 512, undefined);
    const two = commitBoot(repo, 1, 512, 2);
    const other = commitBoot(repo, 2, 512, 2);
    expect(findBootSnapshot(repo, { vcpus: 1, memoryMiB: 512 }, KEYS)?.id).toBe(none.id);
    expect(findBootSnapshot(repo, { vcpus: 1, memoryMiB: 512, volumeSlots: 0 }, KEYS)?.id).toBe(none.id);
    expect(findBootSnapshot(repo, { vcpus: 1, memoryMiB: 512, volumeSlots: 2 }, KEYS)?.id).toBe(two.id);
    expect(findBootSnapshot(repo, { vcpus: 2, memoryMiB: 512, volumeSlots: 2 }, KEYS)?.id).toBe(other.id);
    expect(findBootSnapshot(repo, { vcpus: 1, memoryMiB: 512, volumeSlots: 1 }, KEYS)).toBeUndefined();
    // another kernel, tools drive or machine (QEMU command line, devices): none is current
    expect(findBootSnapshot(repo, { vcpus: 1, memoryMiB: 512 }, { ...KEYS, kernelKey: "k2" })).toBeUndefined();
    expect(findBootSnapshot(repo, { vcpus: 1, memoryMiB: 512 }, { ...KEYS, machineKey: "00000000000000a2" })).toBeUndefined();
    expect(staleBootSnapshots(repo, { ...KEYS, machineKey: "00000000000000a2" }).map((m) => m.id).sort()).toEqual([none.id, two.id, other.id].sort());
    expect(staleBootSnapshots(repo, KEYS)).toEqual([]);
    expect(findBootSnapshot(repo, { vcpus: 1, memoryMiB: 512 }, { ...KEYS, toolsImage: "/x/tools/t2/tools.img" })).toBeUndefined();
    // the newest of equal shapes
    const newer = commitBoot(repo, 1, 512, 2);
    expect(findBootSnapshot(repo, { vcpus: 1, memoryMiB: 512, volumeSlots: 2 }, KEYS)?.id).toBe(newer.id);
  });

  test("shape keys tell slot counts apart and keep the key of a shape without volumes", () => {
    expect(bootShapeKey({ vcpus: 1, memoryMiB: 512 })).toBe("1c512m");
    expect(bootShapeKey({ vcpus: 1, memoryMiB: 512, volumeSlots: 0 })).toBe("1c512m");
    expect(bootShapeKey({ vcpus: 1, memoryMiB: 512, volumeSlots: 3 })).toBe("1c512m3v");
  });
});

describe("restore guards", () => {
  /** Dependencies that fail the test if the restore gets as far as using them. */
  const untouched = (): BootRestoreDeps => {
    const no = () => {
      throw new Error("the restore went on past its guard");
    };
    return { repo: { layerPath: no } as never, images: { acquire: no } as never, driver: { restore: no, boot: no } as never, envdPollMs: 10, log: pino({ level: "silent" }) };
  };
  const spec = (volumes: number): VmSpec =>
    ({
      id: "sbx",
      drives: [
        { id: "tools", path: "/t", readOnly: true, isRoot: false },
        { id: "root", path: "/r", readOnly: false, isRoot: true },
        ...Array.from({ length: volumes }, (_, i) => ({ id: `vol${i}`, path: `/v${i}`, readOnly: false, isRoot: false, serial: `v${i}` })),
      ],
    }) as unknown as VmSpec;

  test("a VM with another number of volume drives than the snapshot's slots is refused before anything starts", async () => {
    const repo = new LocalRepository(join(tmp("bootsnap-"), "snapshots"), { verifyDigests: true, gcGraceMs: 0 });
    const snap = commitBoot(repo, 1, 512, 1);
    for (const n of [0, 2]) {
      const e = await restoreBootSnapshot(untouched(), snap, spec(n), "http://127.0.0.1:1", AbortSignal.timeout(5000)).catch((x) => x);
      expect(e).toMatchObject({ code: "orchestrator.runtime_failed" });
      expect(String(e.message)).toContain(`has ${n} volume drives, boot snapshot ${snap.id} has 1 places`);
    }
  });

  test("a volume drive without a serial cannot be re-probed: refused before envd is asked", async () => {
    // nothing listens on port 1: a request would fail as envd_failed, not runtime_failed
    const e = await reprobeVolumesInGuest("http://127.0.0.1:1", ["v0", undefined], AbortSignal.timeout(5000)).catch((x) => x);
    expect(e).toMatchObject({ code: "orchestrator.runtime_failed" });
    expect(String(e.message)).toContain("no serial");
  });
});

describe("guest scripts for volume drives", () => {
  const shells = [
    ["dash", ["dash"]],
    ["busybox sh", ["busybox", "sh"]],
  ] as const;

  /**
   * Run `script` with `args` under `shell` in a mount namespace of its own in which /sys/block,
   * /sys/bus and /dev are tmpfs: vda (serial "rootdisk", with a final newline), vdb (serial
   * "vol-a", none) and vdc (no serial file), each a link to a virtio device
   * directory; /dev/vdb a block device node. Prints the virtio_blk unbind/bind files after it.
   */
  function inFakeSys(shell: readonly string[], script: string, args: string[]): { code: number; out: string; err: string } {
    const setup = `
set -e
mount -t tmpfs none /sys/block; mount -t tmpfs none /sys/bus; mount -t tmpfs none /dev
mkdir -p /sys/bus/virtio/devices/virtio1 /sys/bus/virtio/devices/virtio2 /sys/bus/virtio/devices/virtio3 /sys/bus/virtio/drivers/virtio_blk
for d in vda:virtio1 vdb:virtio2 vdc:virtio3; do mkdir /sys/block/\${d%%:*}; ln -s /sys/bus/virtio/devices/\${d#*:} /sys/block/\${d%%:*}/device; done
printf 'rootdisk\\n' > /sys/block/vda/serial; printf 'vol-a' > /sys/block/vdb/serial
mknod /dev/vdb b 254 16
set +e
`;
    const r = Bun.spawnSync(["unshare", "-m", "--propagation", "private", "sh", "-c", `${setup}\ns=$1; shift; "$0" ${shell.slice(1).join(" ")} -c "$s" sh "$@"; rc=$?; for f in unbind bind; do [ -f /sys/bus/virtio/drivers/virtio_blk/$f ] && echo "$f=$(cat /sys/bus/virtio/drivers/virtio_blk/$f)"; done; exit $rc`, shell[0], script, ...args]);
    return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() };
  }

  for (const [name, shell] of shells) {
    test(`${name}: find_dev matches a serial with or without a final newline, and only a whole one`, () => {
      const probe = `${FIND_DEV_SH}\nfor id in "$@"; do find_dev "$id"; echo "$id=[$dev]"; done`;
      const r = inFakeSys(shell, probe, ["rootdisk", "vol-a", "vol", "", "vol-a-b"]);
      expect(r.err).toBe("");
      expect(r.code).toBe(0);
      expect(r.out).toBe("rootdisk=[vda]\nvol-a=[vdb]\nvol=[]\n=[]\nvol-a-b=[]\n");
    });

    test(`${name}: the re-probe unbinds and binds the drive's virtio device; an unknown serial exits 2 and touches nothing`, () => {
      const ok = inFakeSys(shell, REPROBE_SCRIPT, ["vol-a"]);
      expect(ok.err).toBe("");
      expect(ok.code).toBe(0);
      expect(ok.out).toBe("unbind=virtio2\nbind=virtio2\n");
      const missing = inFakeSys(shell, REPROBE_SCRIPT, ["vol-a", "nosuch"]);
      expect(missing.code).toBe(2);
      expect(missing.err).toContain("no drive with serial nosuch");
      // the drives before it were re-probed; nothing was waited for
      expect(missing.out).toBe("unbind=virtio2\nbind=virtio2\n");
      const none = inFakeSys(shell, REPROBE_SCRIPT, ["nosuch"]);
      expect(none.code).toBe(2);
      expect(none.out).toBe("");
    });

    test(`${name}: the mount script parses and stops at an unknown serial with exit 2`, () => {
      expect(Bun.spawnSync([...shell, "-n", "-c", MOUNT_SCRIPT]).exitCode).toBe(0);
      const r = inFakeSys(shell, MOUNT_SCRIPT, ["nosuch", "/mnt/x", "rw"]);
      expect(r.code).toBe(2);
      expect(r.err).toContain("no drive with serial nosuch");
    });
  }
});
