/**
 * gRPC channels to the scheduler. grpc-js defaults would hurt here: subchannels are shared by
 * every channel of the process (a fresh client inherits another's failure state) and the
 * reconnect backoff grows to 120 s (a gateway would stay cut off from a restarted scheduler for
 * minutes). Each channel gets its own subchannels and reconnects within a second.
 */
import { ClientError, createChannel, Status, type Channel } from "nice-grpc";

/** Reconnect backoff bounds of scheduler channels, ms. */
const INITIAL_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 1000;

/** Pause between tries of a call that found its channel down (the shortest reconnect backoff), ms. */
export const CHANNEL_RETRY_MS = INITIAL_BACKOFF_MS;

/**
 * Run a call until it gets an answer: a channel that saw the scheduler go away fails calls at
 * once with UNAVAILABLE until it has reconnected, so such a failure (when `channelDown` agrees)
 * is tried again after `retryMs`, until `signal` fires; then, or on any other failure, the last
 * error is thrown.
 */
export async function untilAnswered<T>(call: () => Promise<T>, signal: AbortSignal, retryMs: number, channelDown: (e: unknown) => boolean = () => true): Promise<T> {
  for (;;) {
    try {
      return await call();
    } catch (e) {
      if (!(e instanceof ClientError && e.code === Status.UNAVAILABLE && channelDown(e)) || signal.aborted) throw e;
      await Bun.sleep(retryMs);
      if (signal.aborted) throw e;
    }
  }
}

/** The grpc-js target of a scheduler address: `host:port` (an http:// or grpc:// prefix and trailing slashes dropped). */
export function grpcTarget(endpoint: string): string {
  return endpoint.replace(/^(?:http|grpc):\/\//, "").replace(/\/+$/, "");
}

/** A channel to `target` (host:port; an http:// or grpc:// prefix is dropped). */
export function schedulerChannel(target: string): Channel {
  return createChannel(grpcTarget(target), undefined, {
    "grpc.use_local_subchannel_pool": 1,
    "grpc.initial_reconnect_backoff_ms": INITIAL_BACKOFF_MS,
    "grpc.max_reconnect_backoff_ms": MAX_BACKOFF_MS,
  });
}
