/**
 * Fuzz test of the DNS wire parser (untrusted input: guests' queries and upstream answers reach it
 * through the DNS proxy). 10,000 inputs from a fixed seed: random bytes, prefixes of valid
 * messages, mutated valid messages and compression-pointer tricks. Every input either parses to
 * a well-formed result or throws NetError `net.bad_dns` with an offset inside the input; nothing
 * else escapes. Valid messages round-trip exactly.
 */
import { expect, test } from "bun:test";
import { buildQuery, buildResponse, parseMessage, type DnsMessage } from "../../src/net/dns-wire.ts";
import { NetError } from "../../src/net/errors.ts";
import { Fuzz, show } from "../helpers/fuzz.ts";

const CASES = 10_000;

function label(f: Fuzz): string {
  const n = f.int(1, 20);
  let s = "";
  for (let i = 0; i < n; i++) s += f.pick([..."abcdefghijklmnopqrstuvwxyz0123456789-"]);
  return s;
}

function validResponse(f: Fuzz): { bytes: Uint8Array; name: string; addrs: { ip: string; ttl: number }[] } {
  const name = Array.from({ length: f.int(1, 5) }, () => label(f)).join(".");
  const addrs = Array.from({ length: f.int(0, 6) }, () => ({ ip: [0, 0, 0, 0].map(() => f.int(0, 255)).join("."), ttl: f.int(0, 2 ** 31) }));
  return { bytes: buildResponse(buildQuery(f.int(0, 65535), name), addrs, f.pick([0, 2, 3])), name, addrs };
}

/** Parse `b`: the result, or the NetError it threw; any other throw fails the test with the input. */
function parseOrBadDns(b: Uint8Array, i: number): DnsMessage | NetError {
  try {
    return parseMessage(b);
  } catch (e) {
    if (!(e instanceof NetError) || e.code !== "net.bad_dns") throw new Error(`case ${i} ${show(b)}: unexpected ${e}`);
    const off = e.details.offset as number;
    if (!Number.isInteger(off) || off < 0 || off > b.length) throw new Error(`case ${i} ${show(b)}: offset ${off} outside the input`);
    return e;
  }
}

function wellFormed(m: DnsMessage, b: Uint8Array): boolean {
  return (
    m.id >= 0 &&
    m.id <= 65535 &&
    (m.qname === null || m.qname.length <= 255 * 4) &&
    m.answersA.length <= b.length / 11 &&
    m.answersA.every((a) => /^\d{1,3}(\.\d{1,3}){3}$/.test(a.ip) && a.ttl >= 0 && a.ttl < 2 ** 32)
  );
}

test(`${CASES} random, truncated and mutated messages: a result or net.bad_dns, never anything else`, () => {
  const f = new Fuzz(0x5eed_d115);
  const counts = { random: 0, truncated: 0, mutated: 0, pointers: 0, parsed: 0, refused: 0 };
  for (let i = 0; i < CASES; i++) {
    let input: Uint8Array;
    switch (i % 4) {
      case 0:
        input = f.bytes(f.int(0, 600));
        counts.random++;
        break;
      case 1: {
        const v = validResponse(f);
        input = f.truncate(v.bytes);
        counts.truncated++;
        // a valid message cut anywhere inside its records cannot be read whole
        const r = parseOrBadDns(input, i);
        if (!(r instanceof NetError)) throw new Error(`case ${i} ${show(input)}: a truncated message parsed`);
        counts.refused++;
        continue;
      }
      case 2:
        input = f.mutate(validResponse(f).bytes);
        counts.mutated++;
        break;
      default: {
        // header + names made of pointers anywhere (forward, backward, self, past the end)
        const b = f.bytes(f.int(12, 80));
        new DataView(b.buffer).setUint16(4, f.int(0, 3));
        new DataView(b.buffer).setUint16(6, f.int(0, 3));
        for (let k = f.int(1, 6); k > 0; k--) {
          const at = f.int(12, b.length - 2);
          b[at] = 0xc0 | f.int(0, 0x3f);
          b[at + 1] = f.int(0, 255);
        }
        input = b;
        counts.pointers++;
      }
    }
    const r = parseOrBadDns(input, i);
    if (r instanceof NetError) counts.refused++;
    else {
      if (!wellFormed(r, input)) throw new Error(`case ${i} ${show(input)}: odd result ${JSON.stringify(r)}`);
      counts.parsed++;
    }
  }
  expect(counts.random + counts.truncated + counts.mutated + counts.pointers).toBe(CASES);
  expect(counts.parsed + counts.refused).toBe(CASES);
  // both outcomes occur, so the generator reaches past the header checks
  expect(counts.parsed).toBeGreaterThan(500);
  expect(counts.refused).toBeGreaterThan(2500);
});

test("valid messages round-trip exactly", () => {
  const f = new Fuzz(0xd115);
  for (let i = 0; i < 1000; i++) {
    const v = validResponse(f);
    const m = parseMessage(v.bytes);
    expect(m.qname).toBe(v.name);
    expect(m.answersA).toEqual(v.addrs.map((a) => ({ name: v.name, ...a })));
  }
});
