import { expect, test } from "bun:test";
import { parseVmState } from "../../src/sandbox/vm-state.ts";

const ok = { workDir: "/w/s1", rootDisk: "/w/s1/root.img", mac: "02:fc:00:00:00:01", diskKind: "overlaybd" as const, vmmPid: 42 };

test("a stored runtime state is parsed: valid ones pass unchanged, JSON round trips included", () => {
  expect(parseVmState("s1", ok)).toEqual(ok);
  const paused = { ...ok, vmmPid: undefined, snapshot: { statePath: "/w/snap/vm-1.state", memPath: "/w/snap/vm-1.mem" } };
  expect(parseVmState("s1", JSON.parse(JSON.stringify(paused)))).toEqual({ ...ok, vmmPid: undefined, snapshot: paused.snapshot } as never);
  // older records without the tools drive
  expect(parseVmState("s1", { ...ok, toolsImage: undefined })).toMatchObject({ diskKind: "overlaybd" });
});

test("a damaged or foreign state is orchestrator.bad_runtime_state naming the field", () => {
  const cases: [unknown, string][] = [
    [{ ...ok, diskKind: "zfs" }, "/diskKind"],
    [{ ...ok, rootDisk: 7 }, "/rootDisk"],
    [{ ...ok, workDir: undefined }, "/workDir"],
    [{ ...ok, vmmPid: -1 }, "/vmmPid"],
    [{ ...ok, snapshot: { statePath: "/x" } }, "/snapshot/memPath"],
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
});
