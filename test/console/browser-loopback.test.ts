/**
 * The console in headless Chromium against a real node (SQLite, orchestrator, API, proxy) whose
 * sandboxes are loopback guests (test/helpers/loopback-runtime.ts: no VM, so these run in
 * seconds): the key prompt refuses a wrong key and keeps the right one per tab, never in a URL;
 * a sandbox created behind the page's back appears without a reload; the metadata filter; the
 * pause, resume, snapshot, fork and kill buttons change the orchestrator's records; the
 * snapshot tree, nodes and volumes pages show the API's data. The terminal, files and template
 * builds need a guest with envd: test/console/console-vm.test.ts.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Page } from "playwright-core";
import { createLoopback, startNodeNoVm, type TestNode } from "../api/helpers.ts";
import { launchChromium, logIn, screenshot, type TestBrowser } from "./browser.ts";
import { waitFor } from "../helpers/wait.ts";

let node: TestNode;
let chrome: TestBrowser;

beforeAll(async () => {
  node = await startNodeNoVm({ AENV__console__refresh_ms: "300" }, undefined, {});
  chrome = await launchChromium();
}, 90_000);
afterAll(async () => {
  await chrome?.dispose();
  await node?.dispose();
}, 60_000);

/** Wait until `fn` is true (at most `ms`). */
async function until(fn: () => boolean | Promise<boolean>, ms: number, what: string): Promise<void> {
  await waitFor(what, fn, { timeoutMs: ms });
}

test("the key prompt refuses a wrong key, keeps the right one for this tab only, and no key travels in a URL", async () => {
  const page = await chrome.page();
  const urls: string[] = [];
  page.on("request", (r) => urls.push(r.url()));
  await page.goto(`${node.url}/console/`);
  await page.fill("#api-key", "e2b_0000000000000000000000000000000000000000");
  await page.click("form.login button[type=submit]");
  const alert = await page.waitForSelector("[role=alert]");
  expect(await alert.textContent()).toContain("Key refused: Invalid API key");
  expect(await page.evaluate(() => sessionStorage.getItem("agentenv.apiKey"))).toBeNull();
  expect(await page.$("table#sandboxes")).toBeNull();
  await screenshot(page, "login-refused");

  await page.fill("#api-key", node.apiKey);
  await page.click("form.login button[type=submit]");
  await page.waitForSelector("table#sandboxes");
  expect(await page.evaluate(() => sessionStorage.getItem("agentenv.apiKey"))).toBe(node.apiKey);
  // another tab (its own session) asks again
  const other = await chrome.page();
  await other.goto(`${node.url}/console/`);
  await other.waitForSelector("#api-key");
  expect(await other.$("table#sandboxes")).toBeNull();
  expect(urls.length).toBeGreaterThan(3);
  expect(urls.filter((u) => u.includes(node.apiKey))).toEqual([]);
  // logging out forgets it
  await page.click("header button.link");
  await page.waitForSelector("#api-key");
  expect(await page.evaluate(() => sessionStorage.getItem("agentenv.apiKey"))).toBeNull();
}, 60_000);

async function loggedIn(): Promise<Page> {
  const page = await chrome.page();
  await logIn(page, node.url, node.apiKey);
  return page;
}

test("a created sandbox appears without a reload; the metadata filter narrows the list", async () => {
  const page = await loggedIn();
  await page.evaluate("window.mark = 42");
  const red = await createLoopback(node, { metadata: { team: "red", owner: "ops" } });
  const blue = await createLoopback(node, { metadata: { team: "blue" } });
  await page.waitForSelector(`tr[data-sandbox="${red.id}"]`);
  await page.waitForSelector(`tr[data-sandbox="${blue.id}"]`);
  expect(await page.evaluate("window.mark")).toBe(42);
  const row = await page.textContent(`tr[data-sandbox="${red.id}"]`);
  expect(row).toContain("running");
  expect(row).toContain("team=red, owner=ops");
  await screenshot(page, "sandboxes");

  await page.fill("input[aria-label='metadata filter']", "team=blue");
  await page.click("text=Filter");
  await page.waitForSelector(`tr[data-sandbox="${red.id}"]`, { state: "detached" });
  expect(await page.$$eval("#sandboxes tbody tr", (rows) => rows.map((r) => r.getAttribute("data-sandbox")))).toEqual([blue.id]);
  await page.fill("input[aria-label='metadata filter']", "team");
  await page.click("text=Filter");
  expect(await page.textContent("form.inline .error")).toContain('"team" is not key=value');
  await node.orch.kill(red.id);
  await node.orch.kill(blue.id);
}, 60_000);

