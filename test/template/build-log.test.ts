// Build logs read back from disk (src/template/build-log.ts): a file another process wrote or
// damaged is scanned in pieces and only its entries count. Lines that are not entries (not
// JSON, the wrong shape, a level outside the four, longer than the log's bound, torn at the end)
// are passed over, also where a line spans the scan's 64 KiB pieces.
import { afterAll, expect, test } from "bun:test";
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BuildLogs, type BuildLogEntry } from "../../src/template/build-log.ts";

const dir = mkdtempSync(join(tmpdir(), "aenv-buildlog-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const ID = "00000000-0000-4000-8000-0000000000aa";

test("only entries are read from a file with foreign lines, across scan pieces; a torn tail is ended", () => {
  const entry = (i: number, level: BuildLogEntry["level"] = "info"): BuildLogEntry => ({ timestamp: new Date(i * 1000).toISOString(), level, message: `m${i} ${"y".repeat(i % 7 === 0 ? 70_000 : 40)}` });
  const want: BuildLogEntry[] = [];
  const lines: string[] = [];
  for (let i = 0; i < 60; i++) {
    const e = entry(i, i % 10 === 9 ? "error" : "info");
    want.push(e);
    lines.push(JSON.stringify(e));
    // foreign lines between the entries
    lines.push(
      ["not json", JSON.stringify({ ...e, level: "fatal" }), JSON.stringify({ timestamp: 5, level: "info", message: "x" }), "[1,2]", "", JSON.stringify({ ...e, message: "z".repeat(300_000) })][i % 6]!,
    );
  }
  writeFileSync(join(dir, `${ID}.jsonl`), lines.join("\n") + "\n");
  appendFileSync(join(dir, `${ID}.jsonl`), '{"timestamp":"t","level":"info","mess');
  const logs = new BuildLogs(dir, 200_000);
  expect(logs.count(ID)).toBe(60);
  expect(logs.all(ID)).toEqual(want);
  expect(logs.read(ID, 13, 4)).toEqual(want.slice(13, 17));
  expect(logs.errors(ID).map((e) => e.message)).toEqual(want.filter((e) => e.level === "error").map((e) => e.message));
  // the torn tail was ended: the next entry is a line of its own (after the truncation line: the file is past the bound)
  logs.append(ID, [entry(61, "error")]);
  const again = new BuildLogs(dir, 200_000).all(ID);
  expect(again.slice(0, 60)).toEqual(want);
  expect(again.slice(60).map((e) => [e.level, e.message.slice(0, 14)])).toEqual([["warn", "log truncated:"], ["error", entry(61).message.slice(0, 14)]]);
});

test("a missing or unreadable log reads as empty", () => {
  const logs = new BuildLogs(dir, 4096);
  expect(logs.all("00000000-0000-4000-8000-0000000000bb")).toEqual([]);
  const other = "00000000-0000-4000-8000-0000000000cc";
  require("node:fs").mkdirSync(join(dir, `${other}.jsonl`));
  expect(logs.count(other)).toBe(0);
});
