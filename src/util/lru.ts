/**
 * A bounded map that forgets the least recently used entries first: `get` and `set` make an
 * entry the most recent; past the bound the oldest entries go (reported to `onEvict`). The bound
 * counts entries, or with `weigh` the sum of the entries' weights (e.g. bytes).
 */

/** Options of an LruMap. */
export interface LruOptions<K, V> {
  /** Weight of one entry (default 1: the bound counts entries). A weight is read once, when the entry is set. */
  weigh?: (value: V, key: K) => number;
  /** Called with each entry that `set` pushes out (not for `delete` or `clear`). */
  onEvict?: (key: K, value: V) => void;
}

/** A Map bounded by entries or weight, least recently used first in iteration. */
export class LruMap<K, V> {
  readonly #map = new Map<K, { value: V; weight: number }>();
  #weight = 0;

  /**
   * @param max the bound: entries, or the total weight with `opts.weigh` (>= 0). An entry heavier
   *   than `max` alone is not kept.
   */
  constructor(
    readonly max: number,
    private readonly opts: LruOptions<K, V> = {},
  ) {}

  /** Entries held. */
  get size(): number {
    return this.#map.size;
  }

  /** Sum of the entries' weights (their number without `weigh`). */
  get weight(): number {
    return this.#weight;
  }

  has(key: K): boolean {
    return this.#map.has(key);
  }

  /** The value of `key`, made the most recently used; undefined when absent. */
  get(key: K): V | undefined {
    const e = this.#map.get(key);
    if (!e) return undefined;
    this.#map.delete(key);
    this.#map.set(key, e);
    return e.value;
  }

  /** The value of `key` without touching its place. */
  peek(key: K): V | undefined {
    return this.#map.get(key)?.value;
  }

  /** Set `key` as the most recently used entry, then evict the oldest entries past `max`. */
  set(key: K, value: V): this {
    this.delete(key);
    const weight = this.opts.weigh ? this.opts.weigh(value, key) : 1;
    this.#map.set(key, { value, weight });
    this.#weight += weight;
    while (this.#weight > this.max && this.#map.size > 0) {
      const [k, e] = this.#map.entries().next().value as [K, { value: V; weight: number }];
      this.#map.delete(k);
      this.#weight -= e.weight;
      this.opts.onEvict?.(k, e.value);
    }
    return this;
  }

  /** Forget `key`. @returns whether it was there */
  delete(key: K): boolean {
    const e = this.#map.get(key);
    if (!e) return false;
    this.#map.delete(key);
    this.#weight -= e.weight;
    return true;
  }

  clear(): void {
    this.#map.clear();
    this.#weight = 0;
  }

  /** Keys, least recently used first. */
  *keys(): IterableIterator<K> {
    yield* this.#map.keys();
  }

  /** Values, least recently used first. */
  *values(): IterableIterator<V> {
    for (const e of this.#map.values()) yield e.value;
  }

  /** Entries, least recently used first; deleting while iterating is allowed. */
  *entries(): IterableIterator<[K, V]> {
    for (const [k, e] of this.#map) yield [k, e.value];
  }

  [Symbol.iterator](): IterableIterator<[K, V]> {
    return this.entries();
  }
}
