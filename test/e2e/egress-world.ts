/**
 * A NodeWorld with an upstream beside it, for the egress tests and bench/egress.ts: a namespace
 * of its own behind a veth (10.201.0.1 on the node's side, 10.201.0.2 on its own) holding an
 * HTTPS server for api.test and other.test (a certificate from a test CA the node trusts through
 * `[network.egress] upstream_ca_path`), a plain HTTP server (fixtures/egress-upstream.ts) and
 * microsocks (SOCKS5, user puser / ppass). `dispose()` removes all of it.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { NodeWorld } from "./world.ts";

/** The upstream's address. */
export const UP = "10.201.0.2";
/** The node's address on the upstream's link. */
export const NODE_SIDE = "10.201.0.1";

/** One request the upstream saw. */
export interface SeenRequest {
  port: number;
  host: string;
  path: string;
  authorization: string | null;
  remote: string;
}

function sh(cmd: string[]): string {
  const r = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`${cmd.join(" ")}: ${r.stderr.toString()}`);
  return r.stdout.toString();
}

export class EgressWorld {
  readonly world = new NodeWorld();
  readonly dir = mkdtempSync("/tmp/aenv-egress-");
  private upNs = "";
  private readonly procs: Subprocess[] = [];

  /** The test CA's certificate file (PEM). */
  get caFile(): string {
    return join(this.dir, "ca.pem");
  }

  /** Requests the upstream has seen, in order. */
  seen(): SeenRequest[] {
    try {
      return readFileSync(join(this.dir, "upstream.log"), "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l));
    } catch {
      return [];
    }
  }

  /** Make the CA, the namespace and the servers, then start the node with `env` besides the egress settings. */
  async start(env: Record<string, string> = {}): Promise<void> {
    const dir = this.dir;
    const o = (args: string[]) => sh(["openssl", ...args]);
    o(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", join(dir, "ca.key"), "-out", this.caFile, "-days", "2", "-subj", "/CN=egress test CA"]);
    o(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", join(dir, "srv.key"), "-out", join(dir, "srv.csr"), "-subj", "/CN=api.test"]);
    writeFileSync(join(dir, "ext"), "subjectAltName=DNS:api.test,DNS:other.test\nextendedKeyUsage=serverAuth\n");
    o(["x509", "-req", "-in", join(dir, "srv.csr"), "-CA", this.caFile, "-CAkey", join(dir, "ca.key"), "-CAcreateserial", "-out", join(dir, "srv.pem"), "-days", "2", "-extfile", join(dir, "ext")]);
    // names outside the node's prefix: its rules match <prefix>+
    const w = this.world;
    const tag = w.prefix.slice(2, 6);
    this.upNs = `eg${tag}up`;
    const [a, b] = [`eg${tag}a`, `eg${tag}b`];
    sh(["ip", "netns", "add", this.upNs]);
    sh(["ip", "link", "add", a, "netns", w.ns, "type", "veth", "peer", "name", b, "netns", this.upNs]);
    sh(["ip", "-n", w.ns, "addr", "add", `${NODE_SIDE}/24`, "dev", a]);
    sh(["ip", "-n", this.upNs, "addr", "add", `${UP}/24`, "dev", b]);
    for (const [ns, l] of [[w.ns, a], [this.upNs, b], [this.upNs, "lo"]] as const) sh(["ip", "-n", ns, "link", "set", l, "up"]);
    const up = Bun.spawn(["ip", "netns", "exec", this.upNs, process.execPath, join(import.meta.dir, "fixtures/egress-upstream.ts"), UP, join(dir, "srv.pem"), join(dir, "srv.key"), join(dir, "upstream.log")], { stdout: "pipe", stderr: "inherit" });
    this.procs.push(up);
    const reader = up.stdout.getReader();
    let text = "";
    while (!text.includes("upstream ready")) {
      const r = await reader.read();
      if (r.done) throw new Error(`upstream did not start: ${text}`);
      text += new TextDecoder().decode(r.value);
    }
    reader.releaseLock();
    this.procs.push(Bun.spawn(["ip", "netns", "exec", this.upNs, "microsocks", "-i", UP, "-p", "1080", "-u", "puser", "-P", "ppass"], { stdout: "ignore", stderr: "ignore" }));
    await w.start({ AENV__network__egress__upstream_ca_path: this.caFile, AENV__network__egress__intercept_ports: "8443", ...env });
  }

  async dispose(): Promise<void> {
    await this.world.dispose();
    for (const p of this.procs) p.kill("SIGKILL");
    await Promise.all(this.procs.map((p) => p.exited));
    if (this.upNs) Bun.spawnSync(["ip", "netns", "del", this.upNs]);
    rmSync(this.dir, { recursive: true, force: true });
  }
}
