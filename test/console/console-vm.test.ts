/**
 * The console and the CLI's terminal against a real node with real VMs (QEMU microVMs booting
 * the base template, envd in the guest; test/e2e/world.ts: the node in a private network
 * namespace), Debian's Chromium started by the test inside that namespace, and the unmodified
 * e2b SDK for what the page does not do (fixtures/console-sdk.ts):
 * - a sandbox created by the SDK appears without a reload; its terminal runs `echo $((6*7))`
 *   and shows 42, follows a resize, pastes, and reports the shell's exit code;
 * - a file uploaded from the page is byte-exact in the guest and downloads byte-exact;
 * - processes (and their kill button), the live log tail (a guest console line written while it
 *   is open), metrics charts, pause and resume from the buttons, a snapshot;
 * - a template built from the page's Dockerfile form, followed to `ready`, then booted;
 * - `agentenv sandbox connect` under a pseudo-terminal (`script`): the remote size follows a
 *   TIOCSWINSZ on its terminal, and it exits with the shell's exit code;
 * - `agentenv sandbox logs --follow` prints a guest console line written after it started.
 * Screenshots of every page: test-artifacts/console/ (gitignored).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { createHash, randomBytes } from "node:crypto";
import { closeSync, openSync, readFileSync, readlinkSync, readdirSync } from "node:fs";
import { join } from "node:path";
import type { Page } from "playwright-core";
import { resizePty } from "../../src/ffi/pty.ts";
import { nodeForFile } from "../e2e/world.ts";
import { launchChromium, logIn, screenshot, terminalRows, type TestBrowser } from "./browser.ts";
import { waitFor } from "../helpers/wait.ts";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
const world = nodeForFile({ AENV__metrics__sample_interval_ms: "1000", AENV__console__refresh_ms: "500" });
let chrome: TestBrowser | undefined;
let sandboxId = "";

beforeAll(async () => {
  chrome = await launchChromium(world().ns);
}, 120_000);
afterAll(async () => {
  await chrome?.dispose();
}, 60_000);

const sdk = <T = any>(...args: string[]) => world().client<T>("console-sdk.ts", args, 600_000);

/** Wait until the terminal shows a row equal to `text`. */
async function terminalShows(page: Page, text: string, ms = 120_000): Promise<string[]> {
  return waitFor(`the terminal to show ${JSON.stringify(text)}`, async () => {
    const rows = await terminalRows(page);
    return rows.includes(text) && rows;
  }, { timeoutMs: ms, maxIntervalMs: 100 });
}

async function page(): Promise<Page> {
  const p = await chrome!.page();
  await logIn(p, world().url, world().apiKey);
  return p;
}

test("a sandbox created elsewhere appears without a reload; its terminal runs a command, follows resizes, pastes, and ends with the shell's exit code", async () => {
  const p = await page();
  await p.evaluate("window.mark = 7");
  sandboxId = (await sdk<{ id: string }>("create", JSON.stringify({ suite: "console" }))).id;
  await p.waitForSelector(`tr[data-sandbox="${sandboxId}"]`, { timeout: 60_000 });
  expect(await p.evaluate("window.mark")).toBe(7);
  await screenshot(p, "vm-sandboxes");

  await p.click(`tr[data-sandbox="${sandboxId}"] a`);
  await p.click("#tab-terminal");
  await p.waitForSelector("#terminal-status:text-matches('connected \\\\(pid \\\\d+\\\\)')", { timeout: 120_000 });
  await p.click("#terminal");
  await p.keyboard.type("echo $((6*7))\n");
  await terminalShows(p, "42");

  // the PTY's size is the page's: stty in the guest sees xterm's rows
  const rowsBefore = (await terminalRows(p)).length;
  await p.keyboard.type("stty size\n");
  await waitRow(p, new RegExp(`^${rowsBefore} \\d+$`));
  await p.setViewportSize({ width: 900, height: 600 });
  // (a function, not a string: the console's CSP forbids eval in the page)
  await p.waitForFunction((n: number) => (globalThis as unknown as { document: { querySelectorAll(s: string): { length: number } } }).document.querySelectorAll(".xterm-rows > div").length !== n, rowsBefore);
  const rowsAfter = (await terminalRows(p)).length;
  await p.keyboard.type("clear; stty size\n");
  await waitRow(p, new RegExp(`^${rowsAfter} \\d+$`));

  // paste from the clipboard (the Paste button), then the shell's exit code
  await p.context().grantPermissions(["clipboard-read", "clipboard-write"], { origin: world().url });
  await p.evaluate('navigator.clipboard.writeText("echo pasted-$((40+2))")');
  await p.click("text=Paste");
  await p.click("#terminal");
  await p.keyboard.press("Enter");
  await terminalShows(p, "pasted-42");
  await screenshot(p, "vm-terminal");
  await p.keyboard.type("exit 3\n");
  await p.waitForSelector("#terminal-status:text('exited with code 3')", { timeout: 60_000 });
}, 600_000);

