/**
 * The QMP client reading what the QMP peer sends (src/vmm/qemu/qmp.ts; QEMU runs guest-driven
 * code, so its socket is read as untrusted): against a stand-in QMP server on a Unix socket,
 * answers split in any place come out whole; a line that is not JSON, a message of the wrong
 * shape, or a line past MAX_QMP_LINE ends the connection with VmmError vmm.qmp_bad_message and
 * fails what waits on it, never a crash or an unbounded buffer.
 */
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { createServer } from "node:net";
import { join } from "node:path";
import { MAX_QMP_LINE, QmpClient } from "../../../src/vmm/qemu/qmp.ts";

const dir = mkdtempSync(join(tmpdir(), "aenv-qmp-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A QMP server that greets, accepts qmp_capabilities, and answers every other command with `answer(id)`'s bytes. */
function server(name: string, answer: (id: number, write: (b: string) => void) => void): { path: string; stop(): void } {
  const path = join(dir, `${name}.sock`);
  // node:net buffers what the peer has not read yet (the long line is written whole)
  const s = createServer((sock) => {
    let buf = "";
    sock.on("error", () => {});
    sock.write('{"QMP": {"version": {}, "capabilities": []}}\n');
    sock.on("data", (d) => {
      buf += d.toString();
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const m = JSON.parse(buf.slice(0, nl)) as { execute: string; id: number };
        buf = buf.slice(nl + 1);
        if (m.execute === "qmp_capabilities") sock.write(`{"return": {}, "id": ${m.id}}\n`);
        else answer(m.id, (b) => sock.write(b));
      }
    });
  }).listen(path);
  return { path, stop: () => s.close() };
}

test("an answer and an event split byte by byte come out whole", async () => {
  const srv = server("split", (id, write) => {
    const text = `{"event": "STOP", "data": {}, "timestamp": {"seconds": 1, "microseconds": 2}}\n{"return": {"status": "paused"}, "id": ${id}}\n`;
    for (const ch of text) write(ch);
  });
  const c = await QmpClient.connect(srv.path, 5000);
  try {
    expect(await c.execute("query-status")).toEqual({ status: "paused" });
    expect(c.events.map((e) => e.event)).toEqual(["STOP"]);
  } finally {
    c.close();
    srv.stop();
  }
});

test("not JSON, a wrong shape, a line past the bound: vmm.qmp_bad_message, and the connection is done", async () => {
  const cases: [string, (id: number, write: (b: string) => void) => void, string][] = [
    ["garbage", (_id, write) => write("this is not json\n"), "a line that is not JSON"],
    ["array", (_id, write) => write("[1, 2]\n"), "a line that is not a JSON object"],
    ["event", (_id, write) => write('{"event": 5}\n'), "an event /event: Expected string"],
    ["reply", (id, write) => write(`{"id": ${id}, "error": {"class": 1, "desc": "d"}}\n`), "an answer /error/class: Expected string"],
    ["huge", (_id, write) => {
      const chunk = "x".repeat(1 << 20);
      for (let n = 0; n <= MAX_QMP_LINE; n += chunk.length) write(chunk);
    }, `a line over ${MAX_QMP_LINE} bytes`],
  ];
  for (const [name, answer, reason] of cases) {
    const srv = server(name, answer);
    const c = await QmpClient.connect(srv.path, 5000);
    try {
      const err = await c.execute("query-status", undefined, 20_000).then(() => null, (e: unknown) => e);
      expect([name, err]).toMatchObject([name, { code: "vmm.qmp_bad_message", details: { reason } }]);
      // nothing more goes through it
      expect(await c.execute("query-status").then(() => null, (e: unknown) => (e as { code: string }).code)).toBe("vmm.qmp_closed");
    } finally {
      c.close();
      srv.stop();
    }
  }
}, 60_000);
