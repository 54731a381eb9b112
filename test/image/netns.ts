/**
 * Network namespaces for image-pull tests that need addresses other than loopback (TLS that is
 * verified, a registry reachable only through a proxy): namespaces with `lo` up and extra
 * addresses on it, veth pairs between them, and a pull run inside one of them
 * (./fixtures/pull-in-netns.ts through `ip netns exec`). Everything is removed by `dispose()`.
 */
import { join } from "node:path";

function sh(cmd: string[]): string {
  const r = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`${cmd.join(" ")} failed: ${r.stderr.toString()}`);
  return r.stdout.toString();
}

/** What a pull inside a namespace printed: its outcome, progress lines and the process's whole stderr (pino log lines). */
export interface NetnsPull {
  ok: boolean;
  digest?: string;
  error?: { code: string; message: string; details: Record<string, unknown> };
  progress: string[];
  stderr: string;
}

/** Namespaces made by one test file. */
export class TestNet {
  private readonly made: string[] = [];
  readonly tag = Math.random().toString(36).slice(2, 7).replace(/[^a-z0-9]/g, "x");

  /** A namespace `aeimg<tag><suffix>` with lo up and `addrs` (CIDRs) on lo. */
  netns(suffix: string, addrs: string[] = []): string {
    const name = `aeimg${this.tag}${suffix}`;
    sh(["ip", "netns", "add", name]);
    this.made.push(name);
    sh(["ip", "-n", name, "link", "set", "lo", "up"]);
    for (const a of addrs) sh(["ip", "-n", name, "addr", "add", a, "dev", "lo"]);
    return name;
  }

  /** A veth pair between namespaces `a` and `b` with addresses `aAddr`, `bAddr` (CIDRs). */
  veth(a: string, aAddr: string, b: string, bAddr: string): void {
    const [ea, eb] = [`v${this.tag}a${this.made.length}`, `v${this.tag}b${this.made.length}`];
    sh(["ip", "link", "add", ea, "netns", a, "type", "veth", "peer", "name", eb, "netns", b]);
    sh(["ip", "-n", a, "addr", "add", aAddr, "dev", ea]);
    sh(["ip", "-n", b, "addr", "add", bAddr, "dev", eb]);
    sh(["ip", "-n", a, "link", "set", ea, "up"]);
    sh(["ip", "-n", b, "link", "set", eb, "up"]);
  }

  /**
   * Pull `ref` inside `ns` with the node's `[image]` settings `image` (a config tree), the
   * credentials a build would bring, and extra environment (proxy variables).
   */
  async pull(ns: string, o: { home: string; ref: string; image?: Record<string, unknown>; credentials?: { username: string; password: string }; env?: Record<string, string> }): Promise<NetnsPull> {
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !/_proxy$/i.test(k)) env[k] = v;
    const p = Bun.spawn(["ip", "netns", "exec", ns, process.execPath, join(import.meta.dir, "fixtures", "pull-in-netns.ts"), JSON.stringify(o)], {
      stdout: "pipe",
      stderr: "pipe",
      env: { ...env, AENV_LOG_LEVEL: "debug", ...o.env },
    });
    const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
    if (code !== 0) throw new Error(`pull-in-netns exited ${code}: ${out}\n${err}`);
    return { ...(JSON.parse(out.trim().split("\n").pop()!) as Omit<NetnsPull, "stderr">), stderr: err };
  }

  /** Remove every namespace made (their veths go with them). */
  dispose(): void {
    for (const n of this.made.splice(0)) Bun.spawnSync(["ip", "netns", "del", n]);
  }
}
