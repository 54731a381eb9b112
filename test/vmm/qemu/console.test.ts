/** The bounded console log: appends, rotates once at maxBytes, keeps the newest bytes. */
import { expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConsoleLog, MAX_LINE_BYTES } from "../../../src/vmm/console.ts";

test("console log rotates to .1 and never holds more than 2 x maxBytes", () => {
  const d = mkdtempSync(join(tmpdir(), "c1con-"));
  try {
    const p = join(d, "console.log");
    writeFileSync(`${p}.1`, "stale from an earlier VM");
    writeFileSync(p, "stale");
    const log = new ConsoleLog(p, 10);
    expect(existsSync(`${p}.1`)).toBe(false);
    expect(readFileSync(p, "utf8")).toBe("");
    const enc = new TextEncoder();
    log.write(enc.encode("abcdef"));
    log.write(enc.encode("ghij")); // exactly 10: no rotation yet
    expect(readFileSync(p, "utf8")).toBe("abcdefghij");
    log.write(enc.encode("k"));
    expect(readFileSync(`${p}.1`, "utf8")).toBe("abcdefghij");
    expect(readFileSync(p, "utf8")).toBe("k");
    log.write(enc.encode("0123456789XYZ")); // larger than maxBytes: rotate, keep its last 10 bytes
    expect(readFileSync(`${p}.1`, "utf8")).toBe("k");
    expect(readFileSync(p, "utf8")).toBe("3456789XYZ");
    log.close();
    log.close();
    log.write(enc.encode("after close"));
    expect(readFileSync(p, "utf8")).toBe("3456789XYZ");
  } finally {
    rmSync(d, { recursive: true, force: true });
  }
});

test("console lines reach the listener whole: split across chunks, CRLF trimmed, long lines cut, the last one at close", () => {
  const d = mkdtempSync(join(tmpdir(), "c1con-"));
  try {
    const lines: string[] = [];
    const log = new ConsoleLog(join(d, "console.log"), 1 << 20, (l) => lines.push(l));
    const enc = new TextEncoder();
    log.write(enc.encode("boot: one\r\nboot: t"));
    log.write(enc.encode("wo\n\nthr"));
    expect(lines).toEqual(["boot: one", "boot: two", ""]);
    log.write(enc.encode("x".repeat(MAX_LINE_BYTES + 10)));
    expect(lines.slice(3)).toEqual(["thr" + "x".repeat(MAX_LINE_BYTES - 3)]);
    log.write(enc.encode("é\nno newline"));
    expect(lines[4]).toBe("x".repeat(13) + "é");
    log.close();
    expect(lines[5]).toBe("no newline");
    expect(lines.length).toBe(6);
    // the file holds the same bytes as before
    expect(readFileSync(join(d, "console.log"), "utf8")).toBe("boot: one\r\nboot: two\n\nthr" + "x".repeat(MAX_LINE_BYTES + 10) + "é\nno newline");
  } finally {
    rmSync(d, { recursive: true, force: true });
  }
});
