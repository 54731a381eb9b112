/**
 * `agentenv cluster up` (run from source) in a private network namespace, for the cluster tests:
 * its stdout is collected (banner, restarts, member pids), clients run inside the namespace,
 * and `dispose()` stops it and removes what its nodes may have left (VMs, namespaces, locks,
 * guest-RAM dirs, data and runtime dirs).
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { loadConfig } from "../../src/config/index.ts";
import { resolveKernelPath } from "../../src/vmm/index.ts";
import { pidsNaming, qemuPidsUnder, TEST_HOME } from "./world.ts";
import { waitFor } from "../helpers/wait.ts";

const MAIN = join(import.meta.dir, "../../src/cli/main.ts");
const LETTERS = "abcdefghij";

/** How `cluster up` is started. */
export interface ClusterWorldOptions {
  /** Namespace name prefix (the pid is appended). */
  nsPrefix: string;
  nodes: number;
  gatewayPort: number;
  schedulerPort: number;
  /** First node API port. */
  nodePort: number;
  /** `--node-restart-delay`, ms. */
  nodeRestartMs: number;
  /** Extra environment of cluster up (and so of its members). */
  env?: Record<string, string>;
}

/** Whether `pid` is a live process (a zombie has exited: it counts as gone). */
export function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z /.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

/** A `cluster up` in its own network namespace. */
export class ClusterWorld {
  readonly ns: string;
  readonly home = mkdtempSync("/tmp/aenv-cluster-");
  readonly runtime = mkdtempSync("/tmp/aenv-cluster-run-");
  proc?: Subprocess<"ignore", "pipe", "pipe">;
  out = "";
  err = "";
  gateway = "";
  key = "";
  nodes: Record<string, string> = {};

  constructor(private readonly o: ClusterWorldOptions) {
    this.ns = `${o.nsPrefix}${process.pid % 1000}`;
    const sh = (c: string[]) => {
      const r = Bun.spawnSync(c, { stderr: "pipe" });
      if (r.exitCode !== 0) throw new Error(`${c.join(" ")}: ${r.stderr}`);
    };
    sh(["ip", "netns", "add", this.ns]);
    sh(["ip", "-n", this.ns, "link", "set", "lo", "up"]);
  }

