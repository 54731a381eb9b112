/**
 * Run an async function over a list with a bound on how many calls are in flight.
 */

/**
 * `fn` over each of `items` with at most `limit` calls in flight at once; the results in the
 * order of `items`. The first rejection rejects the whole (calls already started run to their
 * end; none starts after it).
 * @throws RangeError when `limit` is not a positive integer
 */
export async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  if (!Number.isInteger(limit) || limit < 1) throw new RangeError(`mapLimit: limit must be a positive integer, got ${limit}`);
  const out = new Array<R>(items.length);
  let next = 0;
  let failed = false;
  const worker = async (): Promise<void> => {
    while (!failed && next < items.length) {
      const i = next++;
      try {
        out[i] = await fn(items[i]!, i);
      } catch (e) {
        failed = true;
        throw e;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}
