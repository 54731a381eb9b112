/**
 * The one way tests wait for something that happens on its own (a background loop, another
 * process, a server): `waitFor` polls a probe until it yields a value, within a bound, and fails
 * naming what it waited for and what it saw last; `waitEvent` awaits an event with the same kind
 * of bound. Never a fixed sleep before an assertion: the test goes on the moment the condition
 * holds, and a condition that never holds fails with a message instead of a wrong assertion.
 */

/** Bounds of a wait. */
export interface WaitOptions {
  /** Longest wait, ms (default 10 s). */
  timeoutMs?: number;
  /** Longest pause between probes, ms (default 50): probes start 1 ms apart and back off to it. */
  maxIntervalMs?: number;
  /**
   * A probe that throws counts as "not yet" (a server not up, a record not written yet) instead
   * of ending the wait with its error (the default: a probe's failure is the test's).
   */
  retryErrors?: boolean;
}

/** A probe's answer that means "not yet". */
type NotYet = undefined | null | false | 0 | "";

/**
 * Call `probe` until it returns a value that is not undefined, null, false, 0 or "", at most
 * `timeoutMs`. A probe that throws ends the wait with its error, unless `retryErrors`.
 * @returns that value
 * @throws Error `timed out after N ms waiting for <what>` with the probe's last answer or error
 * @example const pid = await waitFor("the daemon's pid file", () => readPid(path));
 */
export async function waitFor<T>(what: string, probe: () => T | Promise<T>, o: WaitOptions = {}): Promise<Exclude<T, NotYet>> {
  const timeoutMs = o.timeoutMs ?? 10_000;
  const maxInterval = o.maxIntervalMs ?? 50;
  const deadline = performance.now() + timeoutMs;
  let interval = 1;
  let last: string = "no answer yet";
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined && v !== null && v !== false && v !== 0 && v !== "") return v as Exclude<T, NotYet>;
      last = `last answer ${JSON.stringify(v) ?? String(v)}`;
    } catch (e) {
      if (!o.retryErrors) throw e;
      last = `last error ${e instanceof Error ? e.message : String(e)}`;
    }
    const left = deadline - performance.now();
    if (left <= 0) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (${last})`);
    await Bun.sleep(Math.min(interval, left));
    interval = Math.min(interval * 2, maxInterval);
  }
}

/**
 * Await `promise` (an event: a process exit, a message, a callback turned into a promise) for at
 * most `timeoutMs`.
 * @throws Error `timed out after N ms waiting for <what>`
 */
export async function waitEvent<T>(what: string, promise: Promise<T>, timeoutMs = 10_000): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)), timeoutMs);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
