// Integration: the disk daemon vs. signals. A real `agentenv ublk-daemon` on real FUSE mounts
// (needs root). A stand-in node (fixtures/sigint-node.ts) runs in its own process group so
// `kill -INT -<its pgid>` reproduces a terminal Ctrl-C without touching the test runner.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { alive, groupOf } from "../../helpers/proc.ts";
import { fuseMounted, startService, stopService } from "./fixtures/service.ts";
import { waitFor } from "../../helpers/wait.ts";
import { errorCode } from "../../../src/util/error.ts";

let root: string;

beforeAll(() => {
  root = mkdtempSync("/tmp/aenv-disk-sig-");
});
afterAll(async () => {
  await stopService(undefined, root);
  rmSync(root, { recursive: true, force: true });
});

/** Read stdout lines of a child until `n` lines arrived (or it closed). */
async function lines(reader: { read(): Promise<{ done: boolean; value?: Uint8Array }> }, n: number, acc: { text: string }): Promise<string[]> {
  while (acc.text.split("\n").length - 1 < n) {
    const r = await reader.read();
    if (r.done) break;
    acc.text += new TextDecoder().decode(r.value);
  }
  return acc.text.split("\n").filter(Boolean);
}

describe("the disk daemon and signals", () => {
  test("Ctrl-C to the node's process group leaves the daemon serving until the node closes the disk", async () => {
    const fixture = join(import.meta.dir, "fixtures", "sigint-node.ts");
    // detached: the stand-in node leads its own group, like a shell job in the foreground
    const node = Bun.spawn([process.execPath, fixture, join(root, "sigint")], {
      stdin: "ignore", stdout: "pipe", stderr: "pipe", detached: true,
      env: { ...process.env, AENV_LOG_LEVEL: "info" },
    });
    const reader = (node.stdout as ReadableStream<Uint8Array>).getReader();
    const acc = { text: "" };
    let daemonPid = 0;
    try {
      const [first] = await lines(reader, 1, acc);
      const { pid, path } = JSON.parse(first!) as { pid: number; path: string };
      daemonPid = pid;
      expect(readFileSync(path).length).toBe(8192);
      const nodeGroup = groupOf(node.pid);
      expect(nodeGroup.pgid).toBe(node.pid);
      const daemonGroup = groupOf(pid);
      // the daemon leads its own session and group, outside the node's
      expect(daemonGroup).toEqual({ pgid: pid, sid: pid });
      expect(daemonGroup.sid).not.toBe(nodeGroup.sid);

      process.kill(-nodeGroup.pgid, "SIGINT"); // what the terminal does on Ctrl-C
      const out = await lines(reader, 2, acc);
      expect(await node.exited).toBe(0);
      expect(JSON.parse(out[1]!)).toEqual({ aliveAtSigint: true, readable: true, samePid: true, restarts: 0 });
      const stderr = await new Response(node.stderr as ReadableStream).text();
      expect(stderr).not.toContain("disk daemon died");
      expect(alive(pid)).toBe(false);
      expect(fuseMounted(join(root, "sigint", "mnt"))).toBe(false);
    } finally {
      if (alive(node.pid)) node.kill("SIGKILL");
      if (daemonPid && alive(daemonPid)) process.kill(daemonPid, "SIGKILL");
    }
  }, 60_000);

  test("a daemon stopped from outside (SIGTERM) lets go of its devices intact; the node starts it again and they are served", async () => {
    const r = join(root, "term");
    mkdirSync(r, { recursive: true });
    writeFileSync(join(r, "b.raw"), new Uint8Array(4096).fill(7));
    const svc = await startService(r);
    try {
      const d = await svc.exportDisk({ id: "term", target: { kind: "raw", path: join(r, "b.raw"), read_only: false }, mountPoint: join(r, "mnt") });
      const pid = svc.pid;
      process.kill(pid, "SIGTERM");
      await waitFor("the daemon to be started again", () => svc.restarts >= 1);
      expect(svc.restarts).toBe(1);
      expect(svc.pid).not.toBe(pid);
      expect(alive(pid)).toBe(false);
      expect(readFileSync(d.path).every((b) => b === 7)).toBe(true);
      expect((await svc.features()).restarts_recovered).toBe(1);
      await d.close();
      expect(fuseMounted(join(r, "mnt"))).toBe(false);
    } finally {
      await stopService(svc, r);
    }
  }, 60_000);

  test("after beginShutdown a daemon that dies is not started again", async () => {
    const r = join(root, "shut");
    const svc = await startService(r);
    try {
      const pid = svc.pid;
      svc.beginShutdown();
      process.kill(pid, "SIGKILL");
      // requests fail daemon_failed once the service has handled the death (and chosen not to restart)
      await waitFor("the service to give the daemon up", () => svc.list().then(() => "", (e: unknown) => errorCode(e) === "disk.daemon_failed"));
      expect(alive(pid)).toBe(false);
      expect(svc.restarts).toBe(0);
      expect(svc.pid).toBe(pid);
    } finally {
      await stopService(svc, r);
    }
  }, 60_000);
});
