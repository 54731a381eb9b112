/**
 * Fuzz test of envd's streaming multipart reader (untrusted input: upload bodies from any
 * client). 10,000 inputs from a fixed seed, each fed in random chunk sizes: valid bodies (their
 * parts must come out byte-exact), valid bodies cut short (must be refused), mutated bodies and
 * random bytes. Every input either parses or throws EnvdError `invalid_argument`; the sinks never
 * receive more bytes than the input holds.
 */
import { expect, test } from "bun:test";
import { EnvdError } from "../../src/envd/errors.ts";
import { boundaryOf, parseDisposition, readMultipart, type PartInfo } from "../../src/envd/http/multipart.ts";
import { Fuzz, show } from "../helpers/fuzz.ts";

const CASES = 10_000;
const enc = new TextEncoder();

interface Part {
  name: string;
  filename: string;
  body: Uint8Array;
}

function body(f: Fuzz, boundary: string): { bytes: Uint8Array; parts: Part[] } {
  const parts: Part[] = Array.from({ length: f.int(0, 4) }, (_, i) => {
    // bodies that contain pieces of the delimiter, CRLFs and dashes, to stress the matcher
    const pieces = Array.from({ length: f.int(0, 6) }, () =>
      f.pick([f.bytes(f.int(0, 40)), enc.encode("\r\n"), enc.encode(`\r\n--${boundary.slice(0, f.int(0, boundary.length))}`), enc.encode("--"), enc.encode(boundary)]),
    );
    let b = Uint8Array.from(pieces.flatMap((p) => [...p]));
    // a part's body never holds the delimiter itself (RFC 2046 §5.1.1): the sender picks the boundary so
    if (Buffer.from(b).includes(`\r\n--${boundary}`) || Buffer.from(b).subarray(0, boundary.length + 2).equals(Buffer.from(`--${boundary}`))) b = new Uint8Array();
    return { name: `f${i}`, filename: f.pick(["a.txt", "/tmp/测试 文件.txt", "dir/x y", ""]), body: b };
  });
  const chunks: Uint8Array[] = [enc.encode(f.pick(["", "preamble\r\n"]))];
  for (const p of parts) {
    chunks.push(enc.encode(`--${boundary}\r\nContent-Disposition: form-data; name="${p.name}"; filename="${p.filename}"\r\nContent-Type: application/octet-stream\r\n\r\n`));
    chunks.push(p.body, enc.encode("\r\n"));
  }
  chunks.push(enc.encode(`--${boundary}--${f.pick(["", "\r\n", "\r\nepilogue"])}`));
  return { bytes: Uint8Array.from(chunks.flatMap((c) => [...c])), parts };
}

async function* chunked(f: Fuzz, b: Uint8Array): AsyncGenerator<Uint8Array> {
  for (let at = 0; at < b.length; ) {
    const n = f.int(1, f.pick([1, 7, 64, 4096]));
    yield b.slice(at, at + n);
    at += n;
  }
}

/** Parse `b` fed in random chunks: the parts read, or the EnvdError thrown; any other throw fails with the input. */
async function parse(f: Fuzz, b: Uint8Array, boundary: string, i: number): Promise<{ info: PartInfo; body: Uint8Array }[] | EnvdError> {
  const out: { info: PartInfo; body: Uint8Array }[] = [];
  let delivered = 0;
  try {
    await readMultipart(
      chunked(f, b),
      boundary,
      async (info) => {
        const acc: number[] = [];
        let ended = false;
        out.push({ info, body: new Uint8Array() });
        return {
          write: async (c) => {
            if (ended) throw new Error("write after end");
            delivered += c.length;
            acc.push(...c);
          },
          end: async () => {
            if (ended) throw new Error("end twice");
            ended = true;
            out[out.length - 1]!.body = Uint8Array.from(acc);
          },
        };
      },
      1024,
    );
  } catch (e) {
    if (!(e instanceof EnvdError) || e.code !== "envd.invalid_argument") throw new Error(`case ${i} ${show(b)}: unexpected ${e}`);
    return e;
  }
  if (delivered > b.length) throw new Error(`case ${i} ${show(b)}: sinks got ${delivered} bytes of a ${b.length}-byte input`);
  return out;
}

test(`${CASES} valid, truncated, mutated and random bodies in random chunks: parts byte-exact or invalid_argument`, async () => {
  const f = new Fuzz(0x5eed_f0e0);
  const counts = { valid: 0, truncated: 0, parsed: 0, refused: 0 };
  for (let i = 0; i < CASES; i++) {
    const boundary = f.pick(["zz", "----WebKitFormBoundary7MA4YWxkTrZu0gW", "a'()+_,-./:=? b", "x".repeat(70)]);
    const v = body(f, boundary);
    const kind = i % 4;
    const input = kind === 0 ? v.bytes : kind === 1 ? f.truncate(v.bytes) : kind === 2 ? f.mutate(v.bytes) : f.bytes(f.int(0, 300));
    const r = await parse(f, input, boundary, i);
    if (r instanceof EnvdError) counts.refused++;
    else counts.parsed++;
    if (kind === 0) {
      counts.valid++;
      if (r instanceof EnvdError) throw new Error(`case ${i} ${show(input)}: a valid body was refused: ${r.message}`);
      expect(r.map((p) => [p.info.name, p.info.filename, Buffer.from(p.body).toString("hex")])).toEqual(
        v.parts.map((p) => [p.name, p.filename, Buffer.from(p.body).toString("hex")]),
      );
    } else if (kind === 1) {
      counts.truncated++;
      // cut before the closing delimiter's "--": the body cannot be complete
      const closing = v.bytes.length - (v.bytes.length - Buffer.from(v.bytes).lastIndexOf(`--${boundary}--`)) + boundary.length + 4;
      if (input.length < closing && !(r instanceof EnvdError)) throw new Error(`case ${i} ${show(input)}: a truncated body parsed`);
    }
  }
  expect(counts.valid).toBe(CASES / 4);
  expect(counts.parsed + counts.refused).toBe(CASES);
  expect(counts.refused).toBeGreaterThan(CASES / 4);
});

test("header values the reader takes apart: bad boundaries and percent-encodings are invalid_argument", () => {
  const f = new Fuzz(0xb0b);
  for (let i = 0; i < 2000; i++) {
    const s = Buffer.from(f.bytes(f.int(0, 60))).toString("latin1");
    for (const input of [`multipart/form-data; boundary=${s}`, `form-data; filename*=UTF-8''${s}`, `form-data; name="${s}"; filename=${s}`]) {
      try {
        boundaryOf(input);
        parseDisposition(input);
      } catch (e) {
        if (!(e instanceof EnvdError) || e.code !== "envd.invalid_argument") throw new Error(`${JSON.stringify(input)}: unexpected ${e}`);
      }
    }
  }
  expect(() => parseDisposition("form-data; filename*=UTF-8''%E0%A4%A")).toThrow(EnvdError);
});
