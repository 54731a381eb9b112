/**
 * Ctrl-C on the node's terminal: a stand-in node (fixtures/sigint-node.ts) boots a real QEMU
 * (microvm/TCG, base template) through the driver. The stand-in leads its own process group, so
 * `kill -INT -<its pgid>` reproduces the terminal's SIGINT without touching the test runner. QEMU
 * must be in a session of its own and still alive for the node's shutdown to pause and stop it.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { alive, groupOf } from "../../helpers/proc.ts";

const dir = mkdtempSync(join(tmpdir(), "c1int-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));



describe("QEMU and the node's process group", () => {
  test("QEMU runs in its own session; kill -INT to the node's group leaves it for the node to pause and stop", async () => {
    const node = Bun.spawn([process.execPath, join(import.meta.dir, "fixtures", "sigint-node.ts"), dir], {
      stdin: "ignore", stdout: "pipe", stderr: "pipe", detached: true,
    });
    const reader = (node.stdout as ReadableStream<Uint8Array>).getReader();
    let text = "";
    const lines = async (n: number): Promise<string[]> => {
      while (text.split("\n").length - 1 < n) {
        const r = await reader.read();
        if (r.done) break;
        text += new TextDecoder().decode(r.value);
      }
      return text.split("\n").filter(Boolean);
    };
    let qemuPid = 0;
    try {
      const [first] = await lines(1);
      if (!first) throw new Error(`stand-in node failed: ${await new Response(node.stderr as ReadableStream).text()}`);
      qemuPid = (JSON.parse(first) as { pid: number }).pid;
      expect(readFileSync(`/proc/${qemuPid}/comm`, "utf8").trim()).toStartWith("qemu-system");
      const nodeGroup = groupOf(node.pid);
      expect(nodeGroup.pgid).toBe(node.pid);
      expect(groupOf(qemuPid)).toEqual({ pgid: qemuPid, sid: qemuPid });

      process.kill(-nodeGroup.pgid, "SIGINT");
      const out = await lines(2);
      expect(await node.exited).toBe(0);
      expect(JSON.parse(out[1]!)).toEqual({ aliveAtSigint: true, pausedState: "paused", exitCode: 0 });
      expect(alive(qemuPid)).toBe(false);
    } finally {
      if (alive(node.pid)) node.kill("SIGKILL");
      if (qemuPid && alive(qemuPid)) process.kill(qemuPid, "SIGKILL");
    }
  }, 120_000);
});
