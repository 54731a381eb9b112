/** RequestOrder: serial writes in arrival order, reads at once, exclusive operations that drain and hold requests. */
import { describe, expect, test } from "bun:test";
import { RequestOrder } from "../../../src/storage/ublk/order.ts";

/** A promise settled from outside, for stepping through interleavings. */
function deferred<T = void>() {
  let resolve!: (v: T) => void, reject!: (e: unknown) => void;
  const promise = new Promise<T>((a, b) => ((resolve = a), (reject = b)));
  return { promise, resolve, reject };
}
/** Let every settled promise run its callbacks. */
const tick = () => new Promise<void>((r) => setTimeout(r, 0));

describe("RequestOrder", () => {
  test("serial operations run one at a time in arrival order, a failing one does not stop the next; reads start at once", async () => {
    const o = new RequestOrder();
    const log: string[] = [];
    const w1 = deferred(), w2 = deferred(), r = deferred();
    o.admit(() => o.serial(async () => (log.push("w1 start"), await w1.promise, log.push("w1 end"))));
    o.admit(() => o.serial(async () => (log.push("w2 start"), await w2.promise, log.push("w2 end"))));
    o.admit(() => o.serial(async () => void log.push("flush")));
    o.admit(async () => (log.push("read start"), await r.promise, log.push("read end")));
    await tick();
    expect(log.toSorted()).toEqual(["read start", "w1 start"]); // the read does not wait for the write
    expect(o.pending).toBe(4);
    r.resolve();
    await tick();
    expect(log.slice(2)).toEqual(["read end"]);
    w1.reject(new Error("EIO"));
    await tick();
    expect(log.slice(2)).toEqual(["read end", "w2 start"]);
    w2.resolve();
    await o.idle();
    expect(log.slice(2)).toEqual(["read end", "w2 start", "w2 end", "flush"]);
    expect(o.pending).toBe(0);
  });

  test("exclusive starts after the requests already started (reads too) and holds those that arrive until it ends", async () => {
    const o = new RequestOrder();
    const log: string[] = [];
    const w = deferred(), r = deferred(), op = deferred<string>();
    o.admit(() => o.serial(async () => (await w.promise, log.push("write before"))));
    o.admit(async () => (await r.promise, log.push("read before")));
    const ex = o.exclusive(async () => (log.push("restack start"), await op.promise));
    o.admit(async () => void log.push("read after"));
    o.admit(() => o.serial(async () => void log.push("write after")));
    await tick();
    expect(log).toEqual([]); // everything waits for the write and the read started before
    w.resolve();
    await tick();
    expect(log).toEqual(["write before"]); // the read started before still runs
    r.resolve();
    await tick();
    expect(log).toEqual(["write before", "read before", "restack start"]);
    expect(o.pending).toBe(2); // the two requests admitted after it are held
    op.resolve("layer.obd");
    expect(await ex).toBe("layer.obd");
    await o.idle();
    expect(log).toEqual(["write before", "read before", "restack start", "read after", "write after"]);
  });

  test("a failing exclusive rethrows and still lets the held requests go; back-to-back exclusives keep their order", async () => {
    const o = new RequestOrder();
    const log: string[] = [];
    const a = deferred();
    const exA = o.exclusive(async () => (log.push("A"), await a.promise));
    o.admit(async () => void log.push("read 1"));
    const exB = o.exclusive(async () => void log.push("B"));
    o.admit(async () => void log.push("read 2"));
    await tick();
    expect(log).toEqual(["A"]);
    a.reject(new Error("restack failed"));
    expect(await exA.then(() => "ok", (e: Error) => e.message)).toBe("restack failed");
    await exB;
    await o.idle();
    // read 1 arrived between A and B: it runs after A, B waits for it; read 2 waits for B
    expect(log).toEqual(["A", "read 1", "B", "read 2"]);
  });

  test("idle waits for requests held by a running exclusive, not only the ones started", async () => {
    const o = new RequestOrder();
    const op = deferred();
    let answered = 0;
    void o.exclusive(() => op.promise);
    o.admit(async () => void answered++);
    let idle = false;
    void o.idle().then(() => (idle = true));
    await tick();
    expect([idle, answered]).toEqual([false, 0]);
    op.resolve();
    await o.idle();
    expect([idle, answered]).toEqual([true, 1]);
  });
});
