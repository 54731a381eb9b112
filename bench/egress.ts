#!/usr/bin/env bun
/**
 * Egress interception benchmark: the added latency of an HTTPS request from a guest whose host
 * has a rule (TLS terminated by the node's interceptor with a leaf of the node CA, the request's
 * head rewritten with a secret's value, TLS to the upstream verified) against the same request
 * from a guest without rules (straight out through the slot), in the same run, same upstream.
 * Real parts: `agentenv server` in a namespace, QEMU guests (TCG here), curl in the guest, an HTTPS
 * upstream in a namespace behind a veth (test/e2e/egress-world.ts). Rounds alternate between the
 * two guests; each times N requests on new connections (a curl each) and N over one kept-alive
 * connection. Prints the medians over rounds of the mean ms per request and the ratios
 * (intercepted / direct), and the added ms per request.
 * Needs root, the built kernel and base template (scripts/test.sh pre-step: it also re-commits the
 * base template with this tree's envd, which installs the node CA).
 *   bun bench/egress.ts [--runs 10] [--rounds 5]
 */
import { EgressWorld } from "../test/e2e/egress-world.ts";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const RUNS = arg("--runs", 10);
const ROUNDS = arg("--rounds", 5);
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
};

const ew = new EgressWorld();
try {
  // a loaded host stretches TCG boots: creates may take minutes
  await ew.start({ AENV_LOG_LEVEL: "warn", AENV__orchestrator__create_timeout_ms: "600000" });
  const r = await ew.world.client<{ intercepted: { fresh: number[]; reused: number[] }; direct: { fresh: number[]; reused: number[] } }>("egress-bench.ts", [String(RUNS), String(ROUNDS), ew.caFile], 3_600_000);
  const ms = (x: number) => Math.round(x * 10) / 10;
  const row = (what: "fresh" | "reused") => {
    const a = median(r.intercepted[what]);
    const b = median(r.direct[what]);
    return { intercepted_ms: ms(a), direct_ms: ms(b), added_ms: ms(a - b), ratio: Math.round((a / b) * 100) / 100 };
  };
  const added = ew.seen().filter((s) => s.path.startsWith("/f") || s.path.startsWith("/r"));
  console.log(JSON.stringify({ runs: RUNS, rounds: ROUNDS, new_connection: row("fresh"), kept_alive: row("reused"), upstream_requests: added.length, with_header: added.filter((s) => s.authorization !== null).length }));
} finally {
  await ew.dispose();
}
