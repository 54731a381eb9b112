// Adopting a Firecracker VMM a dead node left (issue 27), against the schema-validating stand-in
// (fake-firecracker.ts: Firecracker cannot run on this host). A stand-in node
// (fixtures/fc-node.ts) boots the VM through the driver and is SIGKILLed; this process attaches
// from the record (`GET /` gives the instance state), pauses, captures and resumes through the
// same API socket, and sees the exit when the VMM is killed from outside. A VMM whose instance
// never started, or whose API does not answer, is killed and reported lost.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { processStartTime } from "../../../src/ffi/proc.ts";
import { firecrackerConfig, FirecrackerDriver, type FirecrackerConfig } from "../../../src/vmm/firecracker/index.ts";
import { readRecords, writeRecord } from "../../../src/vmm/supervise.ts";
import type { VmmAttachResult, VmSpec } from "../../../src/vmm/index.ts";
import { alive, exited } from "../../helpers/proc.ts";
import { waitFor } from "../../helpers/wait.ts";

let root: string;
let runtimeDir: string;
let cfg: FirecrackerConfig;
const pids: number[] = [];

beforeAll(() => {
  root = mkdtempSync("/tmp/aenv-fc-adopt-");
  runtimeDir = join(root, "run");
  const fake = join(root, "firecracker");
  writeFileSync(fake, `#!/bin/sh\nexec "${process.execPath}" "${join(import.meta.dir, "fake-firecracker.ts")}" "$@"\n`);
  chmodSync(fake, 0o755);
  cfg = { ...firecrackerConfig(), binary: fake, socketTimeoutMs: 20000, stopTimeoutMs: 3000 };
  writeFileSync(join(root, "vmlinux"), "not really a kernel");
});
afterAll(() => {
  for (const p of pids) if (alive(p)) process.kill(p, "SIGKILL");
  rmSync(root, { recursive: true, force: true });
});

function makeSpec(id: string): VmSpec {
  const workDir = join(root, id);
  mkdirSync(workDir, { recursive: true });
  writeFileSync(join(workDir, "root.img"), new Uint8Array(4096));
  return {
    id, workDir, kernelPath: join(root, "vmlinux"), bootArgs: "init=/sbin/aenv-init", vcpus: 1, memoryMiB: 128,
    drives: [{ id: "rootfs", path: join(workDir, "root.img"), readOnly: false, isRoot: true }],
  };
}

/** Requests the stand-in logged, as "METHOD path status". */
function requests(spec: VmSpec): string[] {
  const f = join(spec.workDir, "firecracker.sock.requests.jsonl");
  return readFileSync(f, "utf8").trim().split("\n").map((l) => JSON.parse(l)).map((r) => `${r.method} ${r.path} ${r.status}`);
}

/** A stand-in firecracker started outside the driver (its instance never started), and a record of it. */
async function bareVmm(id: string, binary = cfg.binary): Promise<{ proc: Bun.Subprocess<"pipe", "ignore", "ignore">; spec: VmSpec }> {
  const spec = makeSpec(id);
  const sock = join(spec.workDir, "firecracker.sock");
  const argv = [binary, "--api-sock", sock, "--id", id];
  // stdin a pipe nobody writes: a stand-in that reads it waits without a child of its own
  const proc = Bun.spawn(argv, { stdin: "pipe", stdout: "ignore", stderr: "ignore" });
  pids.push(proc.pid);
  await waitFor("Firecracker's API socket", () => existsSync(sock));
  writeRecord(runtimeDir, {
    id, driver: "firecracker", pid: proc.pid, startTime: processStartTime(proc.pid)!, ownedFiles: [sock], argv, workDir: spec.workDir,
    controlSocket: sock, consolePath: join(spec.workDir, "firecracker.log"), restored: false, dirtyMemPath: "",
  });
  return { proc, spec };
}

test("a node dies with its Firecracker VM running: the next attaches, pauses, captures, resumes over the API socket and sees the exit", async () => {
  const spec = makeSpec("fc-adopt");
  const node = Bun.spawn([process.execPath, join(import.meta.dir, "fixtures", "fc-node.ts"), runtimeDir, JSON.stringify(cfg), JSON.stringify(spec)], { stdout: "pipe", stderr: "inherit" });
  pids.push(node.pid);
  const line = (await node.stdout.getReader().read()).value;
  const vmmPid = JSON.parse(new TextDecoder().decode(line)).pid as number;
  pids.push(vmmPid);
  node.kill("SIGKILL");
  await node.exited;
  expect(alive(vmmPid)).toBe(true);

  const rec = readRecords(runtimeDir).get("fc-adopt")!;
  expect([rec.pid, rec.controlSocket, rec.consolePath, rec.argv!.slice(1)]).toEqual([
    vmmPid, join(spec.workDir, "firecracker.sock"), join(spec.workDir, "firecracker.log"), ["--api-sock", join(spec.workDir, "firecracker.sock"), "--id", "fc-adopt"],
  ]);
  const r: VmmAttachResult = await new FirecrackerDriver({ config: cfg, runtimeDir }).attach(rec);
  if (r.kind !== "attached") throw new Error(`not attached: ${r.reason} ${r.detail}`);
  const vm = r.vm;
  expect([vm.id, vm.pid, vm.consolePath]).toEqual(["fc-adopt", vmmPid, join(spec.workDir, "firecracker.log")]);
  await vm.pause();
  const cap = await vm.captureSnapshot(join(spec.workDir, "adopted.state"));
  expect(cap.kind).toBe("file");
  cap.release();
  await vm.resume();
  expect(requests(spec).slice(-5)).toEqual(["PUT /actions 204", "GET / 200", "PATCH /vm 204", "PUT /snapshot/create 204", "PATCH /vm 204"]);
  process.kill(vmmPid, "SIGKILL");
  expect(await vm.exited).toBeNull();
  expect(exited(vmmPid)).toBe(true);
  expect(existsSync(join(runtimeDir, "vmm", "fc-adopt.json"))).toBe(false);
  expect(existsSync(rec.controlSocket!)).toBe(false);
}, 60_000);

test("an instance that never started is bad_state, a VMM whose API does not answer unresponsive: both killed, their records gone", async () => {
  const driver = new FirecrackerDriver({ config: cfg, runtimeDir });
  const bare = await bareVmm("fc-bare");
  const r1 = await driver.attach(readRecords(runtimeDir).get("fc-bare")!);
  expect(r1.kind === "lost" && [r1.reason, r1.detail]).toEqual(["bad_state", 'instance state "Not started"']);
  await bare.proc.exited;
  expect(bare.proc.signalCode).toBe("SIGKILL");
  // creates its socket path as a plain file and never serves on it (sh stays: its arguments are the VMM's)
  const mute = join(root, "mute-firecracker");
  writeFileSync(mute, `#!/bin/sh\n: > "$2"\nread -r _\n`);
  chmodSync(mute, 0o755);
  const m = await bareVmm("fc-mute", mute);
  const r2 = await new FirecrackerDriver({ config: { ...cfg, apiTimeoutMs: 500 }, runtimeDir }).attach(readRecords(runtimeDir).get("fc-mute")!);
  expect(r2.kind === "lost" && r2.reason).toBe("unresponsive");
  await m.proc.exited;
  expect(m.proc.signalCode).toBe("SIGKILL");
  expect(readRecords(runtimeDir).has("fc-bare")).toBe(false);
  expect(readRecords(runtimeDir).has("fc-mute")).toBe(false);
}, 60_000);
