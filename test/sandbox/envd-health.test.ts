/**
 * Waiting for envd's GET /health (src/sandbox/envd-health.ts) against a real HTTP server on
 * loopback: answers after failed polls, a VM that exits while a request hangs or between polls
 * (seen at once: the poll period and the request bound here are longer than the test's timeout),
 * and a start abandoned by its signal. Counts of requests, never times.
 */
import { afterEach, expect, test } from "bun:test";
import { waitEnvdHealthy } from "../../src/sandbox/envd-health.ts";
import { waitEvent } from "../helpers/wait.ts";

const servers: { stop(force: boolean): void }[] = [];
afterEach(() => {
  for (const s of servers.splice(0)) s.stop(true);
});

/** An envd stand-in: `answer(n)` for the n-th GET /health (1-based), undefined = never answer. */
function envd(answer: (n: number) => number | undefined) {
  let hits = 0;
  let hit: () => void = () => {};
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    idleTimeout: 0,
    fetch(req) {
      if (new URL(req.url).pathname !== "/health") return new Response("no", { status: 404 });
      const status = answer(++hits);
      hit();
      if (status === undefined) return new Promise<Response>(() => {}); // hangs
      return new Response(status === 204 ? null : "busy", { status });
    },
  });
  servers.push(server);
  return {
    base: `http://127.0.0.1:${server.port}`,
    get hits() {
      return hits;
    },
    /** Resolves once `n` requests arrived. */
    reached(n: number): Promise<void> {
      return new Promise((r) => {
        const check = () => hits >= n && r();
        hit = check;
        check();
      });
    },
  };
}

test("answers after two failed polls: resolves on the third request", async () => {
  const e = envd((n) => (n < 3 ? 503 : 204));
  await waitEnvdHealthy(e.base, 5, new AbortController().signal);
  expect(e.hits).toBe(3);
});

test("a VM that exits while /health hangs ends the wait at once, with the request in flight aborted", async () => {
  const e = envd(() => undefined);
  let exit!: () => void;
  const exited = new Promise<void>((r) => (exit = r));
  // a poll period of 10 s: one request may take 100 s, far past this test's timeout
  const wait = waitEnvdHealthy(e.base, 10_000, new AbortController().signal, exited);
  await waitEvent("the first GET /health", e.reached(1));
  exit();
  await expect(wait).rejects.toMatchObject({ code: "orchestrator.envd_unready", message: "the sandbox VM exited before envd answered (no answer yet)" });
  expect(e.hits).toBe(1);
});

test("a VM that exits after a failed poll ends the wait at once (the next poll would be 10 min later)", async () => {
  const e = envd(() => 503);
  let exit!: () => void;
  const exited = new Promise<void>((r) => (exit = r));
  const wait = waitEnvdHealthy(e.base, 600_000, new AbortController().signal, exited);
  await waitEvent("the first GET /health", e.reached(1));
  exit();
  // the 503 may or may not have reached the wait before the exit did: the message names it when it had
  const err = await wait.catch((x) => x);
  expect(err).toMatchObject({ code: "orchestrator.envd_unready" });
  expect(err.message).toMatch(/^the sandbox VM exited before envd answered \((HTTP 503|no answer yet)\)$/);
  expect(e.hits).toBe(1);
});

test("an abandoned start (its signal aborted) ends the wait as not ready in time; an aborted signal sends nothing", async () => {
  const e = envd(() => 503);
  const start = new AbortController();
  const wait = waitEnvdHealthy(e.base, 600_000, start.signal);
  await waitEvent("the first GET /health", e.reached(1));
  start.abort();
  const err = await wait.catch((x) => x);
  expect(err).toMatchObject({ code: "orchestrator.envd_unready" });
  expect(err.message).toMatch(/^envd at http:\/\/127\.0\.0\.1:\d+ not ready in time \((HTTP 503|no answer yet)\)$/);
  await expect(waitEnvdHealthy(e.base, 5, start.signal)).rejects.toMatchObject({ code: "orchestrator.envd_unready" });
  expect(e.hits).toBe(1);
});

test("no envd listening: connection errors are retried until the VM exits", async () => {
  const e = envd(() => 204);
  const base = e.base;
  servers.splice(0).forEach((s) => s.stop(true)); // nothing listens there now
  let exit!: () => void;
  const exited = new Promise<void>((r) => (exit = r));
  const wait = waitEnvdHealthy(base, 1, new AbortController().signal, exited);
  exit();
  const err = await wait.catch((x) => x);
  expect(err).toMatchObject({ code: "orchestrator.envd_unready" });
  expect(err.message.startsWith("the sandbox VM exited before envd answered (")).toBe(true);
});
