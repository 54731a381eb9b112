/**
 * QMP client against a real QEMU (`-M none`: no guest needed) and VMM record reaping against
 * real processes.
 */
import { describe, expect, test } from "bun:test";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { processStartTime, reapLeftovers, VmmError } from "../../../src/vmm/index.ts";
import { QmpClient, type QmpEvent } from "../../../src/vmm/qemu/qmp.ts";
import { writeRecord } from "../../../src/vmm/supervise.ts";
import { exited } from "../../helpers/proc.ts";
import { waitFor } from "../../helpers/wait.ts";

describe("QMP client", () => {
  test("negotiates, runs commands, surfaces QMP errors, and sees the socket close on quit", async () => {
    const d = mkdtempSync(join(tmpdir(), "c1qmp-"));
    const sock = join(d, "qmp.sock");
    const q = spawn("qemu-system-x86_64", ["-M", "none", "-nodefaults", "-display", "none", "-qmp", `unix:${sock},server=on,wait=off`], { stdio: "ignore" });
    const exited = new Promise<number | null>((r) => q.once("exit", r));
    try {
      const c = await QmpClient.connect(sock, 10_000);
      const st = await c.execute<{ status: string; running: boolean }>("query-status");
      expect(st.running).toBe(true);
      expect(st.status).toBe("running");
      await c.execute("stop");
      expect((await c.execute<{ status: string }>("query-status")).status).toBe("paused");
      expect(c.events.some((e) => e.event === "STOP")).toBe(true);
      let err: unknown;
      try {
        await c.execute("no-such-command");
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(VmmError);
      expect((err as VmmError).code).toBe("vmm.qmp_error");
      expect(((err as VmmError).details.error as { class: string }).class).toBe("CommandNotFound");
      // arguments are passed through: a bad one is QEMU's GenericError
      await expect(c.execute("migrate-set-capabilities", { capabilities: [{ capability: "nope", state: true }] })).rejects.toThrow(/nope/);
      await c.execute("quit").catch(() => {});
      expect(await exited).toBe(0);
      await expect(c.execute("query-status")).rejects.toMatchObject({ code: "vmm.qmp_closed" });
    } finally {
      q.kill("SIGKILL");
      rmSync(d, { recursive: true, force: true });
    }
  }, 30_000);

  test("a migration is followed by QMP MIGRATION events, not by polling; waits armed before the command see early events", async () => {
    const d = mkdtempSync(join(tmpdir(), "c1mig-"));
    const sock = join(d, "qmp.sock");
    const q = spawn("qemu-system-x86_64", ["-M", "none", "-nodefaults", "-display", "none", "-qmp", `unix:${sock},server=on,wait=off`], { stdio: "ignore" });
    try {
      const c = await QmpClient.connect(sock, 10_000);
      await c.execute("migrate-set-capabilities", { capabilities: [{ capability: "events", state: true }] });
      await c.execute("stop");
      const ended = (e: QmpEvent) => e.event === "MIGRATION" && ["completed", "failed", "cancelled"].includes(String(e.data?.status));
      // completed: the event may arrive before waitEvent is called; the mark taken first catches it
      const mark = c.eventMark();
      await c.execute("migrate", { uri: `exec:cat > ${join(d, "state")}` });
      await waitFor("the end event to arrive before the wait is armed", () => c.events.some(ended));
      const done = await c.waitEvent(ended, 10_000, mark);
      expect(done.data?.status).toBe("completed");
      const statuses = c.events.filter((e) => e.event === "MIGRATION").map((e) => e.data?.status);
      expect(statuses[0]).toBe("setup");
      expect(statuses.at(-1)).toBe("completed");
      // the exec'd cat writes the stream out after QEMU has sent it all
      await waitFor("cat to write the migration stream", () => statSync(join(d, "state")).size > 0);
      // failed: a destination nobody listens on (QEMU refuses a migration from postmigrate: cont first)
      await c.execute("cont");
      await c.execute("stop");
      const mark2 = c.eventMark();
      await c.execute("migrate", { uri: `unix:${join(d, "nobody-listens.sock")}` });
      expect((await c.waitEvent(ended, 10_000, mark2)).data?.status).toBe("failed");
      // a wait with no matching event times out with vmm.qmp_timeout; closing rejects waiters
      await expect(c.waitEvent((e) => e.event === "NEVER", 50)).rejects.toMatchObject({ code: "vmm.qmp_timeout" });
      const pending = c.waitEvent((e) => e.event === "NEVER", 10_000);
      c.close();
      await expect(pending).rejects.toMatchObject({ code: "vmm.qmp_closed" });
    } finally {
      q.kill("SIGKILL");
      rmSync(d, { recursive: true, force: true });
    }
  }, 30_000);

  test("connect gives up with vmm.qmp_connect when nothing listens", async () => {
    // gives up at its own 300 ms bound (named in the error), never hangs
    await expect(QmpClient.connect("/tmp/c1-no-such-qmp.sock", 300)).rejects.toMatchObject({ code: "vmm.qmp_connect", details: { path: "/tmp/c1-no-such-qmp.sock", timeoutMs: 300 } });
  });
});

describe("reapLeftovers", () => {
  test("kills a recorded live process, deletes its files, and leaves recycled pids alone", async () => {
    const rt = mkdtempSync(join(tmpdir(), "c1reap-"));
    const victim = spawn("sleep", ["300"], { stdio: "ignore" });
    const bystander = spawn("sleep", ["300"], { stdio: "ignore" });
    const victimExit = new Promise<string | null>((r) => victim.once("exit", (_c, sig) => r(sig)));
    try {
      const owned = join(rt, "victim.mem");
      writeFileSync(owned, "ram");
      writeRecord(rt, { id: "v1", driver: "qemu", pid: victim.pid!, startTime: processStartTime(victim.pid!)!, ownedFiles: [owned] });
      // same pid as a live process but another start time: a recycled pid, must not be killed
      writeRecord(rt, { id: "v2", driver: "qemu", pid: bystander.pid!, startTime: processStartTime(bystander.pid!)! - 1, ownedFiles: [] });
      writeFileSync(join(rt, "vmm", "garbage.json"), "{not json");
      const reaped = await reapLeftovers(rt);
      expect(reaped.sort()).toEqual(["v1", "v2"]);
      expect(await victimExit).toBe("SIGKILL");
      expect(existsSync(owned)).toBe(false);
      expect(processStartTime(bystander.pid!)).not.toBeNull();
      expect(existsSync(join(rt, "vmm", "v1.json"))).toBe(false);
      expect(existsSync(join(rt, "vmm", "garbage.json"))).toBe(false);
      expect(await reapLeftovers(rt)).toEqual([]);
      expect(await reapLeftovers(join(rt, "absent"))).toEqual([]);
    } finally {
      victim.kill("SIGKILL");
      bystander.kill("SIGKILL");
      rmSync(rt, { recursive: true, force: true });
    }
  });

  test("reaps only the records under its own runtime dir: a second node's live VMM and files are untouched", async () => {
    const base = mkdtempSync(join(tmpdir(), "c1reap2-"));
    const mine = join(base, "node-a"); // runtime dirs of two nodes on one host
    const other = join(base, "node-b");
    const ours = spawn("sleep", ["300"], { stdio: "ignore" });
    const theirs = spawn("sleep", ["300"], { stdio: "ignore" });
    try {
      const theirMem = join(base, "b.mem");
      writeFileSync(theirMem, "ram");
      writeRecord(mine, { id: "a1", driver: "qemu", pid: ours.pid!, startTime: processStartTime(ours.pid!)!, ownedFiles: [] });
      writeRecord(other, { id: "b1", driver: "firecracker", pid: theirs.pid!, startTime: processStartTime(theirs.pid!)!, ownedFiles: [theirMem] });
      expect(await reapLeftovers(mine)).toEqual(["a1"]);
      expect(exited(ours.pid!)).toBe(true); // a zombie until this process reaps its child
      expect(processStartTime(theirs.pid!)).not.toBeNull();
      expect(existsSync(join(other, "vmm", "b1.json"))).toBe(true);
      expect(existsSync(theirMem)).toBe(true);
      // the parent of both runtime dirs holds no records of its own: nothing to reap there either
      expect(await reapLeftovers(base)).toEqual([]);
      expect(processStartTime(theirs.pid!)).not.toBeNull();
    } finally {
      ours.kill("SIGKILL");
      theirs.kill("SIGKILL");
      rmSync(base, { recursive: true, force: true });
    }
  });
});
