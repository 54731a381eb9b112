/**
 * A world for end-to-end tests: a private network namespace (so the node's host networking —
 * iptables chains, ip_forward, DNS proxy, slot veths — never touches the machine's own), a fresh
 * data dir whose `templates/` is the test cache built by scripts/test.sh, the real node started
 * with `agentenv server` inside that namespace on 127.0.0.1, and clients (the e2b SDK) run
 * inside it too. `dispose()` stops everything and removes what the node may have left.
 */
import { netLockPath } from "../../src/node/lock.ts";
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { afterAll, beforeAll } from "bun:test";
import { loadConfig } from "../../src/config/index.ts";
import { resolveKernelPath } from "../../src/vmm/index.ts";

/** Where scripts/test.sh builds the guest kernel and the base template. */
export const TEST_HOME = process.env.AENV_TEST_HOME_PATH ?? "/var/lib/agentenv-test";
const ROOT = join(import.meta.dir, "../..");
const MAIN = join(ROOT, "src/cli/main.ts");
const PORT = 18000;

function sh(cmd: string[]): string {
  const r = Bun.spawnSync(cmd, { stderr: "pipe", stdout: "pipe" });
  if (r.exitCode !== 0) throw new Error(`${cmd.join(" ")} failed: ${r.stderr.toString()}`);
  return r.stdout.toString();
}

/** Whether this machine can run the VM end-to-end tests (kernel + base template built, root, QEMU). */
export function vmPrerequisites(): string | null {
  if (process.getuid?.() !== 0) return "needs root";
  if (!Bun.which("qemu-system-x86_64")) return "qemu-system-x86_64 missing";
  if (!existsSync(join(TEST_HOME, "templates/base/manifest.json"))) return `base template missing in ${TEST_HOME}`;
  try {
    resolveKernelPath(loadConfig({ env: { AENV_HOME_PATH: TEST_HOME } }));
  } catch (e) {
    return (e as Error).message;
  }
  return null;
}

export class NodeWorld {
  readonly prefix: string;
  readonly ns: string;
  readonly home: string;
  readonly memDir: string;
  readonly url = `http://127.0.0.1:${PORT}`;
  apiKey = "";
  node?: Subprocess<"ignore", "pipe", "pipe">;
  private nodeErr = "";
  /** Everything the node wrote to stderr (its pino log), every start of it. */
  private nodeErrAll = "";
  /** When set, every start's stderr (the node's pino log) is appended to this file as it comes (a bench keeps it for diagnosis). */
  logFile: string | undefined;

  constructor() {
    const tag = Math.random().toString(36).slice(2, 6).replace(/[^a-z0-9]/g, "a");
    this.prefix = `ae${tag}-`;
    this.ns = `${this.prefix}node`;
    this.home = mkdtempSync("/tmp/aenv-e2e-");
    this.memDir = mkdtempSync("/dev/shm/aenv-e2e-");
    mkdirSync(join(this.home, "run"));
    // templates and the tools drive VMs boot through come from the test home (scripts/test.sh builds them)
    for (const d of ["templates", "tools"]) symlinkSync(join(TEST_HOME, d), join(this.home, d));
    seedSnapshots(join(TEST_HOME, "snapshots"), join(this.home, "snapshots"));
    sh(["ip", "netns", "add", this.ns]);
    sh(["ip", "-n", this.ns, "link", "set", "lo", "up"]);
  }

  /** Environment of the node process. */
  env(extra: Record<string, string> = {}): Record<string, string> {
    return {
      ...(process.env as Record<string, string>),
      AENV_HOME_PATH: this.home,
      AENV_RUNTIME_PATH: join(this.home, "run"),
      AENV_API_ADDR: `127.0.0.1:${PORT}`,
      AENV_LOG_LEVEL: "warn",
      AENV__kernel__path: resolveKernelPath(loadConfig({ env: { AENV_HOME_PATH: TEST_HOME } })),
      // pinned: a firecracker binary on PATH must not switch these tests to another VMM
      AENV__vm__driver: "qemu",
      AENV__qemu__memory_dir: this.memDir,
      AENV__network__name_prefix: this.prefix,
      AENV__pool__low_watermark: "1",
      AENV__pool__high_watermark: "2",
      // no restore pool unless a test asks for one (its paused VMs would be QEMU processes and
      // slots the other tests' counts do not expect; test/e2e/restore-pool.test.ts has one)
      AENV__pool__restore__low_watermark: "0",
      AENV__pool__restore__high_watermark: "0",
      ...extra,
    };
  }

