/**
 * `agentenv cluster up`: a whole cluster on one host — scheduler, gateway and N nodes, each a
 * child process of this one (the same binary), each node with its own data dir, runtime path,
 * API address, network prefix, slot address ranges, DNS proxy port and guest-RAM directory
 * (docs/operations.md: "one node per runtime path and network prefix"). Nodes share the kernels,
 * templates and tools drive of `--from-home` (symlinked). One API key for clients and nodes.
 *
 * Supervision: a member must print its ready line within `ready_timeout_ms` (else it is killed
 * and the start fails); a member that exits unexpectedly is started again after a pause (a
 * restarted node reaps what its crashed run left: VMs, disks, namespaces), and a restart that
 * fails is tried again after the same pause until one succeeds. Stopping (`down()`: SIGINT/
 * SIGTERM of cluster up) sends SIGTERM to the gateway, the nodes, then the scheduler, each given
 * `stop_timeout_ms` before SIGKILL. Members run with a pipe from cluster up as stdin and
 * AENV_STOP_ON_STDIN_EOF=1: if cluster up dies (even by SIGKILL) the pipe closes and every
 * member shuts down by itself, so nothing is left holding the ports of the next `cluster up`.
 */
import { existsSync, mkdirSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { loadOrCreateApiKey } from "../../src/api/auth.ts";
import { STOP_ON_STDIN_EOF_ENV } from "../../src/node/until-stopped.ts";
import { logger } from "../../src/observability/log.ts";
import { ClusterError } from "./errors.ts";
import { orLate } from "../../src/util/timeout.ts";
import { errorMessage } from "../../src/util/error.ts";

/** What `agentenv cluster up` starts and how it supervises it. */
export interface ClusterOptions {
  /** Base directory: <home>/scheduler, <home>/gateway, <home>/node-<x>. */
  home: string;
  /** Data dir holding kernels/ and templates/ the nodes use. */
  fromHome: string;
  /** Base of the nodes' runtime paths (<runtime>/node-<x>). */
  runtime: string;
  nodes: number;
  gatewayAddr: string;
  schedulerPort: number;
  /** First node API port (127.0.0.1); node i gets base + i. */
  nodePortBase: number;
  /** Key for clients and nodes ("" = $home/api-key, generated once). */
  apiKey: string;
  /** Heartbeat interval of the nodes, s (the scheduler's report_ttl is twice it). */
  reportIntervalSecs: number;
  /** Pause before a dead node is started again, ms. */
  nodeRestartDelayMs: number;
  /** Pause before a dead scheduler or gateway is started again, ms. */
  serviceRestartDelayMs: number;
  /** Longest wait for a member's ready line, ms. */
  readyTimeoutMs: number;
  /** Longest wait for a member to exit after SIGTERM, ms (then SIGKILL). */
  stopTimeoutMs: number;
  /** Lines of the banner and of restarts go here. */
  print: (line: string) => void;
}

/** One member of the cluster and how to (re)start it. */
interface Member {
  name: string;
  args: string[];
  env: Record<string, string>;
  /** A stdout line that says it is ready. */
  ready: RegExp;
  restartDelayMs: number;
  proc?: Subprocess<"pipe", "pipe", "inherit">;
  /** Shown after start. */
  describe: () => string;
}

/** How to run this binary again: the compiled binary itself, or bun + the CLI source. */
export function selfCommand(): string[] {
  return import.meta.dir.startsWith("/$bunfs") ? [process.execPath] : [process.execPath, join(import.meta.dir, "../../src/cli/main.ts")];
}

const LETTERS = "abcdefghij";

/**
 * The members of a one-host cluster (scheduler, N nodes, gateway) as child processes of this
 * one: `up()` starts them in that order, `down()` stops them; members that die are restarted.
 */
export class LocalCluster {
  private readonly log = logger("cluster");
  private readonly members: Member[] = [];
  private stopping = false;
  readonly apiKey: string;
  readonly gatewayUrl: string;

  /** @throws ClusterError bad_option when nodes is outside 1..10; Error when a directory cannot be made. */
  constructor(private readonly o: ClusterOptions) {
    if (!Number.isInteger(o.nodes) || o.nodes < 1 || o.nodes > 10) throw new ClusterError("cluster.bad_option", `--nodes must be 1..10, got ${o.nodes}`, { option: "nodes", value: o.nodes });
    mkdirSync(o.home, { recursive: true });
    this.apiKey = loadOrCreateApiKey(o.apiKey, o.home).key;
    const schedulerAddr = `127.0.0.1:${o.schedulerPort}`;
    const shown = o.gatewayAddr.replace(/^0\.0\.0\.0:/, "127.0.0.1:");
    this.gatewayUrl = `http://${shown}`;
    const nodeUrls: string[] = [];
    for (let i = 0; i < o.nodes; i++) {
      const x = LETTERS[i]!;
      const id = `node-${x}`;
      const home = join(o.home, id);
      mkdirSync(home, { recursive: true });
      for (const d of ["kernels", "templates", "tools"]) {
        if (!existsSync(join(home, d)) && existsSync(join(o.fromHome, d))) symlinkSync(join(o.fromHome, d), join(home, d));
      }
      const url = `http://127.0.0.1:${o.nodePortBase + i}`;
      nodeUrls.push(`${id}=${url}`);
      this.members.push({
        name: id,
        args: ["server"],
        env: {
          AENV_HOME_PATH: home,
          AENV_RUNTIME_PATH: join(o.runtime, id),
          AENV_API_ADDR: `127.0.0.1:${o.nodePortBase + i}`,
          AENV_API_KEY: this.apiKey,
          AENV_NODE_ID: id,
          AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED: "true",
          AENV_OBSERVABILITY_SCHEDULER_ENDPOINT: schedulerAddr,
          AENV_OBSERVABILITY_REPORT_INTERVAL_SECS: String(o.reportIntervalSecs),
          // disjoint host objects per node: netns/veth/chain prefix, slot ranges, DNS proxy, egress interceptor, guest RAM
          AENV__network__name_prefix: `acl${x}-`,
          AENV__network__internal__host_interaction_cidr: `10.${40 + 2 * i}.0.0/16`,
          AENV__network__internal__veth_cidr: `10.${41 + 2 * i}.0.0/16`,
          AENV__network__egress__dns_proxy_port: "0",
          AENV__network__egress__interceptor_port: "0",
          AENV__qemu__memory_dir: `/dev/shm/agentenv-cluster-${id}`,
          // one secrets store for the cluster: the gateway's (docs/security.md)
          AENV__secrets__gateway_url: this.gatewayUrl,
        },
        ready: /API key \(\w+\):/,
        restartDelayMs: o.nodeRestartDelayMs,
        describe: () => `node ${id} pid ${this.pidOf(id)} ${url}`,
      });
    }
    this.members.unshift({
      name: "scheduler",
      args: ["scheduler"],
      env: {
        AENV_HOME_PATH: join(o.home, "scheduler"),
        AENV__scheduler__addr: schedulerAddr,
        AENV__scheduler__nodes: nodeUrls.join(","),
        AENV__scheduler__report_ttl_secs: String(2 * o.reportIntervalSecs),
      },
      ready: /scheduler listening on/,
      restartDelayMs: o.serviceRestartDelayMs,
      describe: () => `scheduler pid ${this.pidOf("scheduler")} ${schedulerAddr}`,
    });
    this.members.push({
      name: "gateway",
      args: ["gateway"],
      env: { AENV_HOME_PATH: join(o.home, "gateway"), AENV_API_KEY: this.apiKey, AENV__gateway__addr: o.gatewayAddr, AENV__cluster__scheduler_endpoint: schedulerAddr },
      ready: /E2B SDK:/,
      restartDelayMs: o.serviceRestartDelayMs,
      describe: () => `gateway pid ${this.pidOf("gateway")} ${this.gatewayUrl}`,
    });
  }

  private pidOf(name: string): number | undefined {
    return this.members.find((m) => m.name === name)?.proc?.pid;
  }

  /**
   * Start one member and wait (at most readyTimeoutMs) for its ready line.
   * @throws ClusterError member_failed (it exited first, with its output), member_not_ready
   *   (killed after the wait).
   */
  private async launch(m: Member): Promise<void> {
    const p = Bun.spawn([...selfCommand(), ...m.args], { env: { ...process.env, ...m.env, [STOP_ON_STDIN_EOF_ENV]: "1" } as Record<string, string>, stdin: "pipe", stdout: "pipe", stderr: "inherit" });
    m.proc = p;
    const reader = p.stdout.getReader();
    let out = "";
    const deadline = Date.now() + this.o.readyTimeoutMs;
    while (!m.ready.test(out)) {
      const r = await orLate(reader.read(), deadline - Date.now(), "late");
      if (r === "late") {
        p.kill("SIGKILL");
        await p.exited;
        throw new ClusterError("cluster.member_not_ready", `${m.name} printed no ready line within ${this.o.readyTimeoutMs} ms; killed`, { member: m.name, timeoutMs: this.o.readyTimeoutMs, output: out.slice(-2000) });
      }
      if (r.done) {
        const exitCode = await p.exited;
        throw new ClusterError("cluster.member_failed", `${m.name} exited before it was ready (code ${exitCode}): ${out}`, { member: m.name, exitCode, output: out.slice(-2000) });
      }
      out += new TextDecoder().decode(r.value);
    }
    reader.releaseLock();
    void (async () => {
      for await (const _ of p.stdout) {
        // drained: children print their banners only
      }
    })();
    void p.exited.then((code) => this.onExit(m, p, code));
  }

  private onExit(m: Member, p: Subprocess, code: number | null): void {
    if (this.stopping || m.proc !== p) return;
    this.o.print(`cluster: ${m.name} exited (${p.signalCode ?? `code ${code}`}); restarting in ${m.restartDelayMs} ms`);
    this.restartLater(m);
  }

  /** Start `m` again after its pause; a failed start is tried again after the same pause. */
  private restartLater(m: Member): void {
    setTimeout(() => {
      if (this.stopping) return;
      this.launch(m).then(
        () => this.o.print(`  ${m.describe()}`),
        (e) => {
          if (this.stopping) return;
          this.o.print(`cluster: ${m.name} failed to restart: ${errorMessage(e).split("\n")[0]}; trying again in ${m.restartDelayMs} ms`);
          this.restartLater(m);
        },
      );
    }, m.restartDelayMs);
  }

  /** Start scheduler, nodes, gateway; print the banner. On failure everything started is stopped. */
  async up(): Promise<void> {
    try {
      for (const m of this.members) await this.launch(m);
    } catch (e) {
      await this.down();
      throw e;
    }
    this.o.print(`AgentENV cluster up: ${this.o.nodes} node(s), scheduler 127.0.0.1:${this.o.schedulerPort}, gateway ${this.gatewayUrl}`);
    for (const m of this.members) this.o.print(`  ${m.describe()}`);
    this.o.print(`  E2B SDK: E2B_API_URL=${this.gatewayUrl} E2B_SANDBOX_URL=${this.gatewayUrl} E2B_API_KEY=${this.apiKey}`);
  }

  /**
   * Stop the gateway, then the nodes (SIGTERM: their shutdown_action), then the scheduler; a
   * member still running stopTimeoutMs after its SIGTERM is killed.
   */
  async down(): Promise<void> {
    this.stopping = true;
    const order = [...this.members.filter((m) => m.name === "gateway"), ...this.members.filter((m) => m.name.startsWith("node-")), ...this.members.filter((m) => m.name === "scheduler")];
    for (const m of order) {
      const p = m.proc;
      if (!p || p.exitCode !== null || p.signalCode !== null) continue;
      p.kill("SIGTERM");
      if ((await orLate(p.exited, this.o.stopTimeoutMs, "late")) === "late") {
        this.log.warn({ member: m.name, pid: p.pid, timeoutMs: this.o.stopTimeoutMs }, "member did not stop in time; killed");
        p.kill("SIGKILL");
        await p.exited;
      }
    }
    this.log.info("cluster stopped");
  }
}
