/**
 * Bytes received from a stream and not yet taken, kept as the chunks they arrived in: a reader of
 * length-prefixed frames appends each chunk and takes a frame once it is complete, so every byte
 * is copied at most once (a frame within one chunk not at all) however many chunks a frame spans.
 * Bounding it is the reader's job: it checks a frame's length before waiting for its bytes.
 */
/** A queue of received bytes; `length` is how many are held. */
export class ChunkQueue {
  #chunks: Uint8Array[] = [];
  /** Offset into the first chunk. */
  #head = 0;
  length = 0;

  /** Append a chunk (kept by reference: the caller must not change it). */
  push(c: Uint8Array): void {
    if (c.byteLength === 0) return;
    this.#chunks.push(c);
    this.length += c.byteLength;
  }

  /** Remove and return the next `n` bytes (n ≤ length): a view when they lie in one chunk, else one copy. */
  take(n: number): Uint8Array {
    const first = this.#chunks[0];
    if (n === 0 || !first) return new Uint8Array(0);
    this.length -= n;
    if (first.byteLength - this.#head >= n) {
      const out = first.subarray(this.#head, this.#head + n);
      this.#head += n;
      if (this.#head === first.byteLength) this.#drop();
      return out;
    }
    const out = new Uint8Array(n);
    for (let at = 0; at < n; ) {
      const c = this.#chunks[0]!;
      const k = Math.min(n - at, c.byteLength - this.#head);
      out.set(c.subarray(this.#head, this.#head + k), at);
      at += k;
      this.#head += k;
      if (this.#head === c.byteLength) this.#drop();
    }
    return out;
  }

  /** Drop everything held. */
  clear(): void {
    this.#chunks = [];
    this.#head = 0;
    this.length = 0;
  }

  #drop(): void {
    this.#chunks.shift();
    this.#head = 0;
  }
}
