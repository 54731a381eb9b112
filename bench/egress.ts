#!/usr/bin/env bun
/**
 * Egress interception benchmark: the added latency of an HTTPS request from a guest whose host
 * has a rule (TLS terminated by the node's interceptor with a leaf of the node CA, the request's
 * head rewritten with a secret's value, TLS to the upstream verified) against the same request
 * from a guest without rules (straight out through the slot), in the same run, same upstream.
 * Real parts: `agentenv server` in a namespace, QEMU guests (TCG here), curl in the guest, an HTTPS
 * upstream in a namespace behind a veth (test/e2e/egress-world.ts). Prints the medians (ms) of
 * new-connection and kept-alive requests and their ratios (intercepted / direct).
 * Needs root, the built kernel and base template (scripts/test.sh pre-step).
 *   bun bench/egress.ts [--runs 10]
 */
import { EgressWorld } from "../test/e2e/egress-world.ts";

const i = process.argv.indexOf("--runs");
const RUNS = i > 0 ? Number(process.argv[i + 1]) : 10;
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
};

const ew = new EgressWorld();
try {
  // a loaded host stretches TCG boots: creates may take minutes
  await ew.start({ AENV_LOG_LEVEL: "warn", AENV__orchestrator__create_timeout_ms: "600000" });
  const r = await ew.world.client<{ intercepted: { fresh: number[]; reused: number[] }; direct: { fresh: number[]; reused: number[] } }>("egress-bench.ts", [String(RUNS), ew.caFile], 1_200_000);
  const ms = (s: number) => Math.round(s * 10000) / 10;
  const row = (what: "fresh" | "reused") => {
    const a = median(r.intercepted[what]);
    const b = median(r.direct[what]);
    return { intercepted_ms: ms(a), direct_ms: ms(b), ratio: Math.round((a / b) * 100) / 100 };
  };
  const added = ew.seen().filter((s) => s.path.startsWith("/f") || s.path.startsWith("/r"));
  console.log(JSON.stringify({ runs: RUNS, new_connection: row("fresh"), kept_alive: row("reused"), upstream_requests: added.length, with_header: added.filter((s) => s.authorization !== null).length }));
} finally {
  await ew.dispose();
}
