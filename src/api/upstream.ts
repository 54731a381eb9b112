/**
 * Forwarding a request to an upstream over fetch, the pieces the node's sandbox proxy (proxy.ts)
 * and the gateway (services/gateway/forward.ts) share: how a fetch failed, in our own words, and
 * the one timer that bounds each phase of a request (connecting, a streamed body, the answer).
 */

/**
 * How an upstream fetch failed: `refused` and `unreachable` mean nothing reached the upstream
 * (safe to send the request elsewhere); `aborted` = our signal fired (a deadline or the
 * client went away); the others may have delivered part of the request.
 */
export type UpstreamFailureKind = "refused" | "unreachable" | "reset" | "timeout" | "aborted" | "failed";

/** The kind of a failed upstream fetch (`signal`: the request's abort signal). */
export function upstreamFailureKind(e: unknown, signal: AbortSignal): UpstreamFailureKind {
  if (signal.aborted) return "aborted";
  switch ((e as { code?: unknown } | null)?.code) {
    case "ECONNREFUSED":
    case "ConnectionRefused":
      return "refused";
    case "ECONNRESET":
    case "ConnectionReset":
    case "ConnectionClosed":
      return "reset";
    case "ETIMEDOUT":
    case "Timeout":
      return "timeout";
    case "EHOSTUNREACH":
    case "ENETUNREACH":
      return "unreachable";
    default:
      return "failed";
  }
}

const FAILURE_WORDS: Record<Exclude<UpstreamFailureKind, "aborted" | "failed">, string> = {
  refused: "connection refused",
  reset: "connection reset",
  timeout: "connection timed out",
  unreachable: "address unreachable",
};

/**
 * Our own words for a failed upstream fetch (Bun's messages address a desktop user: "Is the
 * computer able to access the url?"). `signal` is the request's abort signal (timeout reason).
 */
export function upstreamFailure(e: unknown, signal: AbortSignal): string {
  const kind = upstreamFailureKind(e, signal);
  if (kind === "aborted") return signal.reason instanceof Error ? signal.reason.message : "request aborted";
  if (kind !== "failed") return FAILURE_WORDS[kind];
  const code = (e as { code?: unknown } | null)?.code;
  return typeof code === "string" ? `connection failed (${code})` : "connection failed";
}

/** One timer that aborts `ctl` with a reason; re-armed as a request moves from phase to phase. */
export class Watchdog {
  private timer: ReturnType<typeof setTimeout> | undefined;
  /** Set by watchedBody once the upstream pulled the body: it is connected and part of the request may have reached it. */
  bodyPulled = false;
  constructor(private readonly ctl: AbortController) {}
  /** Abort with `reason` after `ms` unless re-armed or cleared first. */
  arm(ms: number, reason: string): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.ctl.abort(new Error(reason)), ms);
  }
  clear(): void {
    clearTimeout(this.timer);
  }
}

/**
 * The client's request body as the upstream pulls it: a pull means the upstream is connected and
 * reading, so each one re-arms `dog` with the idle bound (the connect bound stops counting), and
 * the end of the body leaves `endMs` (default: the idle bound) on the wait for response headers.
 * Nothing is read ahead of the upstream (high water mark 0), so memory stays at one chunk.
 */
export function watchedBody(body: ReadableStream<Uint8Array>, dog: Watchdog, idleMs: number, endMs = idleMs): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  return new ReadableStream<Uint8Array>(
    {
      async pull(c) {
        dog.bodyPulled = true;
        dog.arm(idleMs, `the request body stalled for ${idleMs} ms`);
        const r = await reader.read();
        if (r.done) {
          dog.arm(endMs, `no response within ${endMs} ms of the request body's end`);
          return c.close();
        }
        c.enqueue(r.value);
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}
