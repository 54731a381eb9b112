/**
 * Freeing a buffer as soon as its bytes are written, instead of leaving it to the garbage
 * collector: the next reads of a stream then reuse that memory rather than fault in fresh pages
 * (envd output reads, upload chunks).
 */

/**
 * True when `data` is the whole of an ArrayBuffer of its own (pipe reads and request body chunks
 * are; a reader handing out slices of one shared buffer would not be), which `freeBuffer` frees.
 */
export function freedOnRelease(data: Uint8Array): boolean {
  const buf = data.buffer;
  return buf instanceof ArrayBuffer && !buf.detached && data.byteOffset === 0 && data.byteLength === buf.byteLength;
}

/**
 * Free `data`'s memory now (detach its ArrayBuffer with `ArrayBuffer.prototype.transfer(0)`) when
 * `freedOnRelease(data)`; a view into a larger buffer, or a buffer that cannot be detached, is left
 * to the collector. The caller must hold no other use of the bytes: `data` reads as empty after.
 */
export function freeBuffer(data: Uint8Array): void {
  if (!freedOnRelease(data)) return;
  try {
    (data.buffer as ArrayBuffer).transfer(0);
  } catch {
    /* not detachable: the collector frees it */
  }
}
