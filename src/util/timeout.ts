/**
 * Bounding a wait on a promise. The timer is cleared as soon as the promise settles, so a
 * bounded wait never keeps the process alive or fires late.
 */

/**
 * `p`'s value, or a rejection with `onTimeout()` when `ms` pass first (`p` keeps running).
 * @throws what `p` rejects with, or `onTimeout()`'s error
 */
export async function withTimeout<T>(p: Promise<T>, ms: number, onTimeout: () => Error): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(onTimeout()), Math.max(0, ms))));
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * `p`'s value, or `late` when `ms` pass first (`p` keeps running), e.g.
 * `await orLate(flush().then(() => true), 5000, false)`.
 * @throws what `p` rejects with before `ms` pass
 */
export async function orLate<T, const L>(p: Promise<T>, ms: number, late: L): Promise<T | L> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timedOut = new Promise<L>((resolve) => (timer = setTimeout(() => resolve(late), Math.max(0, ms))));
  try {
    return await Promise.race([p, timedOut]);
  } finally {
    clearTimeout(timer);
  }
}
