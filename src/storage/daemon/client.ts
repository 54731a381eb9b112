/**
 * Node side of the daemon protocol (./protocol.ts): one Unix-socket connection, requests tagged
 * with a `seq` so several can be in flight, each answered or failed within a timeout; events
 * (`device_lost`) go to `onLost`.
 */
import type { Socket } from "bun";
import { DiskError, isDiskErrorCode } from "../errors.ts";
import { encodeFrame, FrameReader, parseResponse, type LostInfo, type ReadResponse, type Request, type Response } from "./protocol.ts";
import { errorMessage } from "../../util/error.ts";

interface Pending {
  resolve: (r: ReadResponse) => void;
  reject: (e: Error) => void;
  timer: Timer;
  kind: Request["kind"];
}

/** Requests without their `seq` (the client numbers them). */
export type Req = Request extends infer R ? (R extends { seq?: number } ? Omit<R, "seq"> : never) : never;

/** The response kind each request kind gets on success. */
const ANSWER_KIND = {
  get_features: "features", create_runtime_device: "runtime_device_created", delete: "deleted", restack_snapshot: "restack_snapshot_created",
  acquire: "device_acquired", release: "released", update_size: "size_updated", hold: "ok", list: "devices", stats: "device_stats", shutdown: "ok",
} as const satisfies Record<Request["kind"], Response["kind"]>;

/** The success response of a `K` request. */
export type Answer<K extends Request["kind"]> = Extract<Response, { kind: (typeof ANSWER_KIND)[K] }>;

/** A connection to a disk daemon. */
export class DaemonClient {
  #sock: Socket<undefined>;
  #reader: FrameReader;
  #pending = new Map<number, Pending>();
  #seq = 1;
  #closed = false;
  #out: Uint8Array[] = [];
  /** Resolves when the connection is gone (closed here or by the daemon). */
  readonly closed: Promise<void>;
  /** Called for each `device_lost` event the daemon sends. */
  onLost: ((l: LostInfo) => void) | null = null;
  #resolveClosed!: () => void;

  private constructor(sock: Socket<undefined>, reader: FrameReader, readonly timeoutMs: number) {
    this.#sock = sock;
    this.#reader = reader;
    this.closed = new Promise((r) => (this.#resolveClosed = r));
  }

  /**
   * Connect to the daemon listening on `socket`.
   * @param opts.timeoutMs longest wait for each answer
   * @throws DiskError `disk.daemon_unavailable` when nothing listens there
   */
  static async connect(socket: string, opts: { timeoutMs: number; maxFrameBytes: number }): Promise<DaemonClient> {
    const reader = new FrameReader(opts.maxFrameBytes);
    let client: DaemonClient | undefined;
    try {
      const sock = await Bun.connect<undefined>({
        unix: socket,
        socket: {
          data(_s, chunk) {
            if (client) client.#onData(chunk);
          },
          drain() {
            if (client) client.#flush();
          },
          close() {
            if (client) client.#onClose();
          },
          error() {
            if (client) client.#onClose();
          },
        },
      });
      client = new DaemonClient(sock, reader, opts.timeoutMs);
      return client;
    } catch (e) {
      throw new DiskError("disk.daemon_unavailable", `cannot connect to the disk daemon at ${socket}: ${errorMessage(e)}`, { socket });
    }
  }

  /**
   * Send one request and wait for its answer.
   * @returns the success response of that request kind
   * @throws DiskError with the daemon's code for `error`/`invalid_request` answers;
   *   `disk.daemon_unavailable` when the connection drops first; `disk.timeout`
   */
  request<K extends Request["kind"]>(req: Extract<Req, { kind: K }>): Promise<Answer<K>> {
    if (this.#closed) return Promise.reject(new DiskError("disk.daemon_unavailable", "the disk daemon connection is closed", { kind: req.kind }));
    const seq = this.#seq++;
    return new Promise<Answer<K>>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending.delete(seq);
        reject(new DiskError("disk.timeout", `the disk daemon did not answer ${req.kind} within ${this.timeoutMs} ms`, { kind: req.kind, timeoutMs: this.timeoutMs }));
      }, this.timeoutMs);
      this.#pending.set(seq, { resolve: resolve as (r: ReadResponse) => void, reject, timer, kind: req.kind });
      this.#out.push(encodeFrame({ ...req, seq }));
      this.#flush();
    });
  }

  /** Close the connection; pending requests fail with `disk.daemon_unavailable`. */
  close(): void {
    if (this.#closed) return;
    this.#sock.end();
    this.#onClose();
  }

  #flush(): void {
    while (this.#out.length > 0) {
      const chunk = this.#out[0]!;
      const n = this.#sock.write(chunk);
      if (n < chunk.byteLength) {
        this.#out[0] = chunk.subarray(Math.max(0, n));
        return;
      }
      this.#out.shift();
    }
  }

  #onData(chunk: Uint8Array): void {
    for (const f of this.#reader.push(chunk)) {
      if (!f.ok) {
        // the daemon never sends a bad frame; if it does, nothing on this connection can be trusted
        this.close();
        return;
      }
      const seq = typeof f.value.seq === "number" ? f.value.seq : -1;
      const p = this.#pending.get(seq);
      const parsed = parseResponse(f.value);
      if (!parsed.ok) {
        // an answer of a shape this node does not know (another version, a bug): its request fails naming the field
        if (!p) continue;
        this.#settle(seq, p);
        p.reject(new DiskError("disk.malformed_frame", `the disk daemon answered ${p.kind} with a bad ${parsed.field || "message"}: ${parsed.why}`, { kind: p.kind, field: parsed.field }));
        continue;
      }
      const r = parsed.value;
      if (r.kind === "device_lost") {
        this.onLost?.({ dev_id: r.dev_id, engine: r.engine, reason: r.reason, at: r.at });
        continue;
      }
      if (!p) continue;
      this.#settle(seq, p);
      if (r.kind === "error" || r.kind === "invalid_request") p.reject(answeredError(r, p.kind));
      else if (r.kind !== ANSWER_KIND[p.kind]) p.reject(new DiskError("disk.malformed_frame", `the disk daemon answered ${p.kind} with ${r.kind}`, { kind: p.kind, field: "kind" }));
      else p.resolve(r);
    }
  }

  #settle(seq: number, p: Pending): void {
    this.#pending.delete(seq);
    clearTimeout(p.timer);
  }

  #onClose(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const [seq, p] of this.#pending) {
      clearTimeout(p.timer);
      this.#pending.delete(seq);
      p.reject(new DiskError("disk.daemon_unavailable", `the disk daemon connection closed before it answered ${p.kind}`, { kind: p.kind }));
    }
    this.#resolveClosed();
  }
}

/**
 * The DiskError of an `error` / `invalid_request` answer to a `kind` request. The daemon sends
 * only DiskError codes (./errors.ts `toDiskError`); any other code (another version, a bug) is
 * not passed on as if it were one: it becomes `disk.internal` with the code in `details.cause`.
 */
function answeredError(r: { code?: unknown; message?: unknown; details?: unknown }, kind: string): DiskError {
  const details = { ...(typeof r.details === "object" && r.details !== null ? (r.details as Record<string, unknown>) : {}), kind };
  const message = typeof r.message === "string" ? r.message : "";
  if (isDiskErrorCode(r.code)) return new DiskError(r.code, message, details);
  return new DiskError("disk.internal", `the disk daemon answered ${kind} with the unknown code ${JSON.stringify(r.code)}: ${message}`, { ...details, cause: r.code ?? null });
}