  /** Start cluster up (with `env` over the options' env) and wait for its banner. */
  async up(env: Record<string, string> = {}): Promise<void> {
    const o = this.o;
    const args = ["cluster", "up", "--nodes", String(o.nodes), "--home", this.home, "--from-home", TEST_HOME, "--runtime", this.runtime, "--gateway-addr", `127.0.0.1:${o.gatewayPort}`, "--scheduler-port", String(o.schedulerPort), "--node-port", String(o.nodePort), "--node-restart-delay", String(o.nodeRestartMs)];
    const p = Bun.spawn(["nsenter", `--net=/run/netns/${this.ns}`, "--", process.execPath, MAIN, ...args], {
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
      env: {
        ...(process.env as Record<string, string>),
        AENV_LOG_LEVEL: "warn",
        AENV__kernel__path: resolveKernelPath(loadConfig({ env: { AENV_HOME_PATH: TEST_HOME } })),
        AENV__vm__driver: "qemu",
        ...o.env,
        ...env,
      },
    });
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

  /** Wait until stdout (from `from`) matches; fails when cluster up exits or `ms` pass. */
  async waitFor(re: RegExp, ms: number, from = 0): Promise<RegExpExecArray> {
    try {
      return await waitFor(`cluster up to print ${re}`, () => {
        if (this.proc?.exitCode != null) throw new Error(`cluster up exited (${this.proc.exitCode})`);
        return re.exec(this.out.slice(from));
      }, { timeoutMs: ms, maxIntervalMs: 100 });
    } catch (e) {
      throw new Error(`cluster: no ${re}: ${e instanceof Error ? e.message : String(e)}\nstdout: ${this.out}\nstderr: ${this.err.slice(-6000)}`);
    }
  }

  /** Latest pid of a member (`scheduler`, `gateway`, `node-b`) printed after `from`. */
  pid(name: string, from = 0): number {
    const all = [...this.out.slice(from).matchAll(new RegExp(`(?:^|\\s)${name === "scheduler" || name === "gateway" ? name : `node ${name}`} pid (\\d+)`, "g"))];
    return Number(all[all.length - 1]![1]);
  }

  /** SIGKILL a member and wait for `cluster up` to report it started again. */
  async killAndAwaitRestart(name: string, ms: number): Promise<void> {
    const mark = this.out.length;
    process.kill(this.pid(name), "SIGKILL");
    await this.waitFor(new RegExp(`cluster: ${name} exited \\(SIGKILL\\)`), 10_000, mark);
    await this.waitFor(new RegExp(`(?:^|\\s)${name === "scheduler" || name === "gateway" ? name : `node ${name}`} pid \\d+`), ms, mark);
  }

  /**
   * Hold node `name`'s runtime-path lock from the moment the node dies (a flock queued now):
   * until `release()`, every start of that node fails. Resolves once the lock is held.
   */
  holdNodeLock(name: string): { held: Promise<void>; release: () => Promise<void> } {
    const p = Bun.spawn(["flock", join(this.runtime, name, "node.lock"), "sh", "-c", "echo locked; read x; exit 0"], { stdin: "pipe", stdout: "pipe" });
    const held = (async () => {
      const r = await p.stdout.getReader().read();
      if (new TextDecoder().decode(r.value) !== "locked\n") throw new Error(`flock on ${name}'s lock ended: ${await p.exited}`);
    })();
    return {
      held,
      release: async () => {
        await p.stdin.end();
        if ((await p.exited) !== 0) throw new Error(`the lock holder of ${name} failed`);
      },
    };
  }

  /** Run a fixture script inside the namespace with the SDK pointed at the gateway; its last stdout line as JSON. */
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

  /** Stop cluster up (SIGTERM, SIGKILL after 60 s) and remove everything its members may have left. */
  async dispose(): Promise<void> {
    if (this.proc && this.proc.exitCode === null) {
      this.proc.kill("SIGTERM");
      const t = setTimeout(() => this.proc?.kill("SIGKILL"), 60_000);
      await this.proc.exited;
      clearTimeout(t);
    }
    // what a failed test may leave: members (they outlive a cluster up killed with SIGKILL only
    // until they see their stdin close), VMMs, the disk daemon of a killed node and its FUSE
    // mounts (removed first, or the recursive delete below walks into a live mount)
    const members = [...this.out.matchAll(/ pid (\d+)/g)].map((m) => Number(m[1])).filter(alive);
    for (const pid of [...members, ...qemuPidsUnder(this.home, "/dev/shm/agentenv-cluster-"), ...pidsNaming(this.home), ...pidsNaming(this.runtime)]) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    const mounts = readFileSync("/proc/mounts", "utf8").split("\n").map((l) => l.split(" ")[1] ?? "").filter((m) => m.startsWith(`${this.home}/`) || m.startsWith(`${this.runtime}/`));
    for (const m of mounts) Bun.spawnSync(["umount", "-l", m]);
    const letters = LETTERS.slice(0, this.o.nodes).split("");
    if (existsSync("/run/netns")) for (const n of readdirSync("/run/netns")) if (letters.some((x) => new RegExp(`^acl${x}-\\d+$`).test(n))) Bun.spawnSync(["ip", "netns", "del", n]);
    Bun.spawnSync(["ip", "netns", "del", this.ns]);
    for (const x of letters) {
      rmSync(`/dev/shm/agentenv-cluster-node-${x}`, { recursive: true, force: true });
      rmSync(`/run/agentenv-net-acl${x}-.lock`, { force: true });
    }
    rmSync(this.home, { recursive: true, force: true });
    rmSync(this.runtime, { recursive: true, force: true });
  }
}
