/**
 * gRPC channels to the scheduler. grpc-js defaults would hurt here: subchannels are shared by
 * every channel of the process (a fresh client inherits another's failure state) and the
 * reconnect backoff grows to 120 s (a gateway would stay cut off from a restarted scheduler for
 * minutes). Each channel gets its own subchannels and reconnects within a second.
 */
import { createChannel, type Channel } from "nice-grpc";

/** Reconnect backoff bounds of scheduler channels, ms. */
const INITIAL_BACKOFF_MS = 100;
const MAX_BACKOFF_MS = 1000;

/** A channel to `target` (host:port; an http:// or grpc:// prefix is dropped). */
export function schedulerChannel(target: string): Channel {
  return createChannel(target.replace(/^(?:http|grpc):\/\//, "").replace(/\/+$/, ""), undefined, {
    "grpc.use_local_subchannel_pool": 1,
    "grpc.initial_reconnect_backoff_ms": INITIAL_BACKOFF_MS,
    "grpc.max_reconnect_backoff_ms": MAX_BACKOFF_MS,
  });
}
