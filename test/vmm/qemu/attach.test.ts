/**
 * Adopting a VMM a dead node left (issue 27), against a real QEMU (microvm/TCG, base template
 * read only, the guest printing `tick <n>` on its console every 200 ms): a stand-in node
 * (fixtures/adopt-node.ts) boots it through the driver and is SIGKILLed with its QMP and console
 * connections open; this process attaches from the record, drives QMP (query-status, stop/cont),
 * reads the console on (same log file), detaches and attaches again (the upgrade path), and gets
 * the exit when QEMU is killed from outside. Records that do not fit (a dead pid, a reused pid,
 * an older node's record) are reported, and only a process proved ours is ever killed.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { processStartTime, qemuOptions, QemuDriver, readRecords, reapLeftovers, type QemuVm, type VmmAttachResult } from "../../../src/vmm/index.ts";
import { writeRecord } from "../../../src/vmm/supervise.ts";
import { alive, exited } from "../../helpers/proc.ts";
import { testConfig } from "./helpers.ts";
import { waitFor } from "../../helpers/wait.ts";

const root = mkdtempSync(join(tmpdir(), "c1adopt-"));
const runtimeDir = join(root, "run");
const memoryDir = mkdtempSync("/dev/shm/c1adoptmem-");
const driver = new QemuDriver({ ...qemuOptions(testConfig()), runtimeDir, memoryDir });
const pids: number[] = [];
afterAll(() => {
  for (const p of pids) if (alive(p)) process.kill(p, "SIGKILL");
  rmSync(root, { recursive: true, force: true });
  rmSync(memoryDir, { recursive: true, force: true });
});

/** The numbers of the `tick <n>` lines in `text`. */
function ticks(text: string): number[] {
  return [...text.matchAll(/tick (\d+)/g)].map((m) => Number(m[1]));
}

function attached(r: VmmAttachResult): QemuVm {
  if (r.kind !== "attached") throw new Error(`not attached: ${r.reason}: ${r.detail}`);
  return r.vm as QemuVm;
}

/** First stdout line of a child, as JSON. */
async function firstJson(proc: { stdout: ReadableStream<Uint8Array> }): Promise<Record<string, unknown>> {
  const reader = proc.stdout.getReader();
  let text = "";
  while (!text.includes("\n")) {
    const r = await reader.read();
    if (r.done) throw new Error(`stand-in node ended before its first line: ${JSON.stringify(text)}`);
    text += new TextDecoder().decode(r.value);
  }
  reader.releaseLock();
  return JSON.parse(text.slice(0, text.indexOf("\n")));
}

