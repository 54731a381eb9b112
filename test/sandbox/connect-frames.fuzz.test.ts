/**
 * Fuzz test of the host's reader of envd's Connect streams (src/sandbox/connect-frames.ts;
 * untrusted input: bytes a guest sends). 4,000 streams from a fixed seed, each fed in random
 * chunk sizes: valid streams (every message must come out equal, in order), streams cut short
 * (the messages before the cut come out, then OrchestratorError `envd_failed` unless the cut
 * falls between envelopes), mutated streams and random bytes. Every input either reads or throws
 * that typed error, and the reader never holds more than one envelope's cap plus one chunk:
 * an oversize length is refused from its header, before the envelope's bytes are read.
 */
import { describe, expect, test } from "bun:test";
import { OrchestratorError } from "../../src/orchestrator/errors.ts";
import { CONNECT_END_STREAM, connectEnvelope, connectFrames, processStream } from "../../src/sandbox/connect-frames.ts";
import { Fuzz, show } from "../helpers/fuzz.ts";

const CASES = 4000;
const CAP = 2048;
const enc = new TextEncoder();

/** An envelope with `flags` around the JSON of `msg`. */
function envelope(msg: unknown, flags = 0): Uint8Array {
  const e = connectEnvelope(msg);
  e[0] = flags;
  return e;
}

/** A random JSON value of about `size` characters. */
function value(f: Fuzz, size: number): unknown {
  return f.pick([
    () => ({ event: { data: { stdout: Buffer.from(f.bytes(Math.floor((size * 3) / 4))).toString("base64") } } }),
    () => ({ s: "é\u2028\"\\".repeat(Math.ceil(size / 12)), n: f.int(-1e6, 1e6), a: [true, null, 1.5] }),
    () => [],
    () => "text",
  ])();
}

/** Bytes of `b` in random chunks; `pulled` counts what the reader has taken. */
async function* chunked(f: Fuzz, b: Uint8Array, pulled: { n: number }, maxChunk: number): AsyncGenerator<Uint8Array> {
  for (let at = 0; at < b.length; ) {
    const n = f.int(1, maxChunk);
    const c = b.slice(at, at + n);
    pulled.n += c.length;
    yield c;
    at += n;
  }
}

type Outcome = { frames: { flags: number; json: unknown }[]; error: OrchestratorError | null };

/** Read `b`: the frames, and the typed error if any; anything else thrown fails with the input. Checks the buffering bound at each frame. */
async function read(f: Fuzz, b: Uint8Array, i: number): Promise<Outcome> {
  const frames: Outcome["frames"] = [];
  const pulled = { n: 0 };
  const maxChunk = f.pick([1, 7, 64, 4096]);
  let consumed = 0;
  try {
    for await (const fr of connectFrames(chunked(f, b, pulled, maxChunk), CAP)) {
      frames.push(fr);
      consumed += 5 + enc.encode(JSON.stringify(fr.json)).length;
      // what the reader holds back: at most one envelope (header + cap) and the chunk it came with
      if (pulled.n - consumed > 5 + CAP + maxChunk + 64) throw new Error(`case ${i} ${show(b)}: ${pulled.n - consumed} bytes held`);
    }
  } catch (e) {
    if (!(e instanceof OrchestratorError) || e.code !== "orchestrator.envd_failed") throw new Error(`case ${i} ${show(b)}: unexpected ${e}`);
    return { frames, error: e };
  }
  return { frames, error: null };
}

