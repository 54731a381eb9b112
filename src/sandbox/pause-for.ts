/**
 * Waiting a while unless told to stop: the one timed wait of the sandbox parts (poll periods,
 * back-offs, quiet windows), ended at once by an abort.
 */

/** Resolve after `ms`, or as soon as `signal` aborts (at once when it has); never rejects. */
export function pauseFor(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}