describe("QEMU adoption", () => {
  test("a node dies with its VM running: the next attaches from the record, drives QMP, reads the console on, detaches, attaches again, sees the exit", async () => {
    const id = `c1ad${process.pid}`;
    const node = Bun.spawn([process.execPath, join(import.meta.dir, "fixtures", "adopt-node.ts"), runtimeDir, memoryDir, root, id], { stdout: "pipe", stderr: "inherit" });
    pids.push(node.pid);
    const qemuPid = (await firstJson(node)).pid as number;
    pids.push(qemuPid);
    expect(readFileSync(`/proc/${qemuPid}/comm`, "utf8").trim()).toStartWith("qemu-system");
    // the node dies: the kernel closes its QMP and console connections, QEMU runs on
    node.kill("SIGKILL");
    await node.exited;
    expect(alive(qemuPid)).toBe(true);

    const rec = readRecords(runtimeDir).get(id)!;
    expect(rec.pid).toBe(qemuPid);
    expect(rec.startTime).toBe(processStartTime(qemuPid)!);
    expect(rec.argv!.slice(1)).toContain(`aenv-${id}`);
    const consolePath = rec.consolePath!;
    const before = ticks(readFileSync(consolePath, "utf8"));
    expect(before.slice(0, 4)).toEqual([0, 1, 2, 3]);

    const lines: string[] = [];
    const vm = attached(await driver.attach(rec, { onConsoleLine: (l) => lines.push(l) }));
    expect([vm.id, vm.pid, vm.state, vm.spawnMs, vm.consolePath, vm.memPath, vm.memShared]).toEqual([id, qemuPid, "running", 0, consolePath, rec.memPath!, true]);
    expect(((await vm.qmp.execute("query-status")) as { status: string }).status).toBe("running");
    // the console goes on in the same file, and its lines reach the new listener
    await waitFor("console lines through the adopted console", () => ticks(lines.join("\n")).length >= 3, { timeoutMs: 60_000 });
    const after = ticks(lines.join("\n"));
    expect(after[0]!).toBeGreaterThan(before.at(-1)!);
    for (let i = 1; i < after.length; i++) expect(after[i]).toBe(after[i - 1]! + 1);
    const log = readFileSync(consolePath, "utf8");
    expect(log).toStartWith(readFileSync(consolePath, "utf8").slice(0, 20)); // appended, not truncated
    expect(ticks(log)[0]).toBe(0);
    expect(ticks(log)).toContain(after[0]!);

    // stop/cont over the new QMP connection
    await vm.pause();
    expect([vm.state, ((await vm.qmp.execute("query-status")) as { status: string }).status]).toEqual(["paused", "paused"]);
    await vm.resume();
    expect([vm.state, ((await vm.qmp.execute("query-status")) as { status: string }).status]).toEqual(["running", "running"]);

    // a record someone holds is not reaped
    expect(await reapLeftovers(runtimeDir, { keep: new Set([id]) })).toEqual([]);
    expect(processStartTime(qemuPid)).toBe(rec.startTime);

    // detach (the upgrade path): the same record serves the next attach, paused state and all
    await vm.pause();
    vm.detach();
    expect(alive(qemuPid)).toBe(true);
    expect(existsSync(join(runtimeDir, "vmm", `${id}.json`))).toBe(true);
    const again = attached(await driver.attach(readRecords(runtimeDir).get(id)!));
    expect([again.pid, again.state]).toEqual([qemuPid, "paused"]);
    await again.resume();
    expect(((await again.qmp.execute("query-status")) as { status: string }).status).toBe("running");

    // QEMU killed from outside: the exit is seen through the pidfd, its files and record go
    process.kill(qemuPid, "SIGKILL");
    expect(await again.exited).toBeNull();
    expect(again.state).toBe("failed");
    expect(exited(qemuPid)).toBe(true);
    for (const f of [join(runtimeDir, "vmm", `${id}.json`), rec.controlSocket!, rec.consoleSocket!, rec.memPath!]) expect(existsSync(f)).toBe(false);
    expect(readRecords(runtimeDir).size).toBe(0);
  }, 300_000);

  test("records that do not fit: a dead pid is gone, a reused pid another process (left alive), an older node's record invalid (its process killed)", async () => {
    // `sh -c 'sleep 300; :' <name>`: a process whose arguments name a VM (the `; :` keeps sh from exec'ing sleep)
    const sleeperArgv = (name: string) => ["sh", "-c", "sleep 300; :", name];
    const sleeper = async (name = "x") => {
      const p = Bun.spawn(sleeperArgv(name), { stdin: "ignore", stdout: "ignore", stderr: "ignore" });
      pids.push(p.pid);
      // until the exec: what /proc shows of it is not yet its command line
      await waitFor(`${name} running`, () => readFileSync(`/proc/${p.pid}/cmdline`, "utf8").includes(name), { timeoutMs: 10_000 });
      return p;
    };
    const dead = await sleeper();
    const deadStart = processStartTime(dead.pid)!;
    dead.kill("SIGKILL");
    await dead.exited;
    const base = { driver: "qemu" as const, ownedFiles: [], workDir: root, controlSocket: join(root, "none.qmp"), consoleSocket: join(root, "none.con"), consolePath: join(root, "c.log"), logPath: join(root, "q.log"), memPath: join(root, "m"), memShared: true };
    const results: Record<string, VmmAttachResult> = {};
    results.gone = await driver.attach({ ...base, id: "gone1", pid: dead.pid, startTime: deadStart, argv: ["qemu", "-name", "aenv-gone1"] });
    // a live process whose start time is not the recorded one: a reused pid
    const other = await sleeper();
    results.reused = await driver.attach({ ...base, id: "reused1", pid: other.pid, startTime: processStartTime(other.pid)! - 1, argv: ["qemu", "-name", "aenv-reused1"] });
    // the right pid and start time but another command line
    results.argv = await driver.attach({ ...base, id: "argv1", pid: other.pid, startTime: processStartTime(other.pid)!, argv: ["qemu", "-name", "aenv-argv1"] });
    expect(alive(other.pid)).toBe(true);
    // ours, recorded by another driver: nobody here can drive it
    const fc = await sleeper("aenv-fc1");
    const wrongDriver = await driver.attach({ ...base, id: "fc1", driver: "firecracker", pid: fc.pid, startTime: processStartTime(fc.pid)!, argv: sleeperArgv("aenv-fc1") });
    expect(wrongDriver.kind === "lost" && [wrongDriver.reason, wrongDriver.detail]).toEqual(["record_invalid", "recorded for driver firecracker, this node runs qemu"]);
    await fc.exited;
    expect(fc.signalCode).toBe("SIGKILL");
    // proved ours by pid, start time and arguments, but the record lacks what adoption needs
    const old = await sleeper();
    results.old = await driver.attach({ id: "old1", driver: "qemu", pid: old.pid, startTime: processStartTime(old.pid)!, ownedFiles: [] });
    await old.exited;
    expect(old.signalCode).toBe("SIGKILL");
    // ours (its arguments name it), but nothing answers on its QMP socket: killed
    const mute = await sleeper("aenv-mute1");
    results.mute = await driver.attach({ ...base, id: "mute1", pid: mute.pid, startTime: processStartTime(mute.pid)!, argv: sleeperArgv("aenv-mute1") });
    await mute.exited;
    expect(mute.signalCode).toBe("SIGKILL");
    expect(Object.fromEntries(Object.entries(results).map(([k, r]) => [k, r.kind === "lost" ? r.reason : r.kind]))).toEqual({
      gone: "gone", reused: "other_process", argv: "other_process", old: "record_invalid", mute: "unresponsive",
    });
    expect((results.old as { detail: string }).detail).toContain("argv");
    other.kill("SIGKILL");
    // a record file that is not a record is dropped by readRecords
    writeRecord(runtimeDir, { ...base, id: "fine", pid: 1, startTime: 0 });
    writeFileSync(join(runtimeDir, "vmm", "broken.json"), "{");
    expect([...readRecords(runtimeDir).keys()]).toEqual(["fine"]);
    expect(existsSync(join(runtimeDir, "vmm", "broken.json"))).toBe(false);
    expect(await reapLeftovers(runtimeDir)).toEqual(["fine"]);
  }, 60_000);
});
