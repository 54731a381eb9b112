import { expect, test } from "bun:test";
import { parseVmState, VM_STATE_CODEC, VM_STATE_VERSION } from "../../src/sandbox/vm-state.ts";

const ok = {
  workDir: "/w/s1",
  rootDisk: "/w/s1/mnt/root.img",
  mac: "02:fc:00:00:00:01",
  base: "abcdefghij0123456789",
  coldBoot: false,
  toolsImage: "/w/snapshots/layers/00ff",
  vmmPid: 42,
  vcpus: 1,
  memoryMiB: 512,
  envdToken: "t0k",
  envdVersion: "0.6.4",
  template: { rootLayers: ["/w/templates/base/rootfs.layer"], boot: { envs: { A: "1" }, workdir: "/app", user: "user", startCmd: "", readyCmd: "" } },
};

test("a stored runtime state is parsed: valid ones pass unchanged, JSON round trips included", () => {
  // an unversioned state (written before versions) and a version 1 one read as version 2 without `held`
  const v2 = { ...ok, version: 2 as const };
  expect(parseVmState("s1", ok)).toEqual(v2);
  expect(parseVmState("s1", { ...ok, version: 1 })).toEqual(v2);
  const paused = { ...ok, rootDisk: "", vmmPid: undefined, paused: "zzzzzzzzzz0123456789" };
  const { vmmPid: _, ...rest } = ok;
  expect(parseVmState("s1", JSON.parse(JSON.stringify(paused)))).toEqual({ ...rest, version: 2 as const, rootDisk: "", paused: paused.paused });
  // version 2: what the running VM holds, for the next node to take it over
  const held = { vmmStartTime: 123456, controlSocket: "/run/aenv/vmm/s1.qmp", slot: 3, rootExport: "s1", volumeExports: ["s1-vol-v1"], memoryImages: ["0123456789abcdef"] };
  expect(parseVmState("s1", JSON.parse(JSON.stringify({ ...v2, held })))).toEqual({ ...v2, held });
  // a VM booted without a tools drive, an open envd
  expect(parseVmState("s1", { ...ok, toolsImage: undefined, envdToken: null })).toMatchObject({ coldBoot: false, envdToken: null });
  // a cold boot restored from a boot snapshot: its memory layers, tools drive and kernel
  const layer = { digest: `sha256:${"ab".repeat(32)}`, size: 4096 };
  const booted = { ...ok, coldBoot: true, bootSnapshot: { id: "bootbootbootboot0000", memory: [layer], tools: layer, kernelKey: "0123456789abcdef" } };
  expect(parseVmState("s1", JSON.parse(JSON.stringify(booted)))).toEqual({ ...booted, version: 2 as const });
  expect(parseVmState("s1", { ...ok, version: VM_STATE_VERSION })).toEqual(v2);
  expect(VM_STATE_CODEC.parse("s1", ok)).toEqual(v2);
  // a sandbox of a user snapshot: no template layers, no process defaults
  expect(parseVmState("s1", { ...ok, template: { rootLayers: [], boot: null } }).template).toEqual({ rootLayers: [], boot: null });
});

test("a damaged or foreign state is orchestrator.bad_runtime_state naming the field", () => {
  const cases: [unknown, string][] = [
    [{ ...ok, base: "../etc" }, "/base"],
    [{ ...ok, rootDisk: 7 }, "/rootDisk"],
    [{ ...ok, workDir: undefined }, "/workDir"],
    [{ ...ok, vmmPid: -1 }, "/vmmPid"],
    [{ ...ok, paused: "nope" }, "/paused"],
    [{ ...ok, coldBoot: "yes" }, "/coldBoot"],
    [{ ...ok, envdToken: undefined }, "/envdToken"],
    [{ ...ok, template: undefined }, "/template"],
    [{ ...ok, template: { rootLayers: [""], boot: null } }, "/template/rootLayers/0"],
    [{ ...ok, bootSnapshot: { id: "nope", memory: [{ digest: "sha256:x", size: 1 }], tools: { digest: "sha256:x", size: 1 }, kernelKey: "k" } }, "/bootSnapshot/id"],
    [{ ...ok, bootSnapshot: { id: "bootbootbootboot0000", memory: [], tools: { digest: "sha256:x", size: 1 }, kernelKey: "k" } }, "/bootSnapshot/memory"],
    // a version this code does not know (written by a newer node)
    [{ ...ok, version: 3 }, "/version"],
    // what a running VM holds, damaged
    [{ ...ok, version: 2, held: { vmmStartTime: 1, controlSocket: "/s", slot: -1, rootExport: "s1", volumeExports: [], memoryImages: [] } }, "/held/slot"],
    [{ ...ok, version: 2, held: { vmmStartTime: 1, controlSocket: "/s", slot: 0, rootExport: "", volumeExports: [], memoryImages: [] } }, "/held/rootExport"],
    [{ ...ok, version: 2, held: { vmmStartTime: 1, controlSocket: "/s", slot: 0, rootExport: "s1", volumeExports: [], memoryImages: ["../x"] } }, "/held/memoryImages/0"],
    [{ ...ok, version: "1" }, "/version"],
  ];
  for (const [raw, field] of cases) {
    let err: unknown;
    try {
      parseVmState("s2", raw);
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ code: "orchestrator.bad_runtime_state", details: { sandboxId: "s2", field } });
    expect((err as Error).message).toStartWith(`sandbox s2: stored runtime state ${field}: `);
  }
  expect(() => parseVmState("s3", null)).toThrow(expect.objectContaining({ code: "orchestrator.bad_runtime_state" }));
  expect(() => parseVmState("s3", "a string")).toThrow(expect.objectContaining({ code: "orchestrator.bad_runtime_state" }));
  // a record of the layout before snapshots (per-sandbox snapshot files) does not pass
  expect(() => parseVmState("s4", { workDir: "/w", rootDisk: "/w/root.img", mac: "m", diskKind: "overlaybd" })).toThrow(expect.objectContaining({ code: "orchestrator.bad_runtime_state" }));
});
