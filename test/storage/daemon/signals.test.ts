// Integration: serving children vs. signals. Real `agentenv disk serve` children on real FUSE
// mounts (needs root). A stand-in node (fixtures/sigint-node.ts) runs in its own process group so
// `kill -INT -<its pgid>` reproduces a terminal Ctrl-C without touching the test runner.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { listMounts } from "../../../src/ffi/mount.ts";
import { DiskShutdown, diskConfig, exportDisk, reapStaleDisks } from "../../../src/storage/daemon/index.ts";
import { alive, groupOf } from "../../helpers/proc.ts";

let root: string;
let recordDir: string;

beforeAll(() => {
  root = mkdtempSync("/tmp/aenv-disk-sig-");
  recordDir = join(root, "records");
});
afterAll(async () => {
  await reapStaleDisks(recordDir, { mountRoots: [root] });
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

describe("disk serving children and signals", () => {
  test("Ctrl-C to the node's process group leaves the serving child alive until the node closes the disk", async () => {
    const fixture = join(import.meta.dir, "fixtures", "sigint-node.ts");
    // detached: the stand-in node leads its own group, like a shell job in the foreground
    const node = Bun.spawn([process.execPath, fixture, join(root, "sigint"), recordDir], {
      stdin: "ignore", stdout: "pipe", stderr: "pipe", detached: true,
      env: { ...process.env, AENV_LOG_LEVEL: "info" },
    });
    const reader = (node.stdout as ReadableStream<Uint8Array>).getReader();
    const acc = { text: "" };
    let childPid = 0;
    try {
      const [first] = await lines(reader, 1, acc);
      const { pid, path } = JSON.parse(first!) as { pid: number; path: string };
      childPid = pid;
      expect(readFileSync(path).length).toBe(8192);
      const nodeGroup = groupOf(node.pid);
      expect(nodeGroup.pgid).toBe(node.pid);
      const childGroup = groupOf(pid);
      // the serving child leads its own session and group, outside the node's
      expect(childGroup).toEqual({ pgid: pid, sid: pid });
      expect(childGroup.pgid).not.toBe(nodeGroup.pgid);
      expect(childGroup.sid).not.toBe(nodeGroup.sid);

      process.kill(-nodeGroup.pgid, "SIGINT"); // what the terminal does on Ctrl-C
      const out = await lines(reader, 2, acc);
      expect(await node.exited).toBe(0);
      const report = JSON.parse(out[1]!) as { aliveAtSigint: boolean; readable: boolean; exitCode: number | null; restarts: number };
      expect(report).toEqual({ aliveAtSigint: true, readable: true, exitCode: 0, restarts: 0 });
      const stderr = await new Response(node.stderr as ReadableStream).text();
      expect(stderr).not.toContain("disk server died");
      expect(stderr).not.toContain("disk server replaced");
      expect(alive(pid)).toBe(false);
      expect(listMounts().some((m) => m.mountPoint === join(root, "sigint", "mnt"))).toBe(false);
      expect(existsSync(join(recordDir, "sigint.json"))).toBe(false);
    } finally {
      if (alive(node.pid)) node.kill("SIGKILL");
      if (childPid && alive(childPid)) process.kill(childPid, "SIGKILL");
    }
  }, 60_000);

  test("a child stopped on purpose (SIGTERM, exit 0) is not replaced nor logged as a crash; the disk is given up", async () => {
    const workDir = join(root, "term");
    mkdirSync(workDir, { recursive: true });
    writeFileSync(join(workDir, "b.raw"), new Uint8Array(4096));
    const d = await exportDisk({
      id: "term", image: { kind: "raw", path: join(workDir, "b.raw"), readOnly: false }, workDir, recordDir,
      config: { ...diskConfig(), readyTimeoutMs: 15000, maxRestarts: 3 },
    });
    try {
      const pid = d.pid;
      process.kill(pid, "SIGTERM");
      expect(await d.exited).toBe(0);
      await Bun.sleep(300); // a (wrong) replacement would have been spawned by now
      expect(d.restarts).toBe(0);
      expect(d.pid).toBe(pid);
      expect(alive(pid)).toBe(false);
      expect(listMounts().some((m) => m.mountPoint === join(workDir, "mnt"))).toBe(false);
      expect(existsSync(join(recordDir, "term.json"))).toBe(false);
    } finally {
      await d.close();
    }
  }, 60_000);

  test("a DiskShutdown is scoped to its owner's exports: another owner's crashed child is still replaced", async () => {
    const workDir = join(root, "scoped");
    mkdirSync(workDir, { recursive: true });
    writeFileSync(join(workDir, "b.raw"), new Uint8Array(4096).fill(7));
    new DiskShutdown().begin(); // another owner's switch
    const mine = new DiskShutdown();
    const d = await exportDisk({
      id: "scoped", image: { kind: "raw", path: join(workDir, "b.raw"), readOnly: false }, workDir, recordDir,
      config: { ...diskConfig(), readyTimeoutMs: 15000, maxRestarts: 2 }, shutdown: mine,
    });
    try {
      const first = d.pid;
      process.kill(first, "SIGKILL");
      for (let i = 0; i < 200 && d.restarts < 1; i++) await Bun.sleep(50);
      expect(d.restarts).toBe(1);
      expect(d.pid).not.toBe(first);
      expect(readFileSync(d.path).every((b) => b === 7)).toBe(true);
    } finally {
      await d.close();
    }
  }, 60_000);

  test("after DiskShutdown.begin() a crashed child is not replaced", async () => {
    // in a separate process, as a node would be
    const script = `
      const { DiskShutdown, diskConfig, exportDisk } = await import(${JSON.stringify(join(import.meta.dir, "../../../src/storage/daemon/index.ts"))});
      const [workDir, recordDir] = process.argv.slice(1);
      const fs = require("node:fs");
      fs.mkdirSync(workDir, { recursive: true });
      fs.writeFileSync(workDir + "/b.raw", new Uint8Array(4096));
      const shutdown = new DiskShutdown();
      const d = await exportDisk({ id: "shut", image: { kind: "raw", path: workDir + "/b.raw", readOnly: false }, workDir, recordDir, config: { ...diskConfig(), readyTimeoutMs: 15000, maxRestarts: 3 }, shutdown });
      shutdown.begin();
      const pid = d.pid;
      process.kill(pid, "SIGKILL");
      const code = await d.exited;
      await Bun.sleep(300);
      console.log(JSON.stringify({ code, restarts: d.restarts, samePid: d.pid === pid }));
      await d.close();`;
    const p = Bun.spawn([process.execPath, "-e", script, join(root, "shut"), recordDir], { stdout: "pipe", stderr: "pipe", env: { ...process.env, AENV_LOG_LEVEL: "info" } });
    const [out, err] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text()]);
    expect(await p.exited).toBe(0);
    expect(JSON.parse(out.trim())).toEqual({ code: null, restarts: 0, samePid: true });
    expect(err).not.toContain("disk server died");
    expect(err).toContain("disk server stopped");
    expect(listMounts().some((m) => m.mountPoint === join(root, "shut", "mnt"))).toBe(false);
  }, 60_000);
});
