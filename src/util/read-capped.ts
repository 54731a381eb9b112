/**
 * Reading a body from outside the process (an HTTP answer of a guest or a peer) without letting
 * it decide how much memory the reader spends: at most `maxBytes` are kept, the rest is not read
 * (the stream is cancelled). The caller decides what an over-long body means (an error, or a
 * message cut short).
 */

/** A body read up to a bound: its first bytes, and whether more followed. */
export interface CappedBody {
  bytes: Uint8Array;
  /** True when the body was longer than the bound (what followed was not read). */
  truncated: boolean;
}

/**
 * Read `body` (a Response's body, null = empty) keeping at most `maxBytes`.
 * @throws what reading the stream throws (a reset connection, an abort).
 */
export async function readCapped(body: ReadableStream<Uint8Array> | null, maxBytes: number): Promise<CappedBody> {
  if (!body) return { bytes: new Uint8Array(0), truncated: false };
  const chunks: Uint8Array[] = [];
  let n = 0;
  const reader = body.getReader();
  try {
    for (;;) {
      const r = await reader.read();
      if (r.done) return { bytes: join(chunks, n), truncated: false };
      const room = maxBytes - n;
      if (r.value.byteLength > room) {
        if (room > 0) chunks.push(r.value.subarray(0, room));
        await reader.cancel().catch(() => {});
        return { bytes: join(chunks, maxBytes), truncated: true };
      }
      chunks.push(r.value);
      n += r.value.byteLength;
    }
  } finally {
    reader.releaseLock();
  }
}

/** The text of `res`'s body cut at `maxBytes` (for an error message: a cut body is marked with "…"). */
export async function textCapped(res: Response, maxBytes: number): Promise<string> {
  const b = await readCapped(res.body, maxBytes);
  return new TextDecoder().decode(b.bytes) + (b.truncated ? "…" : "");
}

function join(chunks: Uint8Array[], n: number): Uint8Array {
  if (chunks.length === 1) return chunks[0]!;
  const out = new Uint8Array(n);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}
