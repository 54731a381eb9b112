/**
 * `bun build --compile src/cli/main.ts <worker entries>` produces a single binary in which `agentenv envd` works:
 * the compiled envd (real binary, real processes, real PTY through bun:ffi) serves the e2b SDK.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { Sandbox } from "e2b";
import { ENVD_VERSION } from "../../src/envd/version.ts";
import { compileEntrypoints } from "../../src/bundle.ts";
import { ensureUserAccount, initEnvd, ROOT, startEnvdChild, type EnvdChild } from "./harness.ts";
import { waitFor } from "../helpers/wait.ts";

let tmp: string;
let bin: string;
let envd: EnvdChild | undefined;

beforeAll(async () => {
  ensureUserAccount();
  tmp = mkdtempSync("/tmp/envd-bin-");
  bin = join(tmp, "agentenv");
  const b = Bun.spawn(["bun", "build", "--compile", ...compileEntrypoints(), "--outfile", bin], { stdout: "pipe", stderr: "pipe", cwd: ROOT });
  const code = await b.exited;
  if (code !== 0) throw new Error(`bun build failed: ${await new Response(b.stderr).text()}`);
}, 120_000);

afterAll(async () => {
  await envd?.stop();
  rmSync(tmp, { recursive: true, force: true });
});

test("compiled `agentenv envd` serves commands, PTY and files to the SDK", async () => {
  expect(statSync(bin).size).toBeGreaterThan(10_000_000);
  envd = await startEnvdChild([bin]);
  const health = await fetch(`${envd.url}/health`);
  expect(health.status).toBe(204);
  expect((await initEnvd(envd.url, { accessToken: "bintoken", defaultUser: "user" })).status).toBe(204);
  const sbx = new Sandbox({ sandboxId: "sbxbin", envdVersion: ENVD_VERSION, envdAccessToken: "bintoken", sandboxUrl: envd.url, apiKey: "e2b_00" } as never);
  const r = await sbx.commands.run("echo compiled; id -un");
  expect(r.stdout).toBe("compiled\nuser\n");
  let out = "";
  const h = await sbx.pty.create({ cols: 70, rows: 11, onData: (d) => void (out += new TextDecoder().decode(d)) });
  await sbx.pty.sendInput(h.pid, new TextEncoder().encode("stty size\n"));
  await waitFor("out.includes(\"11 70\")", () => out.includes("11 70"));
  expect(await sbx.pty.kill(h.pid)).toBe(true);
  await sbx.files.write("/tmp/envd-bin-probe.txt", "via binary");
  expect(await sbx.files.read("/tmp/envd-bin-probe.txt")).toBe("via binary");
  rmSync("/tmp/envd-bin-probe.txt");
}, 60_000);