/** Wait until a terminal row matches `re`; returns it. */
async function waitRow(p: Page, re: RegExp, ms = 60_000): Promise<string> {
  return waitFor(`a terminal row matching ${re}`, async () => (await terminalRows(p)).find((r) => re.test(r)), { timeoutMs: ms, maxIntervalMs: 100 });
}

test("files: an upload from the page is byte-exact in the guest and downloads byte-exact", async () => {
  const p = await page();
  await p.goto(`${world().url}/console/#/sandboxes/${sandboxId}/files`);
  await p.waitForSelector("table#files tbody tr");
  const bytes = randomBytes(300_000);
  await p.setInputFiles("#upload", { name: "upload.bin", mimeType: "application/octet-stream", buffer: bytes });
  await p.waitForSelector("text=uploaded /home/user/upload.bin", { timeout: 60_000 });
  const row = await p.waitForSelector('tr[data-path="/home/user/upload.bin"]');
  expect(await sdk("sha256", sandboxId, "/home/user/upload.bin")).toEqual({ sha256: createHash("sha256").update(bytes).digest("hex"), size: bytes.length });
  const [download] = await Promise.all([p.waitForEvent("download"), row.$("text=Download").then((b) => b!.click())]);
  expect(download.suggestedFilename()).toBe("upload.bin");
  expect(readFileSync((await download.path())!)).toEqual(bytes);
  await screenshot(p, "vm-files");
}, 300_000);

test("processes, the live log tail, metrics charts; pause and resume from the buttons; a snapshot", async () => {
  const p = await page();
  const { pid } = await sdk<{ pid: number }>("background", sandboxId, "sleep 900");
  await p.goto(`${world().url}/console/#/sandboxes/${sandboxId}/processes`);
  const proc = await p.waitForSelector(`#processes tr:has(td:text-is("${pid}"))`, { timeout: 60_000 });
  expect(await proc.textContent()).toContain("sleep 900");
  await screenshot(p, "vm-processes");
  await (await proc.$("text=Kill"))!.click();
  await p.waitForSelector(`#processes tr:has(td:text-is("${pid}"))`, { state: "detached", timeout: 60_000 });

  await p.goto(`${world().url}/console/#/sandboxes/${sandboxId}/logs`);
  await p.waitForSelector("#logs .line:has-text('sandbox created')", { timeout: 60_000 });
  await sdk("run", sandboxId, "echo console-marker-$((20+3)) > /dev/console", "root");
  await p.waitForSelector("#logs .line:has-text('console-marker-23')", { timeout: 60_000 });
  await screenshot(p, "vm-logs");

  await p.goto(`${world().url}/console/#/sandboxes/${sandboxId}/overview`);
  await p.waitForSelector(".chart .u-title:text('CPU %')", { timeout: 60_000 });
  await screenshot(p, "vm-metrics");

  await p.click("#pause");
  await p.waitForSelector("#state.paused", { timeout: 180_000 });
  expect(await sdk("state", sandboxId)).toEqual({ state: "paused" });
  await p.click("#resume");
  await p.waitForSelector("#state.running", { timeout: 180_000 });
  expect(await sdk("state", sandboxId)).toEqual({ state: "running" });
  expect(await sdk("run", sandboxId, "cat /home/user/upload.bin | wc -c")).toEqual({ stdout: "300000\n", exitCode: 0 });

  await p.fill("input[aria-label='snapshot name']", "vm-checkpoint");
  await p.click("#snapshot");
  await p.waitForSelector("text=/snapshot \\w+ \\(vm-checkpoint\\) committed/", { timeout: 180_000 });
  await p.goto(`${world().url}/console/#/snapshots`);
  await p.waitForSelector(`li.sandbox[data-sandbox="${sandboxId}"] li.snapshot:has-text("vm-checkpoint")`);
  await screenshot(p, "vm-snapshots");
  await p.goto(`${world().url}/console/#/nodes`);
  await p.waitForSelector(`tr[data-node] a:text("${sandboxId}")`);
  await screenshot(p, "vm-nodes");
}, 900_000);

test("a template built from the page's Dockerfile form is followed to ready, then boots with what it built", async () => {
  const p = await page();
  await p.goto(`${world().url}/console/#/templates`);
  await p.fill("input[aria-label='template name']", "console-app");
  await p.fill("textarea[aria-label='Dockerfile']", "FROM base\nRUN echo built-by-console > /home/user/built.txt\n");
  await p.click("#build");
  await p.waitForSelector("#build-status");
  await p.waitForSelector("#build-status:text('ready')", { timeout: 1_200_000 });
  const log = await p.textContent("#build-log");
  expect(log).toContain("[builder");
  expect(log).toContain("RUN echo built-by-console");
  await screenshot(p, "vm-template-build");
  await p.goto(`${world().url}/console/#/templates`);
  await p.waitForSelector("#templates td:text('console-app')");
  await screenshot(p, "vm-templates");
  const made = await sdk<{ id: string }>("create-from", "console-app");
  expect(await sdk("run", made.id, "cat /home/user/built.txt")).toEqual({ stdout: "built-by-console\n", exitCode: 0 });
  await sdk("kill", made.id);
}, 1_500_000);

