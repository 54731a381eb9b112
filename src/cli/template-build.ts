/**
 * The CLI's template build client: the same calls the E2B SDK makes (POST /v3/templates, files
 * upload for each COPY, POST /v2/.../builds, status polled with logsOffset), with build logs
 * streamed to stderr as they come. COPY sources are packed with tar from the context directory;
 * their hash covers the step and every file's path, mode, size and bytes (not owners or times),
 * so unchanged files are not uploaded again and the step stays cached.
 */
import { createHash } from "node:crypto";
import { lstatSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import type { BuildStep } from "../template/index.ts";
import { call, CliError, type Conn } from "./sandbox.ts";

/** A build to run on the node. */
export interface CliBuild {
  /** `name[:tag]`. */
  name: string;
  fromImage?: string;
  fromTemplate?: string;
  /** Registry credentials for `fromImage`. */
  registry?: { username: string; password: string };
  steps: BuildStep[];
  startCmd: string;
  readyCmd: string;
  /** Directory COPY sources are relative to. */
  contextDir: string;
  cpuCount?: number;
  memoryMB?: number;
  force: boolean;
}

/** Hash of a COPY step's files: "COPY src dest", then per file (sorted): path, mode, size, bytes. */
export function filesHash(contextDir: string, src: string, dest: string): string {
  const h = createHash("sha256").update(`COPY ${src} ${dest}`);
  const root = join(contextDir, src.replace(/[*?[].*$/, ""));
  let st;
  try {
    st = lstatSync(root);
  } catch {
    throw new CliError(`COPY ${src}: ${root} does not exist in the context ${contextDir}`);
  }
  const visit = (p: string) => {
    const s = lstatSync(p);
    h.update(relative(contextDir, p)).update(String(s.mode)).update(String(s.size));
    if (s.isSymbolicLink()) h.update(readlinkSync(p));
    else if (s.isFile()) h.update(readFileSync(p));
    else if (s.isDirectory()) for (const e of readdirSync(p).sort()) visit(join(p, e));
  };
  if (st) visit(root);
  return h.digest("hex");
}

/** Pack `src` (relative to the context; a glob part keeps its directory) as a gzip tar. @returns its path. */
function pack(contextDir: string, src: string): { path: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "aenv-copy-"));
  const path = join(dir, "files.tar.gz");
  const base = src.replace(/[*?[].*$/, "").replace(/\/+$/, "") || ".";
  const r = Bun.spawnSync(["tar", "-czf", path, "-C", contextDir, base], { stderr: "pipe" });
  if (r.exitCode !== 0) {
    rmSync(dir, { recursive: true, force: true });
    throw new CliError(`packing ${src} failed: ${r.stderr.toString().trim()}`);
  }
  return { path, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

interface StatusBody {
  status: "waiting" | "building" | "ready" | "error";
  logEntries: { timestamp: string; level: string; message: string; step?: string }[];
  reason?: { message: string; step?: string };
}

/**
 * Run `b` on the node; log lines go to `onLog` as they come.
 * @returns the template and build ids once the build is ready.
 * @throws CliError with the build's reason when it ends in `error`, or for a refused request.
 */
export async function buildOnNode(c: Conn, b: CliBuild, onLog: (line: string) => void): Promise<{ templateID: string; buildID: string }> {
  const reg = (await call(c, "POST", "/v3/templates", { name: b.name, ...(b.cpuCount ? { cpuCount: b.cpuCount } : {}), ...(b.memoryMB ? { memoryMB: b.memoryMB } : {}) })).data as {
    templateID: string;
    buildID: string;
  };
  const copies = b.steps.filter((s) => (s.type === "COPY" || s.type === "ADD") && s.filesHash);
  for (const s of copies) {
    const up = (await call(c, "GET", `/templates/${reg.templateID}/files/${s.filesHash}`)).data as { present: boolean; url: string };
    if (up.present) {
      onLog(`files of COPY ${s.args[0]} already on the node`);
      continue;
    }
    const packed = pack(b.contextDir, s.args[0]!);
    try {
      const size = lstatSync(packed.path).size;
      onLog(`uploading COPY ${s.args[0]} (${(size / 1024).toFixed(1)} KiB)`);
      const r = await fetch(up.url, { method: "PUT", body: Bun.file(packed.path), headers: { "content-length": String(size) } });
      if (!r.ok) throw new CliError(`upload of ${s.args[0]} failed: ${r.status} ${await r.text()}`);
    } finally {
      packed.cleanup();
    }
  }
  await call(c, "POST", `/v2/templates/${reg.templateID}/builds/${reg.buildID}`, {
    ...(b.fromImage ? { fromImage: b.fromImage } : {}),
    ...(b.fromTemplate ? { fromTemplate: b.fromTemplate } : {}),
    ...(b.registry ? { fromImageRegistry: { type: "registry", ...b.registry } } : {}),
    steps: b.steps,
    startCmd: b.startCmd || undefined,
    readyCmd: b.readyCmd || undefined,
    force: b.force,
  });
  let offset = 0;
  for (;;) {
    const st = (await call(c, "GET", `/templates/${reg.templateID}/builds/${reg.buildID}/status?logsOffset=${offset}`)).data as StatusBody;
    offset += st.logEntries.length;
    for (const e of st.logEntries) onLog(`${e.level === "error" ? "ERROR " : ""}${e.message}`);
    if ((st.status === "ready" || st.status === "error") && st.logEntries.length === 0) {
      if (st.status === "error") throw new CliError(`build failed${st.reason?.step ? ` at step ${st.reason.step}` : ""}: ${st.reason?.message ?? "unknown reason"}`);
      return reg;
    }
    if (st.logEntries.length === 0) await Bun.sleep(250);
  }
}
