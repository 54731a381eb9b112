/**
 * Headless Chromium for the console's browser tests: Debian's /usr/bin/chromium driven by
 * playwright-core (no browser download), started by the test with a fresh profile and the flags
 * this machine needs (no sandbox as root, no background networking: the network is closed;
 * playwright gives it a fresh profile), and
 * optionally inside a network namespace (a node of test/e2e/world.ts listens only there). Every
 * page a test visits is saved as a screenshot under test-artifacts/console/ (gitignored).
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";

export const CHROMIUM = "/usr/bin/chromium";
/** Where screenshots go (gitignored). */
export const SHOTS_DIR = join(import.meta.dir, "../../test-artifacts/console");
const FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--disable-breakpad", "--disable-crash-reporter"];

/** A started browser and how to stop it (the browser process, its profile, the netns wrapper). */
export interface TestBrowser {
  browser: Browser;
  /** A new page in a fresh context (its own sessionStorage), downloads accepted. */
  page(): Promise<Page>;
  dispose(): Promise<void>;
}

/**
 * Start headless Chromium; `netns`: inside that network namespace (a wrapper script execs it
 * through nsenter; playwright talks to it over pipes, not the network).
 */
export async function launchChromium(netns?: string): Promise<TestBrowser> {
  const dir = mkdtempSync(join(tmpdir(), "aenv-chromium-"));
  let executablePath = CHROMIUM;
  if (netns) {
    executablePath = join(dir, "chromium-in-netns");
    writeFileSync(executablePath, `#!/bin/sh\nexec nsenter --net=/run/netns/${netns} -- ${CHROMIUM} "$@"\n`, { mode: 0o755 });
  }
  let browser: Browser;
  try {
    browser = await chromium.launch({ executablePath, args: FLAGS, timeout: 60_000 });
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  return {
    browser,
    page: async () => (await browser.newContext({ acceptDownloads: true, viewport: { width: 1280, height: 800 } })).newPage(),
    dispose: async () => {
      await browser.close().catch(() => {});
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Save a full-page screenshot as test-artifacts/console/<name>.png. */
export async function screenshot(page: Page, name: string): Promise<string> {
  mkdirSync(SHOTS_DIR, { recursive: true });
  const path = join(SHOTS_DIR, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  return path;
}

/** Open the console at `base` and log in with `key`; resolves when the sandboxes page shows. */
export async function logIn(page: Page, base: string, key: string): Promise<void> {
  await page.goto(`${base}/console/`);
  await page.fill("#api-key", key);
  await page.click("form.login button[type=submit]");
  await page.waitForSelector("table#sandboxes");
}

/** The text of every row of the xterm.js screen (its DOM renderer), trailing blanks cut. */
export async function terminalRows(page: Page): Promise<string[]> {
  return page.$$eval(".xterm-rows > div", (rows) => rows.map((r) => (r.textContent ?? "").replace(/\s+$/, "")));
}
