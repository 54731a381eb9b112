/**
 * The benches that start a node in their own process print their figures without the node's log
 * lines (bench/quiet-logs.ts): bench/events.ts, run small, against a real in-process node with
 * loopback guests, writes its report on stdout and nothing on stderr.
 */
import { expect, test } from "bun:test";
import { join } from "node:path";

test("bench/events.ts prints its report and no node log line", async () => {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== "AENV_LOG_LEVEL")) as Record<string, string>;
  const p = Bun.spawn([process.execPath, join(import.meta.dir, "../../bench/events.ts"), "--events", "50", "--rounds", "1"], { stdout: "pipe", stderr: "pipe", env });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  expect(code).toBe(0);
  expect(out).toContain("events bench: 1 interleaved rounds, 50 API calls (= events) per variant");
  expect(out.split("\n").filter((l) => /^ {2}(none|refused|blackhole) +median /.test(l)).length).toBe(3);
  // the node warns at start on a home without a kernel (stale boot snapshots not looked for): not here
  expect(err.split("\n").filter((l) => l.startsWith("{"))).toEqual([]);
}, 120_000);
