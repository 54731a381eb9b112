/**
 * The console on a cluster's gateway, all real: `agentenv cluster up` (scheduler, gateway, two
 * nodes with QEMU microVMs) in a private network namespace (test/e2e/cluster-world.ts), Debian's
 * Chromium started by the test inside it. The gateway serves the console and refuses a wrong
 * key; its nodes page lists both nodes with their load; a sandbox created through the gateway
 * (e2b SDK) shows up under the node that holds it; its terminal, bridged by that node and relayed
 * by the gateway, runs `echo $((6*7))`. Screenshots: test-artifacts/console/.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { ClusterWorld } from "../e2e/cluster-world.ts";
import { vmPrerequisites } from "../e2e/world.ts";
import { launchChromium, logIn, screenshot, terminalRows, type TestBrowser } from "./browser.ts";
import { waitFor } from "../helpers/wait.ts";

const missing = vmPrerequisites();
let world: ClusterWorld | undefined;
let chrome: TestBrowser | undefined;

beforeAll(async () => {
  if (missing) return;
  world = new ClusterWorld({
    nsPrefix: "accn",
    nodes: 2,
    gatewayPort: 18280,
    schedulerPort: 19290,
    nodePort: 18201,
    nodeRestartMs: 1000,
    env: { AENV__pool__low_watermark: "0", AENV__pool__high_watermark: "0", AENV__console__refresh_ms: "500" },
  });
  await world.up();
  chrome = await launchChromium(world.ns);
}, 300_000);
afterAll(async () => {
  await chrome?.dispose();
  await world?.dispose();
}, 180_000);

test("the gateway's console: a wrong key refused, both nodes listed, a sandbox under its node, its terminal through the gateway", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  const w = world!;
  const page = await chrome!.page();
  await page.goto(`${w.gateway}/console/`);
  await page.fill("#api-key", "e2b_1111111111111111111111111111111111111111");
  await page.click("form.login button[type=submit]");
  expect(await (await page.waitForSelector("[role=alert]")).textContent()).toContain("Key refused: Invalid API key");
  await logIn(page, w.gateway, w.key);
  expect(await page.textContent("header .role")).toBe("gateway");

  await page.goto(`${w.gateway}/console/#/nodes`);
  await page.waitForFunction(() => (globalThis as unknown as { document: { querySelectorAll(s: string): { length: number } } }).document.querySelectorAll("tr[data-node]").length === 2, undefined, { timeout: 60_000 });
  const ids = await page.$$eval("tr[data-node]", (rows) => rows.map((r) => r.getAttribute("data-node")));
  expect(ids).toEqual(["node-a", "node-b"]);
  for (const id of ids) expect(await page.textContent(`tr[data-node="${id}"]`)).toContain("ready");
  await screenshot(page, "cluster-nodes");

  const { id } = await w.client<{ id: string }>("console-sdk.ts", ["create", JSON.stringify({ suite: "console-cluster" })]);
  await page.goto(`${w.gateway}/console/#/sandboxes`);
  const row = await page.waitForSelector(`tr[data-sandbox="${id}"]`, { timeout: 60_000 });
  const holder = /@(node-[ab])/.exec((await row.textContent()) ?? "")?.[1];
  expect(["node-a", "node-b"]).toContain(holder!);
  await screenshot(page, "cluster-sandboxes");
  await page.goto(`${w.gateway}/console/#/nodes`);
  await page.waitForSelector(`tr[data-node="${holder}"] a:text("${id}")`);

  await page.goto(`${w.gateway}/console/#/sandboxes/${id}/terminal`);
  await page.waitForSelector("#terminal-status:text-matches('connected \\\\(pid \\\\d+\\\\)')", { timeout: 120_000 });
  await page.click("#terminal");
  await page.keyboard.type("echo $((6*7))\n");
  await waitFor("42 on the terminal", async () => (await terminalRows(page)).includes("42"), { timeoutMs: 60_000, maxIntervalMs: 100 });
  await screenshot(page, "cluster-terminal");
  await w.client("console-sdk.ts", ["kill", id]);
}, 900_000);
