import { expect, test } from "bun:test";
import { LruMap } from "../../src/util/lru.ts";

test("past its bound the least recently used entry goes; get and set make an entry recent, peek does not", () => {
  const evicted: string[] = [];
  const m = new LruMap<string, number>(3, { onEvict: (k, v) => evicted.push(`${k}=${v}`) });
  m.set("a", 1).set("b", 2).set("c", 3);
  expect(m.get("a")).toBe(1); // a is now the most recent
  expect(m.peek("b")).toBe(2); // b stays the oldest
  m.set("d", 4);
  expect(evicted).toEqual(["b=2"]);
  expect([...m.keys()]).toEqual(["c", "a", "d"]);
  m.set("c", 30); // an update moves it to the end, evicts nothing
  expect([...m.entries()]).toEqual([["a", 1], ["d", 4], ["c", 30]]);
  expect(m.size).toBe(3);
  expect(evicted).toEqual(["b=2"]);
});

test("delete and clear forget without reporting an eviction", () => {
  const evicted: string[] = [];
  const m = new LruMap<string, number>(2, { onEvict: (k) => evicted.push(k) });
  m.set("a", 1).set("b", 2);
  expect(m.delete("a")).toBe(true);
  expect(m.delete("a")).toBe(false);
  expect(m.has("a")).toBe(false);
  m.clear();
  expect(m.size).toBe(0);
  expect(m.weight).toBe(0);
  expect(m.get("b")).toBeUndefined();
  expect(evicted).toEqual([]);
});

test("with weigh the bound is a total weight: several light entries go for one heavy one, a too heavy one is not kept", () => {
  const evicted: number[] = [];
  const m = new LruMap<number, Uint8Array>(10, { weigh: (b) => b.length, onEvict: (k) => evicted.push(k) });
  m.set(1, new Uint8Array(3)).set(2, new Uint8Array(3)).set(3, new Uint8Array(3));
  expect(m.weight).toBe(9);
  m.set(4, new Uint8Array(7));
  expect(evicted).toEqual([1, 2]);
  expect([...m.keys()]).toEqual([3, 4]);
  expect(m.weight).toBe(10);
  m.set(5, new Uint8Array(11));
  expect(m.size).toBe(0);
  expect(m.weight).toBe(0);
  expect(evicted).toEqual([1, 2, 3, 4, 5]);
});

test("entries may be deleted while iterating (sweeping expired ones)", () => {
  const m = new LruMap<string, number>(5);
  for (const [k, v] of [["a", 1], ["b", 2], ["c", 3], ["d", 4]] as const) m.set(k, v);
  for (const [k, v] of m) if (v % 2 === 0) m.delete(k);
  expect([...m.values()]).toEqual([1, 3]);
  expect(m.weight).toBe(2);
});
