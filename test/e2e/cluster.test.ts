/**
 * A cluster end to end on one host, all real: `agentenv cluster up` (scheduler with SQLite
 * bindings, gateway, two nodes with their own data dirs, runtime paths and network prefixes,
 * QEMU microVMs booting the base template) in a private network namespace, and the unmodified
 * e2b SDK pointed at the gateway. Four sandboxes land on both nodes; commands, files, a sandbox
 * port over HTTP and WebSocket, list, pause/resume; the scheduler (and then the gateway, whose
 * route cache goes with it) is killed and restarted and every sandbox still routes; one node is
 * killed with SIGKILL: its sandboxes answer 502 naming it while the other node's keep working,
 * the scheduler marks it UNHEALTHY and drops its bindings; the node is restarted by `cluster up`
 * and reaps what it left.
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { loadConfig } from "../../src/config/index.ts";
import { resolveKernelPath } from "../../src/vmm/index.ts";
import { qemuPidsUnder, TEST_HOME, vmPrerequisites } from "./world.ts";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
const NODE_RESTART_MS = 20_000;

class ClusterWorld {
  readonly ns = `aclu${process.pid % 1000}`;
  readonly home = mkdtempSync("/tmp/aenv-cluster-");
  readonly runtime = mkdtempSync("/tmp/aenv-cluster-run-");
  proc?: Subprocess<"ignore", "pipe", "pipe">;
  out = "";
  err = "";
  gateway = "";
  key = "";
  nodes: Record<string, string> = {};

  constructor() {
    const sh = (c: string[]) => {
      const r = Bun.spawnSync(c, { stderr: "pipe" });
      if (r.exitCode !== 0) throw new Error(`${c.join(" ")}: ${r.stderr}`);
    };
    sh(["ip", "netns", "add", this.ns]);
    sh(["ip", "-n", this.ns, "link", "set", "lo", "up"]);
  }

  async up(): Promise<void> {
    const p = Bun.spawn(
      ["nsenter", `--net=/run/netns/${this.ns}`, "--", process.execPath, MAIN, "cluster", "up", "--home", this.home, "--from-home", TEST_HOME, "--runtime", this.runtime, "--gateway-addr", "127.0.0.1:18080", "--scheduler-port", "19090", "--node-port", "18001", "--node-restart-delay", String(NODE_RESTART_MS)],
      {
        stdin: "ignore",
        stdout: "pipe",
        stderr: "pipe",
        env: {
          ...(process.env as Record<string, string>),
          AENV_LOG_LEVEL: "warn",
          AENV__kernel__path: resolveKernelPath(loadConfig({ env: { AENV_HOME_PATH: TEST_HOME } })),
          AENV__vm__driver: "qemu",
          AENV__pool__low_watermark: "1",
          AENV__pool__high_watermark: "2",
        },
      },
    );
    this.proc = p;
    void (async () => {
      for await (const c of p.stdout) this.out += new TextDecoder().decode(c);
    })();
    void (async () => {
      for await (const c of p.stderr) this.err = (this.err + new TextDecoder().decode(c)).slice(-30_000);
    })();
    const banner = await this.waitFor(/E2B SDK: E2B_API_URL=(\S+) E2B_SANDBOX_URL=(\S+) E2B_API_KEY=(\S+)/, 120_000);
    this.gateway = banner[1]!;
    this.key = banner[3]!;
    for (const m of this.out.matchAll(/node (node-\w) pid \d+ (\S+)/g)) this.nodes[m[1]!] = m[2]!;
  }

  /** Wait until stdout (from `from`) matches. */
  async waitFor(re: RegExp, ms: number, from = 0): Promise<RegExpExecArray> {
    const end = Date.now() + ms;
    for (;;) {
      const m = re.exec(this.out.slice(from));
      if (m) return m;
      if (Date.now() > end || this.proc?.exitCode != null) throw new Error(`cluster: no ${re} in ${ms} ms\nstdout: ${this.out}\nstderr: ${this.err.slice(-6000)}`);
      await Bun.sleep(100);
    }
  }

  /** Latest pid of a member (`scheduler`, `gateway`, `node-b`). */
  pid(name: string): number {
    const all = [...this.out.matchAll(new RegExp(`(?:^|\\s)${name === "scheduler" || name === "gateway" ? name : `node ${name}`} pid (\\d+)`, "g"))];
    return Number(all[all.length - 1]![1]);
  }

  /** SIGKILL a member and wait for `cluster up` to report it started again. */
  async killAndAwaitRestart(name: string, ms: number): Promise<void> {
    const mark = this.out.length;
    process.kill(this.pid(name), "SIGKILL");
    await this.waitFor(new RegExp(`cluster: ${name} exited \\(SIGKILL\\)`), 10_000, mark);
    await this.waitFor(new RegExp(`(?:^|\\s)${name === "scheduler" || name === "gateway" ? name : `node ${name}`} pid \\d+`), ms, mark);
  }

  async client<T = any>(script: string, args: string[] = [], timeoutMs = 400_000): Promise<T> {
    const p = Bun.spawn(["nsenter", `--net=/run/netns/${this.ns}`, "--", process.execPath, join(import.meta.dir, "fixtures", script), ...args], {
      stdout: "pipe",
      stderr: "pipe",
      env: { ...(process.env as Record<string, string>), E2B_API_URL: this.gateway, E2B_SANDBOX_URL: this.gateway, E2B_API_KEY: this.key },
    });
    const timer = setTimeout(() => p.kill("SIGKILL"), timeoutMs);
    const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
    clearTimeout(timer);
    if (code !== 0) throw new Error(`client ${script} exited ${code}\nstdout: ${out}\nstderr: ${err}\ncluster stdout: ${this.out}\ncluster stderr: ${this.err.slice(-8000)}`);
    return JSON.parse(out.trim().split("\n").pop()!) as T;
  }

  async dispose(): Promise<void> {
    if (this.proc && this.proc.exitCode === null) {
      this.proc.kill("SIGTERM");
      const t = setTimeout(() => this.proc?.kill("SIGKILL"), 60_000);
      await this.proc.exited;
      clearTimeout(t);
    }
    for (const pid of qemuPidsUnder(this.home, "/dev/shm/agentenv-cluster-")) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    if (existsSync("/run/netns")) for (const n of readdirSync("/run/netns")) if (/^acl[ab]-\d+$/.test(n)) Bun.spawnSync(["ip", "netns", "del", n]);
    Bun.spawnSync(["ip", "netns", "del", this.ns]);
    for (const x of ["a", "b"]) {
      rmSync(`/dev/shm/agentenv-cluster-node-${x}`, { recursive: true, force: true });
      rmSync(`/run/agentenv-net-acl${x}-.lock`, { force: true });
    }
    rmSync(this.home, { recursive: true, force: true });
    rmSync(this.runtime, { recursive: true, force: true });
  }
}

