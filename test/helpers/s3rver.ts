/**
 * A real S3 server for tests: s3rver (npm, a devDependency) run by Bun as a child process on
 * 127.0.0.1 (or `addr`) with a port the kernel picks, one bucket made at start, its data in a temp dir.
 * `stop()` kills it by pid and removes the data. `netns` runs it inside a network namespace
 * (for a node started in one).
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { waitFor } from "./wait.ts";

const BIN = join(import.meta.dir, "../../node_modules/s3rver/bin/s3rver.js");
/** Credentials s3rver accepts. */
export const S3RVER_KEY = "S3RVER";

/** A running s3rver. */
export class S3rver {
  private constructor(
    private readonly proc: Subprocess<"ignore", "pipe", "pipe">,
    /** Where it keeps objects (`<dir>/<bucket>/<key>._S3rver_object`). */
    readonly dir: string,
    readonly port: number,
    readonly bucket: string,
    readonly addr = "127.0.0.1",
  ) {}

  /** http://<addr>:port */
  get endpoint(): string {
    return `http://${this.addr}:${this.port}`;
  }

  get pid(): number {
    return this.proc.pid;
  }

  /**
   * Start one and wait for its "listening" line (at most `startTimeoutMs`: a server that never
   * says it listens fails the test).
   */
  static async start(opts: { bucket?: string; netns?: string; startTimeoutMs?: number; addr?: string } = {}): Promise<S3rver> {
    const bucket = opts.bucket ?? "snapshots";
    const addr = opts.addr ?? "127.0.0.1";
    const listening = new RegExp(`listening on ${addr.replace(/\./g, "\\.")}:(\\d+)`);
    const dir = mkdtempSync(join(tmpdir(), "s3rver-"));
    const cmd = [process.execPath, BIN, "-d", dir, "-a", addr, "-p", "0", "--no-vhost-buckets", "--configure-bucket", bucket];
    const proc = Bun.spawn(opts.netns ? ["nsenter", `--net=/run/netns/${opts.netns}`, "--", ...cmd] : cmd, { stdin: "ignore", stdout: "pipe", stderr: "pipe" });
    const reader = proc.stdout.getReader();
    let out = "";
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<null>((r) => (timer = setTimeout(() => r(null), opts.startTimeoutMs ?? 30_000)));
    try {
      while (!listening.test(out)) {
        const r = await Promise.race([reader.read(), timeout]);
        if (!r || r.done) throw new Error(`s3rver did not start: ${out}${await new Response(proc.stderr).text().catch(() => "")}`);
        out += new TextDecoder().decode(r.value);
      }
    } catch (e) {
      proc.kill("SIGKILL");
      await proc.exited;
      rmSync(dir, { recursive: true, force: true });
      throw e;
    } finally {
      clearTimeout(timer);
    }
    reader.releaseLock();
    // keep reading its output so a full pipe never blocks it
    void (async () => {
      for await (const _ of proc.stdout) {
        // drain
      }
    })();
    void (async () => {
      for await (const _ of proc.stderr) {
        // drain
      }
    })();
    return new S3rver(proc, dir, Number(listening.exec(out)![1]), bucket, addr);
  }

  /** Path of the file s3rver keeps an object's bytes in. */
  objectPath(key: string): string {
    return join(this.dir, this.bucket, `${key}._S3rver_object`);
  }

  /**
   * Wait until every object s3rver acknowledged is on its disk. s3rver 3.7.1 answers a PUT when
   * it has read the body, while its write of the object file may still run (a GET or HEAD right
   * after can see a short or missing object); an object is complete once its bytes match the md5
   * s3rver recorded. Waits at most `timeoutMs`, then throws.
   */
  async settled(timeoutMs = 10_000): Promise<void> {
    await waitFor("s3rver's objects to be written whole", () => this.pendingObjects().length === 0, { timeoutMs, maxIntervalMs: 5 });
  }

  private pendingObjects(): string[] {
    const out: string[] = [];
    for (const f of new Bun.Glob("**/*._S3rver_object").scanSync({ cwd: this.dir, dot: true })) {
      const path = join(this.dir, f);
      try {
        const md5 = readFileSync(`${path}.md5`, "utf8");
        if (new Bun.CryptoHasher("md5").update(readFileSync(path)).digest("hex") !== md5) out.push(f);
      } catch {
        out.push(f);
      }
    }
    return out;
  }

  /** Kill it (by pid) and remove its data. */
  async stop(): Promise<void> {
    this.proc.kill("SIGKILL");
    await this.proc.exited;
    rmSync(this.dir, { recursive: true, force: true });
  }
}
