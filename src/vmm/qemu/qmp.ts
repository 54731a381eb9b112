/**
 * QMP client: newline-delimited JSON over QEMU's Unix control socket (the driver's listening
 * socket passed to QEMU: `-chardev socket,fd=3,server=on,wait=off -mon chardev=qmp,mode=control`).
 * Protocol (QEMU docs/interop/qmp-spec): the server greets with {"QMP":{...}}, the client sends
 * {"execute":"qmp_capabilities"}, then each {"execute":cmd,"arguments":..,"id":n} gets exactly one
 * {"return":..,"id":n} or {"error":{"class","desc"},"id":n}; {"event":..} lines may come anytime.
 */
import { Type as T } from "@sinclair/typebox";
import { connect, type Socket } from "node:net";
import { describeProblem, jsonSchema } from "../../util/json-check.ts";
import { VmmError } from "../errors.ts";
import { retryUntil } from "../../util/retry.ts";
import { asError, errorMessage } from "../../util/error.ts";

/** One asynchronous QMP event, e.g. `{ event: "STOP", data: {} }`. */
export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
  timestamp?: { seconds: number; microseconds: number };
}

interface EventWaiter {
  match: (e: QmpEvent) => boolean;
  resolve: (e: QmpEvent) => void;
  reject: (e: Error) => void;
  timer: ReturnType<typeof setTimeout>;
}

/** Events kept for `events` and for waits armed with an earlier mark. */
const EVENTS_KEPT = 256;

/** Longest QMP line read, bytes (QEMU's answers to the commands the driver sends are a few KiB). */
export const MAX_QMP_LINE = 16 << 20;

/** The QMP messages the client reads; any other JSON object is left alone (a later QEMU's). */
const QMP = {
  event: jsonSchema(T.Object({ event: T.String(), data: T.Optional(T.Record(T.String(), T.Unknown())), timestamp: T.Optional(T.Object({ seconds: T.Number(), microseconds: T.Number() })) })),
  reply: jsonSchema(T.Object({ id: T.Integer(), return: T.Optional(T.Unknown()), error: T.Optional(T.Object({ class: T.String(), desc: T.String() })) })),
};

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  timer: ReturnType<typeof setTimeout>;
  cmd: string;
}

/** A connected QMP session (capabilities negotiated). Close it with `close()`. */
export class QmpClient {
  /** The most recent events (at most EVENTS_KEPT), oldest first. */
  readonly events: QmpEvent[] = [];
  /** How many events arrived in total; `events[i]` is event number `received - events.length + i`. */
  private received = 0;
  private readonly waiters = new Set<EventWaiter>();
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  /** The line being received: its pieces (joined once it ends) and their length. */
  private partial: string[] = [];
  private partialLen = 0;
  private closed = false;

  private constructor(
    private readonly sock: Socket,
    readonly path: string,
    private readonly timeoutMs: number,
  ) {
    sock.on("data", (d) => this.onData(d.toString()));
    sock.on("close", () => this.failAll(new VmmError("vmm.qmp_closed", `QMP socket ${path} closed`, { path })));
    sock.on("error", () => {});
  }

  /**
   * Connect to `path`, retrying until `timeoutMs`, read the greeting and negotiate capabilities.
   * The driver's socket listens before QEMU starts (its first connect waits in the backlog until
   * QEMU accepts); a socket QEMU binds itself appears shortly after it starts.
   * @param isAlive polled between retries; when it returns false, connecting stops early.
   * @throws VmmError `vmm.qmp_connect` on timeout or when the greeting is not QMP.
   */
  static async connect(path: string, timeoutMs: number, isAlive: () => boolean = () => true): Promise<QmpClient> {
    if (!isAlive()) throw new VmmError("vmm.qmp_connect", `cannot connect to QMP socket ${path}: process exited`, { path, timeoutMs });
    try {
      return await retryUntil(
        async (leftMs) => {
          const sock = await new Promise<Socket>((resolve, reject) => {
            const s = connect(path);
            s.once("connect", () => resolve(s));
            s.once("error", reject);
          });
          const greeting = await readLine(sock, Math.max(1, leftMs));
          if (!("QMP" in greeting)) {
            sock.destroy();
            throw new VmmError("vmm.qmp_connect", `unexpected QMP greeting on ${path}`, { path, greeting });
          }
          const c = new QmpClient(sock, path, timeoutMs);
          await c.execute("qmp_capabilities");
          return c;
        },
        { timeoutMs, intervalMs: 20, retryable: (e) => !(e instanceof VmmError), alive: isAlive },
      );
    } catch (e) {
      if (e instanceof VmmError) throw e;
      throw new VmmError("vmm.qmp_connect", `cannot connect to QMP socket ${path}: ${errorMessage(e)}`, { path, timeoutMs });
    }
  }