  /** Start `agentenv server` in the namespace; resolves once it printed its URL and key. */
  async start(extra: Record<string, string> = {}): Promise<void> {
    const p = Bun.spawn(["nsenter", `--net=/run/netns/${this.ns}`, "--", process.execPath, MAIN, "server"], {
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
      env: this.env(extra),
    });
    this.node = p;
    this.nodeErr = "";
    void (async () => {
      for await (const c of p.stderr) {
        const text = new TextDecoder().decode(c);
        this.nodeErr = (this.nodeErr + text).slice(-20_000);
        this.nodeErrAll += text;
        if (this.logFile) appendFileSync(this.logFile, text);
      }
    })();
    const reader = p.stdout.getReader();
    let out = "";
    const deadline = Date.now() + 60_000;
    while (!/API key \(\w+\): (\S+)/.test(out)) {
      const r = await Promise.race([reader.read(), Bun.sleep(Math.max(0, deadline - Date.now())).then(() => null)]);
      if (!r || r.done) throw new Error(`node did not start: ${out}\n${this.nodeErr}`);
      out += new TextDecoder().decode(r.value);
    }
    reader.releaseLock();
    void (async () => {
      for await (const _ of p.stdout) {
        // drain
      }
    })();
    this.apiKey = /API key \(\w+\): (\S+)/.exec(out)![1]!;
    if (!out.includes(`listening on ${this.url}`)) throw new Error(`unexpected banner: ${out}`);
  }

  /** The node's whole stderr since the world was made (its log lines; for assertions over all of them). */
  get fullLog(): string {
    return this.nodeErrAll;
  }

  /** The node's stderr so far (for failure messages). */
  get log(): string {
    return this.nodeErr;
  }

  /** SIGKILL the node (a crash); VMs and slots it started stay behind. */
  async crash(): Promise<void> {
    this.node?.kill("SIGKILL");
    await this.node?.exited;
    this.node = undefined;
  }

  /** SIGTERM the node and wait for a clean exit; returns its exit code. */
  async stop(): Promise<number | null> {
    if (!this.node) return null;
    this.node.kill("SIGTERM");
    const code = await this.node.exited;
    this.node = undefined;
    return code;
  }

  /**
   * Run a client script (bun) inside the namespace with the SDK pointed at the node; the script
   * prints one JSON line last. Throws with its output when it fails.
   */
  async client<T = any>(script: string, args: string[] = [], timeoutMs = 240_000): Promise<T> {
    const p = Bun.spawn(["nsenter", `--net=/run/netns/${this.ns}`, "--", process.execPath, join(import.meta.dir, "fixtures", script), ...args], {
      stdout: "pipe",
      stderr: "pipe",
      env: {
        ...(process.env as Record<string, string>),
        E2B_API_URL: this.url,
        E2B_SANDBOX_URL: this.url,
        E2B_API_KEY: this.apiKey,
        AENV_API_KEY: this.apiKey,
        AENV_API_URL: this.url,
        AENV_HOME_PATH: this.home,
      },
    });
    const timer = setTimeout(() => p.kill("SIGKILL"), timeoutMs);
    const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
    clearTimeout(timer);
    if (code !== 0) {
      throw new Error(`client ${script} exited ${code}\nstdout: ${out}\nstderr: ${err}\nnode log: ${this.nodeErr.slice(-4000)}\n${this.consoles()}`);
    }
    const last = out.trim().split("\n").pop()!;
    return JSON.parse(last) as T;
  }

  /** Tails of the guest consoles of every sandbox dir (for failure messages). */
  consoles(): string {
    const dir = join(this.home, "sandboxes");
    if (!existsSync(dir)) return "";
    return readdirSync(dir)
      .map((id) => {
        try {
          return `--- console of ${id}:\n${readFileSync(join(dir, id, "console.log"), "utf8").slice(-3000)}`;
        } catch {
          return "";
        }
      })
      .join("\n");
  }

  /** Named network namespaces of this world's slots. */
  slotNamespaces(): string[] {
    return existsSync("/run/netns") ? readdirSync("/run/netns").filter((n) => n.startsWith(this.prefix) && n !== this.ns && n !== this.inetNs) : [];
  }

