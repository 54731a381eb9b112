/**
 * Sandbox expiry: a running sandbox whose `endAt` has passed is killed, or paused with
 * `autoPause`. One timer (src/util/deadline-timer.ts) armed at the earliest deadline of the
 * running sandboxes, and again whenever a state or a deadline changes, instead of a periodic
 * scan: nothing runs while no deadline is due, and a due one is acted on at its time.
 */
import type { Logger } from "pino";
import { DeadlineTimer, type Clock } from "../util/deadline-timer.ts";
import { OrchestratorError } from "./errors.ts";
import type { SandboxStore } from "./store.ts";

/**
 * After a failed expiry action, the timer fires no sooner than this, ms: a sandbox still running
 * past its deadline is acted on again then, never in a tight loop.
 */
const RETRY_MS = 1000;

/** A running sandbox past its deadline, with what its expiry does. */
export interface ExpiredSandbox {
  id: string;
  autoPause: boolean;
  autoPauseMemory: boolean;
}

/** The expiry timer of one orchestrator. */
export class SandboxExpiry {
  /** Sandboxes whose expiry action is running: not acted on again, nor waited for, until it ends. */
  readonly #expiring = new Set<string>();
  readonly #timer: DeadlineTimer;
  /** No firing before this (unix ms): set by a failed action. */
  #notBefore = 0;
  #started = false;

  /**
   * @param act the expiry action of one sandbox (kill or pause); its failure is logged, and the
   *   sandbox, if still running and due, acted on again at the next firing
   */
  constructor(
    private readonly store: SandboxStore,
    private readonly clock: Clock,
    private readonly act: (s: ExpiredSandbox) => Promise<void>,
    private readonly log: Logger,
  ) {
    this.#timer = new DeadlineTimer(() => this.#due(), (err) => this.log.error({ err }, "expiry sweep failed"), clock);
  }

  /** Arm the timer (at once for what is due already). */
  start(): void {
    this.#started = true;
    this.changed();
  }

  /** Disarm for good (waits for a firing in progress); actions already running finish on their own. */
  stop(): Promise<void> {
    this.#started = false;
    return this.#timer.stop();
  }

  /** Resolves once no firing is in progress (a test moving a fake clock waits for the re-arming). */
  idle(): Promise<void> {
    return this.#timer.idle();
  }

  /** When the timer fires next (unix ms), or null (none running, or stopped). */
  get armedAt(): number | null {
    return this.#timer.armedAt;
  }

  /** A state or a deadline changed: make sure the timer fires at the earliest deadline now. */
  changed(): void {
    const next = this.#next();
    if (next !== null) this.#timer.armAt(next);
  }

  /** The earliest deadline not being acted on, no sooner than a failure allows; null when none. */
  #next(): number | null {
    if (!this.#started) return null;
    const due = this.store.nextExpiry(this.#expiring);
    return due === null ? null : Math.max(due, this.#notBefore);
  }

  /** Act on every running sandbox past its deadline; the next deadline to fire at. */
  #due(): number | null {
    for (const s of this.store.expired(this.clock.now())) {
      if (this.#expiring.has(s.id)) continue;
      this.#expiring.add(s.id);
      this.log.info({ sandboxId: s.id, action: s.autoPause ? "pause" : "kill" }, "sandbox timeout reached");
      this.act(s)
        .catch((e) => {
          if (e instanceof OrchestratorError && e.code === "orchestrator.not_found") return;
          this.log.error({ sandboxId: s.id, err: e }, "expiry action failed");
          this.#notBefore = this.clock.now() + RETRY_MS;
        })
        .finally(() => {
          this.#expiring.delete(s.id);
          this.changed();
        });
    }
    return this.#next();
  }
}
