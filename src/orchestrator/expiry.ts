/**
 * Sandbox expiry: a running sandbox whose `endAt` has passed is killed, or paused with
 * `autoPause`. One timer, armed at the earliest deadline of the running sandboxes and armed
 * again whenever a state or a deadline changes, instead of a periodic scan: nothing runs while
 * no deadline is due, and a due one is acted on at its time.
 */
import type { Logger } from "pino";
import type { Clock } from "./clock.ts";
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
  #cancel: (() => void) | undefined;
  /** The deadline the timer is armed at (unix ms), or null when none is. */
  #armedAt: number | null = null;
  /** No firing before this (unix ms): set by a failed action. */
  #notBefore = 0;
  #stopped = true;

  /**
   * @param act the expiry action of one sandbox (kill or pause); its failure is logged, and the
   *   sandbox, if still running and due, acted on again at the next arming
   */
  constructor(
    private readonly store: SandboxStore,
    private readonly clock: Clock,
    private readonly act: (s: ExpiredSandbox) => Promise<void>,
    private readonly log: Logger,
  ) {}

  /** Arm the timer (at once for what is due already). */
  start(): void {
    this.#stopped = false;
    this.changed();
  }

  /** Disarm for good; actions already running finish on their own. */
  stop(): void {
    this.#stopped = true;
    this.#disarm();
  }

  /** When the timer fires next (unix ms: the earliest deadline), or null (none running, or stopped). */
  get armedAt(): number | null {
    return this.#armedAt;
  }

  /** A state or a deadline changed: arm the timer at the earliest deadline now. */
  changed(): void {
    if (this.#stopped) return;
    const due = this.store.nextExpiry(this.#expiring);
    const next = due === null ? null : Math.max(due, this.#notBefore);
    if (next === this.#armedAt) return;
    this.#disarm();
    if (next === null) return;
    this.#armedAt = next;
    this.#cancel = this.clock.after(next - this.clock.now(), () => {
      this.#cancel = undefined;
      this.#armedAt = null;
      this.#due();
    });
  }

  #disarm(): void {
    this.#cancel?.();
    this.#cancel = undefined;
    this.#armedAt = null;
  }

  /** Act on every running sandbox past its deadline, then arm for the next. */
  #due(): void {
    if (this.#stopped) return;
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
    this.changed();
  }
}