test("pause, resume, snapshot, fork and kill from the buttons; the snapshot tree shows the sandbox's checkpoints", async () => {
  const s = await createLoopback(node);
  const page = await loggedIn();
  await page.click(`tr[data-sandbox="${s.id}"] a`);
  await page.waitForSelector("#state");
  expect(await page.textContent("#state")).toBe("running");
  await screenshot(page, "sandbox-detail");

  await page.click("#pause");
  await page.waitForSelector("#state.paused");
  expect(node.orch.get(s.id).state).toBe("paused");
  await page.click("#resume");
  await page.waitForSelector("#state.running");
  expect(node.orch.get(s.id).state).toBe("running");

  await page.fill("input[aria-label='snapshot name']", "checkpoint-one");
  await page.click("#snapshot");
  await page.waitForSelector("text=/snapshot \\w+ \\(checkpoint-one\\) committed/");
  const snaps = node.orch.listSnapshots({ sandboxId: s.id }).items;
  expect(snaps.map((x) => x.names)).toEqual([["checkpoint-one"]]);

  await page.fill("input[aria-label='fork count']", "2");
  await page.click("#fork");
  const note = await page.waitForSelector("text=/forked 2/");
  const children = await note.$$eval("a", (as) => as.map((a) => a.textContent));
  expect(children.length).toBe(2);
  for (const c of children) expect(node.orch.get(c!).state).toBe("running");
  // they live as long as a created sandbox, not the API's 15 s fork default; the field sets it
  expect(await page.inputValue("input[aria-label='fork timeout']")).toBe("300");
  for (const c of children) expect(node.orch.get(c!).endAt - node.orch.get(c!).startedAt).toBe(300_000);
  await page.fill("input[aria-label='fork count']", "1");
  await page.fill("input[aria-label='fork timeout']", "45");
  await page.click("#fork");
  const one = await page.waitForSelector("text=/forked 1/");
  const shortLived = (await one.$$eval("a", (as) => as.map((a) => a.textContent)))[0]!;
  expect(node.orch.get(shortLived).endAt - node.orch.get(shortLived).startedAt).toBe(45_000);
  children.push(shortLived);

  await page.goto(`${node.url}/console/#/snapshots`);
  const item = await page.waitForSelector(`li.sandbox[data-sandbox="${s.id}"] li.snapshot[data-snapshot="${snaps[0]!.snapshotID}"]`);
  expect(await item.textContent()).toContain("checkpoint-one");
  await screenshot(page, "snapshots");

  await page.goto(`${node.url}/console/#/sandboxes/${s.id}`);
  await page.click("#kill");
  await page.click("#kill-confirm");
  await page.waitForSelector("table#sandboxes");
  await until(() => !node.orch.inStates(["running", "paused"]).some((r) => r.id === s.id), 10_000, "the kill");
  for (const c of children) await node.orch.kill(c!);
}, 90_000);

test("nodes, volumes and templates pages show the API's data", async () => {
  const s = await createLoopback(node);
  const page = await loggedIn();
  await page.goto(`${node.url}/console/#/nodes`);
  const row = await page.waitForSelector("tr[data-node]");
  const nodes = (await (await fetch(`${node.url}/nodes`, { headers: { "x-api-key": node.apiKey } })).json()) as { id: string }[];
  expect(await row.getAttribute("data-node")).toBe(nodes[0]!.id);
  await page.waitForSelector(`tr[data-node] a:text("${s.id}")`);
  await screenshot(page, "nodes-single");

  await page.goto(`${node.url}/console/#/volumes`);
  await page.fill("input[aria-label='volume name']", "scratch");
  await page.click("text=Create volume");
  await page.waitForSelector("#volumes td:text('scratch')");
  expect(node.orch.volumes.list().map((v) => v.name)).toEqual(["scratch"]);
  await screenshot(page, "volumes");

  await page.goto(`${node.url}/console/#/templates`);
  await page.waitForSelector("table#templates");
  await screenshot(page, "templates");
  await node.orch.kill(s.id);
}, 60_000);

test("the build form sends FROM to the node, which builds on its template of that name, or pulls a registry reference", async () => {
  // a build-base template named base (its manifest: the base of a build needs nothing more)
  mkdirSync(join(node.home, "templates", "base"), { recursive: true });
  writeFileSync(join(node.home, "templates", "base", "manifest.json"), JSON.stringify({ name: "base", rootfs: "rootfs.ext4", layers: ["rootfs-k-1.layer"], bootArgs: "", diskBytes: 1 << 30, buildKey: "k", createdAt: new Date().toISOString() }));
  const page = await loggedIn();
  const build = async (name: string, dockerfile: string) => {
    await page.goto(`${node.url}/console/#/templates`);
    await page.fill("input[aria-label='template name']", name);
    await page.fill("textarea[aria-label='Dockerfile']", dockerfile);
    await page.click("#build");
    // the build's page follows its log to the end (no build VM here: it fails after the base)
    await page.waitForSelector("#build-status.error");
    return (await page.textContent("#build-log"))!;
  };
  const onTemplate = await build("form-on-base", "FROM base\nRUN true\n");
  expect(onTemplate).toContain("[base] FROM TEMPLATE base");
  expect(onTemplate).toContain("[base] base is a template of this node (FROM docker.io/library/base names the registry image)");
  const onImage = await build("form-on-image", "FROM 127.0.0.1:1/base\nRUN true\n");
  expect(onImage).toContain("[base] FROM 127.0.0.1:1/base");
  expect(onImage).not.toContain("FROM TEMPLATE");
}, 60_000);