const missing = vmPrerequisites();
let world: ClusterWorld | undefined;
beforeAll(async () => {
  if (missing) return;
  world = new ClusterWorld();
  await world.up();
}, 180_000);
afterAll(async () => {
  await world?.dispose();
}, 120_000);

test("cluster: SDK through the gateway on two nodes; scheduler and gateway restarts keep routing; a killed node answers 502 while the other serves", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  const w = world!;
  expect(Object.keys(w.nodes).sort()).toEqual(["node-a", "node-b"]);

  const o = await w.client("cluster-flow.ts", [JSON.stringify(w.nodes)]);
  const ids = o.ids as string[];
  expect(ids.length).toBe(4);
  const placed = ids.map((id) => o.placement[id]);
  expect(placed.filter((n) => n === "node-a").length).toBe(2);
  expect(placed.filter((n) => n === "node-b").length).toBe(2);
  expect(o.runs).toEqual(ids.map((_, i) => `run-${i}\nuser\n`));
  expect(o.files).toEqual([true, true, true, true]);
  for (const n of ["node-a", "node-b"]) {
    expect(o.ports[n].http).toBe(`http from ${o.ports[n].hostname} path /hello?x=1`);
    expect(o.ports[n].ws).toBe(`echo:hi-${n}`);
  }
  expect(o.listed).toEqual([...ids].sort());
  expect(o.pausedState).toBe("paused");
  expect(o.afterResume).toEqual({ run: "back\n", file: true });

  // the scheduler dies and comes back from its SQLite file; then the gateway too (its route
  // cache is gone: every route now comes from the restarted scheduler)
  await w.killAndAwaitRestart("scheduler", 30_000);
  await w.killAndAwaitRestart("gateway", 30_000);
  const after = await w.client("cluster-check.ts", [JSON.stringify(ids)]);
  for (const id of ids) expect(after[id]).toMatchObject({ status: 200, run: `alive-${id}` });

  // node-b killed: its sandboxes answer 502 naming it, quickly; node-a's keep working
  const mark = w.out.length;
  process.kill(w.pid("node-b"), "SIGKILL");
  await w.waitFor(/cluster: node-b exited \(SIGKILL\)/, 10_000, mark);
  const down = await w.client("cluster-check.ts", [JSON.stringify(ids)]);
  for (const id of ids) {
    if (o.placement[id] === "node-b") {
      expect(down[id].status).toBe(502);
      expect(down[id].message).toContain("node node-b (http://127.0.0.1:18002) is unreachable");
      expect(down[id].run).not.toContain("alive");
    } else expect(down[id]).toMatchObject({ status: 200, run: `alive-${id}` });
  }
  // the scheduler: node-b UNHEALTHY (unschedulable) and its bindings gone, before node-b is back
  const q = await w.client("scheduler-query.ts", ["127.0.0.1:19090", "node-b", JSON.stringify(ids)]);
  expect(w.out.slice(mark)).not.toMatch(/node node-b pid \d+/);
  expect(q.statuses).toEqual({ "node-a": "NODE_STATUS_READY", "node-b": "NODE_STATUS_UNHEALTHY" });
  for (const id of ids) expect(q.lookups[id]).toBe(o.placement[id] === "node-b" ? null : "node-a");
  // cluster up restarts node-b; at start it reaps the VMs its crashed run left
  await w.waitFor(/node node-b pid \d+/, NODE_RESTART_MS + 60_000, mark);
  const bIds = ids.filter((id) => o.placement[id] === "node-b");
  const reaped = await w.client("cluster-check.ts", [JSON.stringify(bIds)]);
  for (const id of bIds) expect(reaped[id].status).toBe(404);
  expect(qemuPidsUnder(join(w.home, "node-b"), "/dev/shm/agentenv-cluster-node-b")).toEqual([]);
  console.log(`cluster e2e steps (ms): ${JSON.stringify(o.steps)}; down-check ms: ${JSON.stringify(Object.values(down).map((d: any) => d.ms))}`);
}, 900_000);