  /** The namespace standing for the internet (`inet()`), once made. */
  inetNs: string | undefined;
  private inetServer: Subprocess | undefined;

  /**
   * An "internet" for the sandboxes, inside test namespaces only: a namespace joined to the
   * node's by a veth (169.254.200.1 on the node's side) whose addresses 169.254.200.2 and .3
   * greet every TCP connection on port 8080 with "hello <ip>:8080" (test/net/fixtures/server.ts).
   * 169.254.0.0/16 is always denied to sandboxes but for their allowOut entries.
   */
  async inet(): Promise<void> {
    const inet = (this.inetNs = `${this.prefix}inet`);
    sh(["ip", "netns", "add", inet]);
    sh(["ip", "-n", this.ns, "link", "add", "inet0", "type", "veth", "peer", "name", "eth0", "netns", inet]);
    sh(["ip", "-n", this.ns, "addr", "add", "169.254.200.1/24", "dev", "inet0"]);
    sh(["ip", "-n", this.ns, "link", "set", "inet0", "up"]);
    for (const a of ["169.254.200.2/24", "169.254.200.3/24"]) sh(["ip", "-n", inet, "addr", "add", a, "dev", "eth0"]);
    sh(["ip", "-n", inet, "link", "set", "eth0", "up"]);
    sh(["ip", "-n", inet, "link", "set", "lo", "up"]);
    const spec = { tcp: [["169.254.200.2", 8080], ["169.254.200.3", 8080]] };
    const p = Bun.spawn(["nsenter", `--net=/run/netns/${inet}`, "--", process.execPath, join(ROOT, "test/net/fixtures/server.ts"), JSON.stringify(spec)], { stdout: "pipe", stderr: "inherit" });
    this.inetServer = p;
    const { value } = await p.stdout.getReader().read();
    if (!new TextDecoder().decode(value).includes("ready")) throw new Error("the inet servers did not start");
  }

  /**
   * Start a client script (as `client`) and leave it running: its stdout lines come one by one
   * from `lines`; the caller waits for its exit (`proc.exited`) or kills it.
   */
  spawnClient(script: string, args: string[] = []): { proc: Subprocess<"ignore", "pipe", "pipe">; lines: AsyncIterator<string> } {
    const proc = Bun.spawn(["nsenter", `--net=/run/netns/${this.ns}`, "--", process.execPath, join(import.meta.dir, "fixtures", script), ...args], {
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
      env: { ...(process.env as Record<string, string>), E2B_API_URL: this.url, E2B_SANDBOX_URL: this.url, E2B_API_KEY: this.apiKey, AENV_HOME_PATH: this.home },
    });
    async function* split(): AsyncGenerator<string> {
      let buf = "";
      for await (const c of proc.stdout) {
        buf += new TextDecoder().decode(c);
        for (let i = buf.indexOf("\n"); i >= 0; i = buf.indexOf("\n")) {
          yield buf.slice(0, i);
          buf = buf.slice(i + 1);
        }
      }
      if (buf) yield buf;
    }
    return { proc, lines: split() };
  }

  /** Stop the node, remove leftovers (slots, VMM processes, files), delete the namespace. */
  async dispose(): Promise<void> {
    await this.stop().catch(() => {});
    // a VMM still alive here is a bug the test reports; make sure it does not outlive us
    for (const pid of qemuPidsUnder(this.home, this.memDir)) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    for (const n of this.slotNamespaces()) Bun.spawnSync(["ip", "netns", "del", n]);
    this.inetServer?.kill("SIGKILL");
    if (this.inetNs) Bun.spawnSync(["ip", "netns", "del", this.inetNs]);
    Bun.spawnSync(["ip", "netns", "del", this.ns]);
    // a node that died (a test's failure) leaves its disk daemon and FUSE mounts: remove them
    // first, or the recursive delete below walks into a live mount
    for (const pid of pidsNaming(this.home)) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
    const mounts = readFileSync("/proc/mounts", "utf8").split("\n").map((l) => l.split(" ")[1] ?? "").filter((m) => m.startsWith(`${this.home}/`));
    for (const m of mounts) Bun.spawnSync(["umount", "-l", m]);
    rmSync(this.home, { recursive: true, force: true });
    rmSync(this.memDir, { recursive: true, force: true });
    rmSync(netLockPath(this.prefix), { force: true }); // the node's host-wide lock file
  }
}

