// Plain parts of the console: one-use terminal tickets, the log follower's cursor, and the
// build progress display's phases.
import { expect, test } from "bun:test";
import { LogCursor, TicketBook, type LogEntryBody } from "../../src/console/index.ts";
import { MAX_OUTSTANDING_TICKETS } from "../../src/console/tickets.ts";
import { BuildProgress, phaseOf } from "../../src/cli/build-progress.ts";

test("tickets: one use, bound to their sandbox, expire after the TTL, at most MAX_OUTSTANDING_TICKETS kept", () => {
  let now = 1_000_000;
  const book = new TicketBook(30_000, () => now);
  const a = book.mint("sbx-a");
  expect(a.ticket).toMatch(/^[0-9a-f]{64}$/);
  expect(a.expiresAt).toBe(1_030_000);
  expect(book.redeem(a.ticket, "sbx-a")).toBe(true);
  expect(book.redeem(a.ticket, "sbx-a")).toBe(false);
  // shown for another sandbox: refused and spent
  const b = book.mint("sbx-b");
  expect(book.redeem(b.ticket, "sbx-a")).toBe(false);
  expect(book.redeem(b.ticket, "sbx-b")).toBe(false);
  // expiry: valid at its last millisecond, refused after
  const c = book.mint("sbx-c");
  const d = book.mint("sbx-c");
  now += 30_000;
  expect(book.redeem(c.ticket, "sbx-c")).toBe(true);
  now += 1;
  expect(book.redeem(d.ticket, "sbx-c")).toBe(false);
  // malformed input
  for (const bad of [undefined, null, 42, "", "zz".repeat(32), a.ticket.toUpperCase()]) expect(book.redeem(bad, "sbx-a")).toBe(false);
  // bounded: the oldest go first
  const first = book.mint("x");
  for (let i = 0; i < MAX_OUTSTANDING_TICKETS; i++) book.mint("x");
  expect(book.size).toBe(MAX_OUTSTANDING_TICKETS);
  expect(book.redeem(first.ticket, "x")).toBe(false);
});

const entry = (ms: number, message: string): LogEntryBody => ({ timestamp: new Date(ms).toISOString(), level: "info", message, fields: {} });

test("log cursor: an inclusive cursor never repeats or drops entries that share a millisecond", () => {
  const c = new LogCursor();
  expect(new URLSearchParams(c.query(1000, { level: "warn" })).get("cursor")).toBe("0");
  expect(c.take([entry(10, "a"), entry(20, "b"), entry(20, "c")]).map((e) => e.message)).toEqual(["a", "b", "c"]);
  const q = new URLSearchParams(c.query(1000));
  expect([q.get("cursor"), q.get("direction"), q.get("limit")]).toEqual(["20", "forward", "1000"]);
  // the next page starts at 20 again: b and c come back, d is new (same ms), e later
  expect(c.take([entry(20, "b"), entry(20, "c"), entry(20, "d"), entry(30, "e")]).map((e) => e.message)).toEqual(["d", "e"]);
  expect(c.take([entry(30, "e")])).toEqual([]);
  expect(c.take([])).toEqual([]);
  expect(c.take([entry(30, "e"), entry(30, "f")]).map((e) => e.message)).toEqual(["f"]);
});

test("build progress: phases from the builder's log lines; a status line only on a terminal", () => {
  expect(phaseOf("[base] FROM TEMPLATE base")).toBe("base image");
  expect(phaseOf("[builder 3/7] RUN apt-get install -y curl [abc123]")).toBe("step 3/7");
  expect(phaseOf("CACHED [builder 1/7] USER root [abc]")).toBe("step 1/7 (cached)");
  expect(phaseOf("[finalize] START python3 -m http.server")).toBe("finalize");
  expect(phaseOf("Copying blob sha256:abc")).toBeNull();
  const plain: string[] = [];
  const p = new BuildProgress({ write: (s: string) => plain.push(s) }, false);
  p.log("[builder 1/2] RUN true [k]");
  p.done();
  expect(plain.length).toBe(1);
  expect(plain[0]).toMatch(/^\[\s*\d+\.\ds\] \[builder 1\/2\] RUN true \[k\]\n$/);
  const tty: string[] = [];
  const t = new BuildProgress({ write: (s: string) => tty.push(s) }, true);
  t.log("[builder 2/2] RUN make [k]");
  t.done();
  expect(tty.join("")).toContain("building: step 2/2 · ");
  expect(tty[tty.length - 1]).toBe("\r\x1b[K");
});
