import { expect, test } from "bun:test";
import { buildQuery, buildResponse, parseMessage, readName, withId } from "../../src/net/dns-wire.ts";
import { NetError } from "../../src/net/errors.ts";

test("query encoding matches RFC 1035 layout", () => {
  const q = buildQuery(0x1234, "a.bc");
  // id 1234, flags RD, qdcount 1, then 1 'a' 2 'b' 'c' 0, type A, class IN
  expect(Buffer.from(q).toString("hex")).toBe("123401000001000000000000" + "0161026263" + "00" + "0001" + "0001");
  const p = parseMessage(q);
  expect(p).toEqual({ id: 0x1234, flags: 0x0100, qname: "a.bc", qtype: 1, answersA: [] });
});

test("responses carry A records with TTLs; ids can be rewritten", () => {
  const r = buildResponse(buildQuery(7, "api.example.com"), [
    { ip: "93.184.216.34", ttl: 300 },
    { ip: "10.0.0.1", ttl: 5 },
  ]);
  const p = parseMessage(withId(r, 99));
  expect(p.id).toBe(99);
  expect(p.flags & 0x8000).toBe(0x8000);
  expect(p.answersA).toEqual([
    { name: "api.example.com", ip: "93.184.216.34", ttl: 300 },
    { name: "api.example.com", ip: "10.0.0.1", ttl: 5 },
  ]);
  expect(parseMessage(buildResponse(buildQuery(8, "x.test"), [], 3)).flags & 0xf).toBe(3);
});

test("compression pointers are followed; loops and truncation are errors", () => {
  // header (12) + "x.test" at 12, then a name "www" + pointer to 12
  const msg = new Uint8Array([...new Array(12).fill(0), 1, 120, 4, 116, 101, 115, 116, 0, 3, 119, 119, 119, 0xc0, 12]);
  expect(readName(msg, 20)).toEqual({ name: "www.x.test", next: 26 });
  const loop = new Uint8Array([...new Array(12).fill(0), 0xc0, 12]);
  expect(() => readName(loop, 12)).toThrow(NetError);
  expect(() => parseMessage(new Uint8Array(5))).toThrow("shorter than the 12-byte header");
  const q = buildQuery(1, "a.b");
  expect(() => parseMessage(q.subarray(0, q.length - 2))).toThrow(NetError);
});