/** pids of processes (other than this one) whose command line names `dir`. */
export function pidsNaming(dir: string): number[] {
  const out: number[] = [];
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(dir)) out.push(Number(pid));
    } catch {
      // gone
    }
  }
  return out;
}

/** pids of `agentenv ublk-daemon` processes whose command line names a directory under `dir`. */
export function diskDaemonsUnder(dir: string): number[] {
  return readdirSync("/proc")
    .filter((p) => /^\d+$/.test(p))
    .filter((p) => {
      try {
        const args = readFileSync(`/proc/${p}/cmdline`, "utf8").split("\0");
        return args.includes("ublk-daemon") && args.some((a) => a.startsWith(`${dir}/`));
      } catch {
        return false;
      }
    })
    .map(Number);
}

/** Manifests of kind `boot` in the world's snapshot repository. */
export function bootManifests(w: NodeWorld): Record<string, any>[] {
  const dir = join(w.home, "snapshots", "manifests");
  return readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .map((f) => JSON.parse(readFileSync(join(dir, f), "utf8")))
    .filter((m) => m.kind === "boot");
}

/** The node's log lines (pino JSON on its stderr, since its last start) whose message is `msg`. */
export function logLines(w: NodeWorld, msg: string): Record<string, any>[] {
  return w.log
    .split("\n")
    .filter((l) => l.includes(`"msg":"${msg}"`))
    .map((l) => JSON.parse(l));
}

/**
 * Give a fresh data dir the committed snapshots of the test home (the base template's snapshot):
 * manifests and layers hard-linked (same filesystem; copied otherwise), tombstoned ones left out.
 */
export function seedSnapshots(from: string, to: string): void {
  for (const d of ["layers", "manifests", "staging"]) mkdirSync(join(to, d), { recursive: true });
  if (!existsSync(join(from, "manifests"))) return;
  const tombstoned = new Set(readdirSync(join(from, "manifests")).filter((f) => f.endsWith(".deleted")).map((f) => f.slice(0, -8)));
  for (const f of readdirSync(join(from, "manifests"))) {
    if (!f.endsWith(".json") || tombstoned.has(f.slice(0, -5))) continue;
    type Ref = { digest: string };
    const m = JSON.parse(readFileSync(join(from, "manifests", f), "utf8")) as { disk: { layers: Ref[] }; memory: { layers: Ref[] } | null; vmState: Ref | null; tools?: Ref };
    for (const l of [...m.disk.layers, ...(m.memory?.layers ?? []), ...(m.vmState ? [m.vmState] : []), ...(m.tools ? [m.tools] : [])]) {
      const hex = l.digest.slice(7);
      if (!existsSync(join(to, "layers", hex))) sh(["cp", "-al", join(from, "layers", hex), join(to, "layers", hex)]);
    }
    sh(["cp", join(from, "manifests", f), join(to, "manifests", f)]);
  }
}

/** pids of QEMU processes whose command line names `dir` (their work dir or RAM file). */
export function qemuPidsUnder(...dirs: string[]): number[] {
  const out: number[] = [];
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    let cmd: string;
    try {
      cmd = require("node:fs").readFileSync(`/proc/${pid}/cmdline`, "utf8");
    } catch {
      continue;
    }
    if (cmd.startsWith("qemu-system") || cmd.includes("/qemu-system")) {
      if (dirs.some((d) => cmd.includes(d))) out.push(Number(pid));
    }
  }
  return out;
}

/**
 * One node shared by all tests of a file: started before them, disposed after them.
 * @param env extra environment of the node (config overrides as AENV__section__key)
 * @returns an accessor for the running node; it throws (failing the test, never skipping it)
 *   when the VM prerequisites are missing.
 */
export function nodeForFile(env: Record<string, string> = {}): () => NodeWorld {
  const missing = vmPrerequisites();
  let world: NodeWorld | undefined;
  beforeAll(async () => {
    if (missing) return;
    world = new NodeWorld();
    await world.start(env);
  }, 90_000);
  afterAll(async () => {
    await world?.dispose();
  }, 60_000);
  return () => {
    if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
    return world!;
  };
}
