/**
 * `agentenv cluster up` on a data dir without a guest kernel or base template: what is missing
 * is found (and nothing on the test home scripts/test.sh built), `--no-build` stops with one line
 * naming the commands to run before anything starts, and the build steps run this binary with the
 * data dir set, in order, stopping at the first that fails.
 */
import { afterAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { buildPrerequisites, missingMessage, missingPrerequisites } from "../../services/cluster/prereqs.ts";
import { ClusterError } from "../../services/cluster/errors.ts";
import { TEST_HOME, vmPrerequisites } from "../e2e/world.ts";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
const tmp = mkdtempSync("/tmp/aenv-prereqs-");
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const cfg = loadConfig({ env: {} });

test("what is missing: both in an empty home, the template alone beside a kernel, nothing in the test home", () => {
  const empty = join(tmp, "empty");
  mkdirSync(empty);
  expect(missingPrerequisites(cfg, empty)).toEqual([
    { what: "guest kernel", command: ["kernel", "build"] },
    { what: "base template", command: ["template", "build-base"] },
  ]);
  const missing = vmPrerequisites();
  if (missing) throw new Error(`the test home is not built: ${missing}`);
  const kernelOnly = join(tmp, "kernel-only");
  mkdirSync(kernelOnly);
  symlinkSync(join(TEST_HOME, "kernels"), join(kernelOnly, "kernels"));
  expect(missingPrerequisites(cfg, kernelOnly)).toEqual([{ what: "base template", command: ["template", "build-base"] }]);
  expect(missingPrerequisites(cfg, TEST_HOME)).toEqual([]);
});

test("--no-build: one line saying what to run, exit 1, nothing started", async () => {
  const home = join(tmp, "nobuild");
  mkdirSync(home);
  const p = Bun.spawn([process.execPath, MAIN, "cluster", "up", "--no-build", "--from-home", home, "--home", join(tmp, "cluster"), "--scheduler-port", "1", "--node-port", "2"], {
    stdout: "pipe",
    stderr: "pipe",
    env: { ...(process.env as Record<string, string>), AENV_LOG_LEVEL: "error" },
  });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  expect(code).toBe(1);
  expect(out).toBe("");
  expect(err).toBe(`agentenv cluster up: ${missingMessage(home, missingPrerequisites(cfg, home))}\n`);
  expect(err).toContain(`run \`AENV_HOME_PATH=${home} agentenv kernel build\` then \`AENV_HOME_PATH=${home} agentenv template build-base\``);
});

test("building: each step runs this binary with the data dir set, in order; a failing step stops the rest", async () => {
  const home = join(tmp, "build");
  mkdirSync(home);
  const lines: string[] = [];
  // `config check` stands in for the two builds: it prints the home it was given
  const out = join(tmp, "seen.json");
  const self = ["sh", "-c", `"$0" "$@" >> ${out}`, process.execPath, MAIN];
  await buildPrerequisites(self, home, [{ what: "first thing", command: ["config", "check"] }, { what: "second thing", command: ["config", "check"] }], (l) => lines.push(l));
  expect(lines).toEqual([`cluster: building the first thing in ${home} (agentenv config check; the kernel takes minutes)`, `cluster: building the second thing in ${home} (agentenv config check; the kernel takes minutes)`]);
  const seen = readFileSync(out, "utf8").match(/"home_path": "[^"]+"/g);
  expect(seen).toEqual([`"home_path": "${home}"`, `"home_path": "${home}"`]);
  const e = await buildPrerequisites([process.execPath, MAIN], home, [{ what: "kernel", command: ["kernel", "nosuch"] }, { what: "never", command: ["version"] }], (l) => lines.push(l)).catch((x) => x);
  expect(e).toBeInstanceOf(ClusterError);
  expect(e).toMatchObject({ code: "cluster.prerequisite_failed", details: { step: "kernel nosuch" } });
  expect(e.details.exitCode).not.toBe(0);
  expect(lines.some((l) => l.includes("never"))).toBe(false);
});