  /**
   * Run one command. Resolves with its `return` value.
   * @throws VmmError `vmm.qmp_error` (QEMU's error class and desc in details), `vmm.qmp_timeout`, `vmm.qmp_closed`.
   */
  execute<T = unknown>(cmd: string, args?: Record<string, unknown>, timeoutMs = this.timeoutMs): Promise<T> {
    if (this.closed) return Promise.reject(new VmmError("vmm.qmp_closed", `QMP socket ${this.path} closed`, { path: this.path, cmd }));
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new VmmError("vmm.qmp_timeout", `QMP ${cmd} got no reply in ${timeoutMs} ms`, { path: this.path, cmd, timeoutMs }));
      }, timeoutMs);
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, timer, cmd });
      this.sock.write(JSON.stringify(args ? { execute: cmd, arguments: args, id } : { execute: cmd, id }) + "\n");
    });
  }

  /** A mark for `waitEvent`: events that arrive after this call count, earlier ones do not. */
  eventMark(): number {
    return this.received;
  }

  /**
   * Wait for the first event after `since` (a mark from `eventMark()`, taken before the command
   * that causes the event, so an event arriving before this call is not missed) for which
   * `match` is true.
   * @throws VmmError `vmm.qmp_timeout` after `timeoutMs`, `vmm.qmp_closed` when the socket closes.
   */
  waitEvent(match: (e: QmpEvent) => boolean, timeoutMs: number, since = this.received): Promise<QmpEvent> {
    const first = this.received - this.events.length;
    for (let i = Math.max(0, since - first); i < this.events.length; i++) {
      if (match(this.events[i]!)) return Promise.resolve(this.events[i]!);
    }
    if (this.closed) return Promise.reject(new VmmError("vmm.qmp_closed", `QMP socket ${this.path} closed`, { path: this.path }));
    return new Promise<QmpEvent>((resolve, reject) => {
      const w: EventWaiter = {
        match,
        resolve,
        reject,
        timer: setTimeout(() => {
          this.waiters.delete(w);
          reject(new VmmError("vmm.qmp_timeout", `no matching QMP event in ${timeoutMs} ms`, { path: this.path, timeoutMs }));
        }, timeoutMs),
      };
      this.waiters.add(w);
    });
  }

  /** Close the socket; pending commands fail with `vmm.qmp_closed`. */
  close(): void {
    this.sock.destroy();
    this.failAll(new VmmError("vmm.qmp_closed", `QMP socket ${this.path} closed`, { path: this.path }));
  }

  private failAll(e: Error): void {
    this.closed = true;
    for (const w of this.waiters) {
      clearTimeout(w.timer);
      w.reject(e);
    }
    this.waiters.clear();
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      this.pending.delete(id);
      p.reject(e);
    }
  }

  /** QEMU sent what QMP never is: the connection can no longer be trusted, everything waiting fails. */
  private bad(reason: string): void {
    this.sock.destroy();
    this.failAll(new VmmError("vmm.qmp_bad_message", `QMP socket ${this.path}: ${reason}`, { path: this.path, reason }));
  }

  private onData(s: string): void {
    let from = 0;
    for (let nl = s.indexOf("\n"); nl >= 0 && !this.closed; nl = s.indexOf("\n", from)) {
      const piece = s.slice(from, nl);
      from = nl + 1;
      if (this.partialLen + piece.length > MAX_QMP_LINE) return this.bad(`a line over ${MAX_QMP_LINE} bytes`);
      const line = (this.partial.length ? this.partial.join("") + piece : piece).trim();
      this.partial = [];
      this.partialLen = 0;
      this.onLine(line);
    }
    if (this.closed || from === s.length) return;
    this.partialLen += s.length - from;
    if (this.partialLen > MAX_QMP_LINE) return this.bad(`a line over ${MAX_QMP_LINE} bytes`);
    this.partial.push(s.slice(from));
  }

  private onLine(line: string): void {
    if (!line) return;
    let msg: unknown;
    try {
      msg = JSON.parse(line);
    } catch {
      return this.bad("a line that is not JSON");
    }
    if (typeof msg !== "object" || msg === null || Array.isArray(msg)) return this.bad("a line that is not a JSON object");
    if ("event" in msg) {
      const r = QMP.event.check(msg);
      if (!r.ok) return this.bad(`an event ${describeProblem(r.problem)}`);
      const ev: QmpEvent = r.value;
      this.events.push(ev);
      this.received++;
      if (this.events.length > EVENTS_KEPT) this.events.shift();
      for (const w of this.waiters) {
        if (!w.match(ev)) continue;
        this.waiters.delete(w);
        clearTimeout(w.timer);
        w.resolve(ev);
      }
      return;
    }
    if (!("id" in msg)) return; // no answer to us (a later QEMU's message)
    const r = QMP.reply.check(msg);
    if (!r.ok) return this.bad(`an answer ${describeProblem(r.problem)}`);
    const p = this.pending.get(r.value.id);
    if (!p) return;
    this.pending.delete(r.value.id);
    clearTimeout(p.timer);
    const err = r.value.error;
    if (err) p.reject(new VmmError("vmm.qmp_error", `QMP ${p.cmd}: ${err.class}: ${err.desc}`, { path: this.path, cmd: p.cmd, error: err }));
    else p.resolve(r.value.return);
  }
}

async function readLine(sock: Socket, timeoutMs: number): Promise<Record<string, unknown>> {
  return await new Promise((resolve, reject) => {
    let buf = "";
    const timer = setTimeout(() => done(new Error("no QMP greeting")), timeoutMs);
    const onData = (d: Buffer) => {
      buf += d.toString();
      const nl = buf.indexOf("\n");
      if (nl < 0) {
        if (buf.length > MAX_QMP_LINE) done(new Error(`a QMP greeting over ${MAX_QMP_LINE} bytes`));
        return;
      }
      try {
        done(null, JSON.parse(buf.slice(0, nl)));
      } catch (e) {
        done(asError(e));
      }
    };
    const onClose = () => done(new Error("closed before greeting"));
    function done(e: Error | null, v?: Record<string, unknown>) {
      clearTimeout(timer);
      sock.off("data", onData);
      sock.off("close", onClose);
      if (e) {
        sock.destroy();
        reject(e);
      } else {
        // anything after the greeting line belongs to the client proper; QEMU sends nothing more unprompted
        resolve(v!);
      }
    }
    sock.on("data", onData);
    sock.on("close", onClose);
  });
}