describe("connect frames", () => {
  test(`${CASES} valid, truncated, mutated and random streams in random chunks: messages exact or envd_failed`, async () => {
    const f = new Fuzz(0xc0_44ec7);
    const counts = { read: 0, refused: 0 };
    for (let i = 0; i < CASES; i++) {
      const msgs = Array.from({ length: f.int(0, 5) }, () => ({ flags: f.pick([0, 0, 0, CONNECT_END_STREAM]), json: value(f, f.int(0, CAP - 64)) }));
      const envs = msgs.map((m) => envelope(m.json, m.flags));
      const bytes = Uint8Array.from(envs.flatMap((e) => [...e]));
      const kind = i % 4;
      const input = kind === 0 ? bytes : kind === 1 ? f.truncate(bytes) : kind === 2 ? f.mutate(bytes) : f.bytes(f.int(0, 300));
      const r = await read(f, input, i);
      if (r.error) counts.refused++;
      else counts.read++;
      if (kind === 0) {
        if (r.error) throw new Error(`case ${i} ${show(input)}: a valid stream was refused: ${r.error.message}`);
        expect(r.frames).toEqual(msgs);
      } else if (kind === 1) {
        // the envelopes wholly before the cut come out; a cut inside one is refused
        let end = 0;
        let whole = 0;
        while (whole < envs.length && end + envs[whole]!.length <= input.length) end += envs[whole++]!.length;
        expect(r.frames).toEqual(msgs.slice(0, whole));
        expect(r.error === null).toBe(end === input.length);
      }
    }
    expect(counts.read + counts.refused).toBe(CASES);
    expect(counts.refused).toBeGreaterThan(CASES / 4);
  });

  test("an oversize length is refused from its header: the envelope's bytes are never read", async () => {
    const head = new Uint8Array([0, 0, 0, 0, 0]);
    new DataView(head.buffer).setUint32(1, CAP + 1);
    let pulled = 0;
    async function* endless(): AsyncGenerator<Uint8Array> {
      yield envelope({ ok: 1 });
      pulled++;
      yield head;
      for (;;) {
        pulled++;
        yield new Uint8Array(1024);
      }
    }
    const got: unknown[] = [];
    const err = await (async () => {
      for await (const fr of connectFrames(endless(), CAP)) got.push(fr.json);
    })().then(
      () => null,
      (e: unknown) => e,
    );
    expect(got).toEqual([{ ok: 1 }]);
    expect(err).toBeInstanceOf(OrchestratorError);
    expect((err as OrchestratorError).details).toMatchObject({ length: CAP + 1, max: CAP });
    expect(pulled).toBe(1);
    // exactly at the cap is read
    const at = { s: "x".repeat(CAP - 8) };
    expect(enc.encode(JSON.stringify(at)).length).toBe(CAP);
    const one: unknown[] = [];
    for await (const fr of connectFrames((async function* () { yield envelope(at); })(), CAP)) one.push(fr.json);
    expect(one).toEqual([at]);
  });

  test("bytes that are not UTF-8 JSON are refused naming the problem", async () => {
    for (const body of [new Uint8Array([0xff, 0xfe]), enc.encode("{not json"), new Uint8Array(0)]) {
      const e = new Uint8Array(5 + body.length);
      new DataView(e.buffer).setUint32(1, body.length);
      e.set(body, 5);
      const err = await (async () => {
        for await (const _ of connectFrames((async function* () { yield e; })())) void _;
      })().then(() => null, (x: unknown) => x);
      expect(err).toBeInstanceOf(OrchestratorError);
      expect((err as OrchestratorError).message).toContain("not UTF-8 JSON");
    }
  });
});

describe("process streams", () => {
  async function messages(chunks: Uint8Array[]): Promise<unknown[] | OrchestratorError> {
    const out: unknown[] = [];
    try {
      for await (const m of processStream((async function* () { yield* chunks; })())) out.push(m);
    } catch (e) {
      if (e instanceof OrchestratorError) return e;
      throw e;
    }
    return out;
  }

  test("events, then the end of stream (nothing after it is read)", async () => {
    const r = await messages([
      envelope({ event: { start: { pid: 7 } } }),
      envelope({ event: { data: { stdout: "aGk=" } } }),
      envelope({ event: { keepalive: {} } }),
      envelope({ event: { end: { exitCode: 3, exited: true, status: "exit status 3" } } }),
      envelope({ error: { code: "not_found", message: "gone" } }, CONNECT_END_STREAM),
      new Uint8Array([9, 9, 9]),
    ]);
    expect(r).toEqual([
      { end: false, event: { start: { pid: 7 } } },
      { end: false, event: { data: { stdout: "aGk=" } } },
      { end: false, event: { keepalive: {} } },
      { end: false, event: { end: { exitCode: 3, exited: true, status: "exit status 3" } } },
      { end: true, error: { code: "not_found", message: "gone" } },
    ]);
  });

  test("a message of the wrong shape is envd_failed naming the field", async () => {
    const cases: [unknown, number, string][] = [
      [{ event: { start: { pid: "7" } } }, 0, "/event/start/pid"],
      [{ event: { data: { stdout: 5 } } }, 0, "/event/data/stdout"],
      [{ event: { end: { exitCode: 1.5 } } }, 0, "/event/end/exitCode"],
      [[1], 0, ""],
      [{ error: { message: "no code" } }, CONNECT_END_STREAM, "/error/code"],
    ];
    for (const [msg, flags, field] of cases) {
      const r = await messages([envelope(msg, flags)]);
      expect(r).toBeInstanceOf(OrchestratorError);
      expect([(r as OrchestratorError).code, (r as OrchestratorError).details.field]).toEqual(["orchestrator.envd_failed", field]);
    }
  });
});
