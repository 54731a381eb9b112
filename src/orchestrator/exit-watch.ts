/**
 * Watching started sandboxes for an end of their own: the VMM exits, or the runtime reports the
 * sandbox lost (its disk device removed). Each start (create or resume) gets a node-wide unique
 * generation number; the end of an older generation (the VM a pause or kill stopped on purpose)
 * is not reported. A stop that fails (a pause whose VM runs on, or died meanwhile) watches the
 * same ends again: an end that came meanwhile is reported then.
 */

/** What a started sandbox may end by. */
export interface Ends {
  exited?: Promise<unknown>;
  lost?: Promise<string>;
}

/** Generations of sandbox starts and the watch on their ends. */
export class ExitWatch {
  readonly #generations = new Map<string, number>();
  /** The ends of each sandbox's current start, while watched. */
  readonly #ends = new Map<string, Ends>();
  #last = 0;

  /**
   * @param ended called when the watched start of sandbox `id` ended by itself, with why;
   *   `current()` tells whether that start is still the sandbox's latest (check it again under
   *   the sandbox's lock)
   */
  constructor(private readonly ended: (id: string, why: string, current: () => boolean) => void) {}

  /** Sandbox `id` was started (a new generation): report its end. */
  watch(id: string, started: Ends): void {
    const gen = ++this.#last;
    this.#generations.set(id, gen);
    this.#ends.set(id, started);
    const ends: Promise<string>[] = [];
    if (started.exited) ends.push(started.exited.then(() => "sandbox VM exited unexpectedly"));
    if (started.lost) ends.push(started.lost);
    if (ends.length === 0) return;
    const current = () => this.#generations.get(id) === gen;
    void Promise.race(ends).then((why) => {
      if (current()) this.ended(id, why, current);
    });
  }

  /**
   * Sandbox `id`'s current start is being stopped on purpose (pause, kill): its end is no failure.
   * @returns that start's ends (to `watch` again when the stop fails), or null when none was watched
   */
  forget(id: string): Ends | null {
    this.#generations.delete(id);
    const ends = this.#ends.get(id) ?? null;
    this.#ends.delete(id);
    return ends;
  }
}
