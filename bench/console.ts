/**
 * The console's page weight and first render time with a list of N sandboxes (default 200).
 *
 * The node is real (SQLite, orchestrator, API, proxy, the console as the binary serves it); its
 * sandboxes are loopback guests (test/helpers/loopback-runtime.ts: every create goes through the
 * orchestrator and stores a real record, but no VM boots: 200 QEMU guests do not fit a 2-core
 * host). The browser is Debian's Chromium, headless, driven by playwright-core; each run is a
 * fresh browser context (empty cache), already logged in (the key put in sessionStorage before
 * the page loads, as a login leaves it).
 *
 * Measured per run: bytes over the wire until the list shows all N rows (HTML, script, style
 * sheet, API answers: the Resource Timing transferSize of every request, headers included), split
 * into the console's own files and API data; and the time from navigation start to the N-th row
 * in the DOM (in-page `performance.now()`). Baseline in the same run: the same page with no
 * sandboxes (what the list itself costs) and a bare `fetch` of the N records from the page
 * (what the API alone takes).
 *
 *   bun bench/console.ts [--sandboxes 200] [--runs 5]
 */
import "./quiet-logs.ts";
import { parseArgs } from "node:util";
import { createLoopback, startNodeNoVm, type TestNode } from "../test/api/helpers.ts";
import { launchChromium, type TestBrowser } from "../test/console/browser.ts";

// page-side code runs in the browser: its globals, as this (DOM-less) project sees them
declare const document: { querySelectorAll(s: string): { length: number }; querySelector(s: string): unknown };
declare const requestAnimationFrame: (f: () => void) => void;

const { values } = parseArgs({ options: { sandboxes: { type: "string", default: "200" }, runs: { type: "string", default: "5" } } });
const N = Number(values.sandboxes);
const RUNS = Number(values.runs);

interface Run {
  ms: number;
  assetBytes: number;
  apiBytes: number;
  requests: number;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const kib = (n: number) => `${(n / 1024).toFixed(1)} KiB`;

/** One cold load of the sandboxes page until it shows `rows` rows. */
async function load(chrome: TestBrowser, node: TestNode, rows: number): Promise<Run> {
  const page = await chrome.page();
  await page.addInitScript((key) => sessionStorage.setItem("agentenv.apiKey", key), node.apiKey);
  await page.goto(`${node.url}/console/#/sandboxes`);
  const ms = await page.evaluate(async (want) => {
    const count = () => document.querySelectorAll("#sandboxes tbody tr").length;
    const empty = () => want === 0 && document.querySelector("#sandboxes") !== null && document.querySelector("section .muted") !== null;
    while (!(want > 0 ? count() >= want : empty())) await new Promise<void>((r) => requestAnimationFrame(() => r()));
    return performance.now();
  }, rows);
  const entries = await page.evaluate(`[...performance.getEntriesByType("navigation"), ...performance.getEntriesByType("resource")].map((e) => ({ name: e.name, bytes: e.transferSize }))`) as { name: string; bytes: number }[];
  await page.context().close();
  const isAsset = (u: string) => new URL(u).pathname.startsWith("/console");
  return {
    ms,
    assetBytes: entries.filter((e) => isAsset(e.name)).reduce((a, e) => a + e.bytes, 0),
    apiBytes: entries.filter((e) => !isAsset(e.name)).reduce((a, e) => a + e.bytes, 0),
    requests: entries.length,
  };
}

/** The N records fetched by the page itself, no rendering (the API's share). */
async function bareFetch(chrome: TestBrowser, node: TestNode): Promise<number> {
  const page = await chrome.page();
  await page.goto(`${node.url}/console/assets/none`).catch(() => {});
  const ms = await page.evaluate(async (key) => {
    const t0 = performance.now();
    let token: string | null = null;
    do {
      const q: URLSearchParams = new URLSearchParams({ state: "running,paused", limit: "100", ...(token ? { nextToken: token } : {}) });
      const r: Response = await fetch(`/v2/sandboxes?${q}`, { headers: { "x-api-key": key } });
      await r.json();
      token = r.headers.get("x-next-token");
    } while (token);
    return performance.now() - t0;
  }, node.apiKey);
  await page.context().close();
  return ms;
}

function report(label: string, runs: Run[]): void {
  const ms = runs.map((r) => r.ms);
  console.log(
    `${label}: first render ${median(ms).toFixed(0)} ms (median of ${runs.length}; ${Math.min(...ms).toFixed(0)}-${Math.max(...ms).toFixed(0)}), ` +
      `weight ${kib(median(runs.map((r) => r.assetBytes + r.apiBytes)))} = console files ${kib(median(runs.map((r) => r.assetBytes)))} + API ${kib(median(runs.map((r) => r.apiBytes)))}, ${median(runs.map((r) => r.requests))} requests`,
  );
}

const node = await startNodeNoVm({ AENV__orchestrator__max_sandboxes: String(Math.max(16, N)) }, undefined, {});
const chrome = await launchChromium();
try {
  await load(chrome, node, 0); // warm the node's bundle and the browser binary's caches
  const empty: Run[] = [];
  for (let i = 0; i < RUNS; i++) empty.push(await load(chrome, node, 0));
  const t0 = performance.now();
  for (let i = 0; i < N; i++) await createLoopback(node, { metadata: { bench: "console", n: String(i) } });
  console.log(`${N} loopback sandboxes created through the orchestrator in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  const full: Run[] = [];
  const fetches: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    full.push(await load(chrome, node, N));
    fetches.push(await bareFetch(chrome, node));
  }
  report("no sandboxes (baseline)", empty);
  report(`${N} sandboxes`, full);
  const fm = median(fetches);
  console.log(`bare fetch of the ${N} records from the page: ${fm.toFixed(0)} ms (median); first render / bare fetch = ${(median(full.map((r) => r.ms)) / fm).toFixed(1)}x`);
  console.log(`first render with ${N} / with none = ${(median(full.map((r) => r.ms)) / median(empty.map((r) => r.ms))).toFixed(2)}x`);
} finally {
  await chrome.dispose();
  await node.dispose();
}