/** The pseudo-terminal a process has as its stdin (/dev/pts/N). */
function ttyOf(pid: number): string {
  return readlinkSync(`/proc/${pid}/fd/0`);
}

/** Pid of the `agentenv sandbox connect <id>` process. */
function connectPid(id: string): number | null {
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const args = readFileSync(`/proc/${d}/cmdline`, "utf8").split("\0");
      if (args.includes("connect") && args.includes(id) && args.some((a) => a.endsWith("main.ts"))) return Number(d);
    } catch {
      // gone
    }
  }
  return null;
}

test("agentenv sandbox connect under a pseudo-terminal: runs a command, follows a resize, exits with the shell's code", async () => {
  const w = world();
  const cmd = `${process.execPath} ${MAIN} sandbox connect ${sandboxId}`;
  const p = Bun.spawn(["nsenter", `--net=/run/netns/${w.ns}`, "--", "script", "-qfec", cmd, "/dev/null"], {
    stdin: "pipe",
    stdout: "pipe",
    stderr: "pipe",
    env: { ...(process.env as Record<string, string>), AENV_API_URL: w.url, AENV_API_KEY: w.apiKey, AENV_LOG_LEVEL: "error" },
  });
  let out = "";
  let err = "";
  const reading = (async () => {
    for await (const c of p.stdout) out += new TextDecoder().decode(c);
  })();
  void (async () => {
    for await (const c of p.stderr) err += new TextDecoder().decode(c);
  })();
  const waitOut = async (re: RegExp, ms = 120_000) => {
    try {
      await waitFor(`${re} in the terminal output`, () => {
        if (p.exitCode !== null) throw new Error(`the CLI exited (${p.exitCode})`);
        return re.test(out);
      }, { timeoutMs: ms, maxIntervalMs: 100 });
    } catch (e) {
      p.kill("SIGKILL");
      throw new Error(`${e instanceof Error ? e.message : String(e)}:\n${out}\nstderr: ${err}`);
    }
  };
  const type = (s: string) => {
    p.stdin.write(s);
    p.stdin.flush();
  };
  // the remote shell's prompt first: keys typed before the CLI's raw mode would be echoed by script's terminal
  await waitOut(/\$ $/);
  // script's own terminal has no size: the CLI reports 80x24
  type("echo $((6*7))-ok; stty size\n");
  await waitOut(/42-ok\r*\n24 80\r*\n/);
  // a resize of the CLI's terminal (TIOCSWINSZ: the kernel sends it SIGWINCH) reaches the guest's PTY
  const pid = await waitFor("the CLI's connect process", () => connectPid(sandboxId), { timeoutMs: 5000 });
  const fd = openSync(ttyOf(pid), "r+");
  try {
    resizePty(fd, 132, 40);
  } finally {
    closeSync(fd);
  }
  const mark = out.length;
  // asked again until the answer shows the new size
  await waitFor("the resize to reach the guest", () => {
    if (/40 132\r*\n/.test(out.slice(mark))) return true;
    type("stty size\n");
    return false;
  }, { timeoutMs: 30_000, maxIntervalMs: 300 });
  type("exit 7\n");
  const code = await p.exited;
  await reading;
  expect(code).toBe(7);
}, 300_000);

test("agentenv sandbox logs --follow prints a guest console line written after it started", async () => {
  const w = world();
  const p = Bun.spawn(["nsenter", `--net=/run/netns/${w.ns}`, "--", process.execPath, MAIN, "sandbox", "logs", sandboxId, "--follow", "--interval", "200"], {
    stdout: "pipe",
    stderr: "pipe",
    env: { ...(process.env as Record<string, string>), AENV_API_URL: w.url, AENV_API_KEY: w.apiKey, AENV_LOG_LEVEL: "error" },
  });
  let out = "";
  const reading = (async () => {
    for await (const c of p.stdout) out += new TextDecoder().decode(c);
  })();
  const waitOut = (re: RegExp) =>
    waitFor(`${re} in the output`, () => {
      if (p.exitCode !== null) throw new Error(`the CLI exited (${p.exitCode}):\n${out}`);
      return re.test(out);
    }, { timeoutMs: 120_000, maxIntervalMs: 100 });
  await waitOut(/lifecycle\s+sandbox created/);
  expect(out).not.toContain("follow-marker-99");
  await sdk("run", sandboxId, "echo follow-marker-$((90+9)) > /dev/console", "root");
  await waitOut(/console\s+.*follow-marker-99/);
  await sdk("kill", sandboxId);
  expect(await p.exited).toBe(0);
  await reading;
}, 300_000);
