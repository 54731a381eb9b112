/**
 * A WebSocket relay for Bun.serve: the client's socket (already upgraded) is joined to an
 * upstream WebSocket opened at `open`; frames pass both ways unchanged (text stays text, binary
 * binary), frames sent before the upstream is open are queued up to a bound, and each side's
 * close reaches the other (1005/1006, which may not be sent, become 1000). An upstream that
 * fails, or is not open within the connection's `connectTimeoutMs`, closes the client with 1011
 * and the connection's own reason (or the relay's). Used by the node's sandbox proxy and by the
 * cluster gateway.
 */
import type { ServerWebSocket, WebSocketHandler } from "bun";
import { logger } from "../observability/log.ts";

/** Bound on bytes buffered for an upstream that is still connecting. */
export const WS_QUEUE_MAX_BYTES = 8 * 1024 * 1024;
const log = logger("ws_relay");

/** Per-connection state of a relayed socket. */
export interface RelayData {
  upstreamUrl: string;
  /** Headers of the upstream handshake. */
  headers: Record<string, string>;
  up?: WebSocket;
  queue: (string | Uint8Array)[];
  queuedBytes: number;
  /** Called when the client side closes (e.g. untrack the connection). */
  onClose?: () => void;
  /** Bound on the upstream becoming open, ms (none when absent). */
  connectTimeoutMs?: number;
  /** Close reason (code 1011) when this connection's upstream fails; the relay's `unreachable` when absent. */
  unreachable?: string;
}

/** Fresh relay state for `server.upgrade(req, { data })`. */
export function relayData<T extends object>(upstreamUrl: string, headers: Record<string, string>, extra: T): RelayData & T {
  return { upstreamUrl, headers, queue: [], queuedBytes: 0, ...extra };
}

const closeCode = (c: number) => (c === 1005 || c === 1006 ? 1000 : c);

/** Longest close reason (RFC 6455 §5.5: a control frame payload is at most 125 bytes, 2 of them the code). */
const REASON_MAX_BYTES = 123;

/** `s` cut to fit a close frame. */
export function closeReason(s: string): string {
  const b = new TextEncoder().encode(s);
  if (b.length <= REASON_MAX_BYTES) return s;
  return new TextDecoder().decode(b.subarray(0, REASON_MAX_BYTES)).replace(/\uFFFD+$/, "");
}

/**
 * The `websocket` handlers of the relay.
 * @param o.onOpen called once the client socket is open; may return a function run at close.
 * @param o.unreachable close reason (code 1011) when the upstream fails.
 */
export function wsRelay<T extends RelayData>(o: { onOpen?: (ws: ServerWebSocket<T>) => (() => void) | void; unreachable: string }): WebSocketHandler<T> {
  return {
    open(ws) {
      const up = new WebSocket(ws.data.upstreamUrl, { headers: ws.data.headers } as unknown as string[]);
      up.binaryType = "arraybuffer";
      ws.data.up = up;
      const done = o.onOpen?.(ws);
      if (done) ws.data.onClose = done;
      const reason = closeReason(ws.data.unreachable ?? o.unreachable);
      let connectTimer: ReturnType<typeof setTimeout> | undefined;
      if (ws.data.connectTimeoutMs !== undefined) {
        const ms = ws.data.connectTimeoutMs;
        connectTimer = setTimeout(() => {
          if (up.readyState === WebSocket.OPEN) return;
          log.debug({ url: ws.data.upstreamUrl, ms }, "websocket upstream not open in time");
          ws.close(1011, closeReason(`${ws.data.unreachable ?? o.unreachable}: not open within ${ms} ms`));
          up.close();
        }, ms);
      }
      up.onopen = () => {
        clearTimeout(connectTimer);
        for (const m of ws.data.queue) up.send(m);
        ws.data.queue = [];
        ws.data.queuedBytes = 0;
      };
      up.onmessage = (e) => ws.send(typeof e.data === "string" ? e.data : new Uint8Array(e.data as ArrayBuffer));
      up.onclose = (e) => {
        clearTimeout(connectTimer);
        ws.close(closeCode(e.code), e.reason);
      };
      up.onerror = () => {
        clearTimeout(connectTimer);
        log.debug({ url: ws.data.upstreamUrl }, "websocket upstream error");
        ws.close(1011, reason);
      };
    },
    message(ws, m) {
      const up = ws.data.up!;
      const data = typeof m === "string" ? m : new Uint8Array(m);
      if (up.readyState === WebSocket.OPEN) return up.send(data);
      ws.data.queuedBytes += typeof data === "string" ? data.length : data.byteLength;
      if (ws.data.queuedBytes > WS_QUEUE_MAX_BYTES) return ws.close(1009, "too much data before the upstream answered");
      ws.data.queue.push(data);
    },
    close(ws, code, reason) {
      ws.data.onClose?.();
      const up = ws.data.up;
      if (up && (up.readyState === WebSocket.OPEN || up.readyState === WebSocket.CONNECTING)) up.close(closeCode(code), reason);
    },
  };
}
