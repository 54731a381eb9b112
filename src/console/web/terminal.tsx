/**
 * A terminal in the sandbox: xterm.js joined to a PTY through the node's terminal bridge
 * (../protocol.ts): a ticket from the authenticated `POST /sandboxes/{id}/terminal`, then a
 * WebSocket whose first frame carries it. Resizes follow the page; Ctrl+Shift+C copies the
 * selection, Ctrl+Shift+V (or the browser's paste) pastes. xterm.js is loaded when a terminal
 * opens (the other pages do not fetch it).
 */
import { useEffect, useRef, useState } from "preact/hooks";
import type { Terminal as XTerm } from "@xterm/xterm";
import { api } from "./api.ts";
import { CLOSE, parseServerMessage, terminalPath, type AuthMessage, type ResizeMessage, type TicketBody } from "../protocol.ts";
import { errorMessage } from "../../util/error.ts";

export function Terminal({ id }: { id: string }) {
  const box = useRef<HTMLDivElement>(null);
  const term = useRef<XTerm | null>(null);
  const [status, setStatus] = useState("connecting…");
  const [session, setSession] = useState(0);
  useEffect(() => {
    let closed = false;
    let cleanup = () => {};
    void Promise.all([import("@xterm/xterm"), import("@xterm/addon-fit")]).then(([{ Terminal: XTermClass }, { FitAddon }]) => {
      if (closed) return;
      cleanup = open(new XTermClass({ cursorBlink: true, fontSize: 13, fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace", scrollback: 5000 }), new FitAddon());
    });
    const open = (t: XTerm, fit: { fit(): void; activate(t: XTerm): void; dispose(): void }) => {
      t.loadAddon(fit);
      t.open(box.current!);
      fit.fit();
      term.current = t;
      const enc = new TextEncoder();
      let ws: WebSocket | null = null;
      t.attachCustomKeyEventHandler((e) => {
        if (e.type !== "keydown" || !e.ctrlKey || !e.shiftKey) return true;
        if (e.code === "KeyC") {
          void navigator.clipboard?.writeText(t.getSelection());
          return false;
        }
        if (e.code === "KeyV") {
          void navigator.clipboard?.readText().then((s) => t.paste(s));
          return false;
        }
        return true;
      });
      const send = (b: Uint8Array<ArrayBuffer>) => ws?.readyState === WebSocket.OPEN && ws.send(b);
      const dataSub = t.onData((d) => send(enc.encode(d)));
      const binSub = t.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
      const resizeSub = t.onResize(({ cols, rows }) => ws?.readyState === WebSocket.OPEN && ws.send(JSON.stringify({ type: "resize", cols, rows } satisfies ResizeMessage)));
      const ro = new ResizeObserver(() => fit.fit());
      ro.observe(box.current!);
      (async () => {
        let ticket: TicketBody;
        try {
          ticket = (await api<TicketBody>(terminalPath(id), { method: "POST" })).data;
        } catch (e) {
          setStatus(`refused: ${errorMessage(e)}`);
          return;
        }
        if (closed) return;
        const proto = location.protocol === "https:" ? "wss:" : "ws:";
        ws = new WebSocket(`${proto}//${location.host}${terminalPath(id)}`);
        ws.binaryType = "arraybuffer";
        ws.onopen = () => ws!.send(JSON.stringify({ type: "auth", ticket: ticket.ticket, cols: t.cols, rows: t.rows } satisfies AuthMessage));
        ws.onmessage = (ev) => {
          if (typeof ev.data !== "string") return t.write(new Uint8Array(ev.data as ArrayBuffer));
          const m = parseServerMessage(ev.data);
          if (m?.type === "ready") {
            setStatus(`connected (pid ${m.pid})`);
            t.focus();
          } else if (m?.type === "exit") setStatus(`exited with code ${m.exitCode}`);
        };
        ws.onclose = (ev) => {
          if (closed) return;
          setStatus((s) => (s.startsWith("exited") ? s : ev.code === CLOSE.normal ? "closed" : `closed (${ev.code}${ev.reason ? `: ${ev.reason}` : ""})`));
        };
      })();
      return () => {
        ro.disconnect();
        dataSub.dispose();
        binSub.dispose();
        resizeSub.dispose();
        ws?.close();
        t.dispose();
        term.current = null;
      };
    };
    return () => {
      closed = true;
      cleanup();
    };
  }, [id, session]);
  const copy = () => void navigator.clipboard?.writeText(term.current?.getSelection() ?? "");
  const paste = () => void navigator.clipboard?.readText().then((s) => term.current?.paste(s));
  return (
    <div>
      <div class="toolbar">
        <span id="terminal-status" class="muted">
          {status}
        </span>
        <button onClick={copy}>Copy selection</button>
        <button onClick={paste}>Paste</button>
        <button onClick={() => setSession((n) => n + 1)}>New session</button>
      </div>
      <div class="terminal" id="terminal" ref={box} />
    </div>
  );
}
