/**
 * Runs one template build: base (a pulled image or another template's ready build), then the
 * steps, each one's result a committed overlaybd layer cached under the hash of everything
 * before it (E2B's chaining, ../shared/docs/template-build.md §4: an unchanged prefix is reused,
 * `force` rebuilds from the first forced step on), then the finalize: a fresh VM of the last
 * layer runs the start command, passes the ready command and (when the launcher commits
 * snapshots) becomes the build's snapshot, which sandboxes of the build are restored from. The
 * finalize is cached under the last step's key, both commands and the VM shape while its
 * snapshot is usable, so a fully cached rebuild boots no VM (E2B never caches its finalize).
 * Steps run in ONE build VM booted from the last cached layer; ENV/ARG steps change no disk and
 * make no layer.
 *
 * Semantics chosen where E2B leaves room (documented in docs/snapshots-and-templates.md): RUN
 * runs as the step's user, else the current USER (E2B's `user` by default), with `/bin/sh -c`,
 * cwd = WORKDIR, the accumulated ENV; COPY streams the uploaded archive through a FIFO into tar (never stored in the
 * guest: /tmp is on the disk, which would keep it in the layer), stages it on the root filesystem,
 * strips the glob part of `src`, hard-links (or copies) a
 * file to `dest` (a trailing `/` = into that directory) or merges a directory into `dest`, then
 * chowns what it copied to the step's user (else the current USER) and applies `mode` when given.
 * A relative `dest` or WORKDIR resolves against the current WORKDIR.
 */
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { isAbsolute, join, posix, relative } from "node:path";
import type { AgentEnvError } from "../errors.ts";
import { logger } from "../observability/log.ts";
import type { BuildLogEntry, BuildLogs, LogLevel } from "./build-log.ts";
import type { BuildVm, BuildVmLauncher } from "./build-vm.ts";
import type { BootSpec, BuildReason, TemplateCatalog } from "./catalog.ts";
import { TemplateError, type TemplateErrorCode } from "./errors.ts";
import type { BuildFiles } from "./files.ts";
import { baseKey, hashParts, IGNORED_STEPS, stepKey, SUPPORTED_STEPS, type BuildSpec, type BuildStep } from "./spec.ts";
import { waitReady } from "./ready.ts";
import { FINAL_ENTRY, STEP_ENTRY } from "./records.ts";
import { readManifest } from "./store.ts";
import { writeFileDurable } from "../util/durable.ts";
import { errorMessage } from "../util/error.ts";

/** Process context a step leaves for the next one. */
export interface StepContext {
  envs: Record<string, string>;
  workdir: string;
  user: string;
}

/** A base image ready to boot (what the image puller returns). */
export interface BaseImage {
  /** What its layer is made of: the manifest digest and how the node converted it (cache key). */
  key: string;
  digest: string;
  layerPath: string;
  diskBytes: number;
  env: Record<string, string>;
  workdir: string;
}

/** Tunables of builds (`[template_build]`). Times in ms. */
export interface BuildSettings {
  stepTimeoutMs: number;
  readyTimeoutMs: number;
  readyPollMs: number;
  /** Bound on one run of the ready command. */
  readyProbeTimeoutMs: number;
  /** Characters of a failed command's output kept in the build's reason. */
  errorOutputChars: number;
  bootArgs: string;
}

/** What the builder needs. */
export interface BuilderDeps {
  homePath: string;
  catalog: TemplateCatalog;
  logs: BuildLogs;
  files: BuildFiles;
  vms: BuildVmLauncher;
  pullBase(ref: string, credentials: BuildSpec["credentials"], progress: (line: string) => void, signal: AbortSignal): Promise<BaseImage>;
  settings: BuildSettings;
}

/** A cached step result: the full layer stack after it and the context it leaves. */
interface StepEntry {
  layers: string[];
  context: StepContext;
  diskBytes: number;
}

/** A cached finalize: the ready check passed; `snapshot` is what it committed (when snapshots are on). */
interface FinalEntry {
  ready: true;
  at: string;
  snapshot?: string;
}

/** A failure attributed to a step ("base", "<n>", "finalize"). */
export class StepFailure extends TemplateError {
  constructor(readonly step: string, code: TemplateErrorCode, message: string, details: Record<string, unknown> = {}) {
    super(code, message, { ...details, step });
  }
}

const q = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
const plog = logger("template.build");

/** Expand `$VAR` / `${VAR}` from `envs` (unknown names expand to ""), as a shell would for ENV values. */
export function expandEnv(value: string, envs: Record<string, string>): string {
  return value.replace(/\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))/g, (_, a, b) => envs[a ?? b] ?? "");
}

/**
 * The shell script that extracts a COPY's archive as it streams into the FIFO `fifo` (the host
 * uploads it there through envd) into the directory `stage`: nothing of the archive is stored on
 * the guest's disk (/tmp included: it would end up in the step's layer).
 * The FIFO stays open for reading until the writer is done (fd 3), so neither a tar that stops
 * early (trailing padding, a bad archive) nor a missing tar leaves the upload blocked or cut.
 */
export function extractScript(fifo: string, stage: string, gzip: boolean): string {
  return [`exec 3<${q(fifo)} || exit 1`, `tar -x${gzip ? "z" : ""}f - -C ${q(stage)} <&3`, "rc=$?", "cat <&3 >/dev/null", "exit $rc"].join("\n");
}

/**
 * The shell script that applies a COPY step from the extracted archive in `stage` (see the module
 * doc): files are hard-linked into place where `stage` and the destination share a filesystem
 * (their blocks are written once), copied otherwise; `stage` is removed on every exit.
 */
export function copyScript(stage: string, src: string, dest: string, owner: string, mode: string): string {
  // the part of src before the first path component with a glob character (a glob's matches
  // are merged into dest like a directory's content)
  const parts = src.replace(/^\.\/+/, "").split("/");
  const globAt = parts.findIndex((p) => /[*?[]/.test(p));
  const base = (globAt < 0 ? parts : parts.slice(0, globAt)).filter((p) => p !== "" && p !== ".").join("/");
  return [
    "set -e",
    `u=${q(stage)}`,
    `l=$(mktemp)`,
    `trap 'rm -rf "$u" "$l"' EXIT`,
    `s="$u"/${q(base || ".")}`,
    `d=${q(dest)}`,
    `[ -e "$s" ] || [ -L "$s" ] || { echo "COPY: ${src.replace(/["$`\\]/g, "")} matched nothing in the uploaded files" >&2; exit 1; }`,
    // list of copied paths (relative to the destination) for chown/chmod
    `if [ -d "$s" ] && [ ! -L "$s" ]; then mkdir -p "$d"; (cd "$s" && find . -mindepth 1) > "$l"; cp -alf "$s"/. "$d"/ 2>/dev/null || cp -af "$s"/. "$d"/; t="$d"`,
    `else case "$d" in */) mkdir -p "$d"; t="$d$(basename "$s")" ;; *) mkdir -p "$(dirname "$d")"; t="$d" ;; esac; cp -alf "$s" "$t" 2>/dev/null || cp -af "$s" "$t"; : > "$l"; fi`,
    `chown -h ${q(owner)} "$t"`,
    `while IFS= read -r f; do chown -h ${q(owner)} "$t/$f"; done < "$l"`,
    ...(mode ? [`[ -L "$t" ] || chmod ${q(mode)} "$t"`, `while IFS= read -r f; do [ -L "$t/$f" ] || chmod ${q(mode)} "$t/$f"; done < "$l"`] : []),
  ].join("\n");
}

/** Whether the file at `path` starts with gzip's magic bytes (1f 8b). */
function isGzip(path: string): boolean {
  const fd = openSync(path, "r");
  try {
    const b = Buffer.alloc(2);
    return readSync(fd, b, 0, 2, 0) === 2 && b[0] === 0x1f && b[1] === 0x8b;
  } finally {
    closeSync(fd);
  }
}

/** Builds templates. One instance per node. */
export class TemplateBuilder {
  constructor(private readonly d: BuilderDeps) {
    mkdirSync(this.layerDir, { recursive: true });
    mkdirSync(this.stepDir, { recursive: true });
    mkdirSync(this.snapshotDir, { recursive: true });
  }

  private get layerDir(): string {
    return join(this.d.catalog.dir, "layers");
  }
  private get stepDir(): string {
    return join(this.d.catalog.dir, "steps");
  }
  /** One empty file per snapshot a build of this node committed (named by its id; gc.ts releases them). */
  private get snapshotDir(): string {
    return join(this.d.catalog.dir, "snapshots");
  }

  /**
   * Run build `buildID` of `templateID` to `ready` or `error` (never throws: the outcome is the
   * build's status, reason and log).
   */
  async run(templateID: string, buildID: string, spec: BuildSpec, signal: AbortSignal): Promise<void> {
    const { catalog } = this.d;
    // a log line that cannot be written (ENOSPC) must not end the build or hide its outcome
    let logFailed = false;
    const log = (level: LogLevel, message: string, step?: string) => {
      const e: BuildLogEntry = { timestamp: new Date().toISOString(), level, message, ...(step ? { step } : {}) };
      try {
        this.d.logs.append(buildID, [e]);
      } catch (err) {
        if (!logFailed) plog.error({ buildID, err }, "build log write failed; later lines are lost");
        logFailed = true;
      }
    };
    let vm: BuildVm | undefined;
    const t0 = performance.now();
    try {
      const { build } = catalog.build(templateID, buildID);
      catalog.setStatus(templateID, buildID, "building");
      const n = spec.steps.length;
      spec.steps.forEach((s, i) => {
        if (!SUPPORTED_STEPS.has(s.type) && !IGNORED_STEPS.has(s.type)) {
          throw new StepFailure(String(i + 1), "template.unsupported_step", `step ${i + 1}: ${s.type} is not supported (supported: ${[...SUPPORTED_STEPS].join(", ")}; ignored: ${[...IGNORED_STEPS].join(", ")})`, { type: s.type });
        }
        if ((s.type === "COPY" || s.type === "ADD") && (!s.filesHash || s.args.length < 2)) {
          throw new StepFailure(String(i + 1), "template.bad_request", `step ${i + 1}: ${s.type} needs src, dest and filesHash`, {});
        }
        if ((s.type === "COPY" || s.type === "ADD") && !this.d.files.has(s.filesHash!)) {
          throw new StepFailure(String(i + 1), "template.files_missing", `step ${i + 1}: ${s.type} ${s.args[0]}: the files (hash ${s.filesHash}) were never uploaded`, { filesHash: s.filesHash });
        }
      });

      // base
      let base: StepEntry;
      let key: string;
      if (spec.fromTemplate) {
        log("info", `[base] FROM TEMPLATE ${spec.fromTemplate}`, "base");
        // a Dockerfile's FROM that named a template of this node: say how to get the image instead
        if (spec.from) log("info", `[base] ${spec.from} is a template of this node (FROM docker.io/library/${spec.from} names the registry image)`, "base");
        let parent;
        try {
          parent = catalog.readyBuild(spec.fromTemplate);
        } catch (e) {
          throw new StepFailure("base", (e as TemplateError).code ?? "template.not_found", `base template: ${errorMessage(e)}`);
        }
        const boot = parent.build.boot ?? this.legacyBoot(parent.template.templateID);
        base = { layers: boot.layers, context: { envs: boot.envs, workdir: boot.workdir, user: boot.user }, diskBytes: boot.diskBytes };
        key = baseKey({ templateBuildID: parent.build.buildID });
      } else {
        const ref = spec.fromImage!;
        log("info", `[base] FROM ${ref}`, "base");
        let img: BaseImage;
        try {
          img = await this.d.pullBase(ref, spec.credentials, (line) => log("info", line, "base"), signal);
        } catch (e) {
          // the image's own code (image.not_found, image.auth, ...) goes into the build's reason
          throw new StepFailure("base", "template.build_failed", `base image ${ref}: ${errorMessage(e)}`, { cause: (e as AgentEnvError).code ?? "template.build_failed" });
        }
        const workdir = img.workdir && img.workdir !== "/" ? img.workdir : "/home/user";
        base = { layers: [relative(this.d.homePath, img.layerPath)], context: { envs: img.env, workdir, user: "user" }, diskBytes: img.diskBytes };
        key = baseKey({ image: img.key });
      }

      // steps: find the cached prefix
      const keys: string[] = [];
      for (const s of spec.steps) keys.push((key = stepKey(key, s)));
      const firstForced = spec.force ? 0 : spec.steps.findIndex((s) => s.force);
      let state = base;
      let i = 0;
      for (; i < n && (firstForced < 0 || i < firstForced); i++) {
        const hit = this.readEntry(keys[i]!);
        if (!hit) break;
        state = hit;
        log("info", `CACHED [builder ${i + 1}/${n}] ${describe(spec.steps[i]!)} [${keys[i]!.slice(0, 12)}]`, String(i + 1));
      }
      for (; i < n; i++) {
        const step = spec.steps[i]!;
        const label = String(i + 1);
        log("info", `[builder ${i + 1}/${n}] ${describe(step)} [${keys[i]!.slice(0, 12)}]`, label);
        const needsVm = !(step.type === "ENV" || step.type === "ARG" || IGNORED_STEPS.has(step.type));
        try {
          if (needsVm && !vm) {
            log("info", `booting the build VM (${build.cpuCount} vCPU, ${build.memoryMB} MiB)`, label);
            vm = await this.d.vms.boot({ id: buildID, layers: this.abs(state.layers), diskBytes: state.diskBytes, bootArgs: this.d.settings.bootArgs, cpuCount: build.cpuCount, memoryMB: build.memoryMB, signal });
          }
          const context = await this.apply(vm, step, state.context, label, log);
          let layers = state.layers;
          if (needsVm) {
            // a fresh name per build: a forced rebuild must not replace a layer older templates stack on
            const out = join(this.layerDir, `${keys[i]}.${buildID.slice(0, 8)}.layer`);
            const size = await vm!.checkpoint(out, this.abs(state.layers));
            layers = [...state.layers, relative(this.d.homePath, out)];
            log("debug", `layer ${keys[i]!.slice(0, 12)}: ${size} bytes`, label);
          }
          state = { layers, context, diskBytes: state.diskBytes };
        } catch (e) {
          if (e instanceof StepFailure) throw e;
          throw new StepFailure(label, "template.build_failed", `step ${label}: ${errorMessage(e)}`);
        }
        this.writeEntry(keys[i]!, state);
      }

      // finalize: in a fresh VM booted from the last layer (its memory holds nothing of the
      // steps), the start command runs and the ready command passes; then, when the launcher
      // commits snapshots, the running VM becomes the build's snapshot and sandboxes are restores
      // of it (the start command already running). The outcome is cached like a step, under the
      // last step's key, both commands and the VM's shape (a snapshot keeps vCPUs and memory).
      const { startCmd } = spec;
      const readyCmd = spec.readyCmd;
      const snapshots = this.d.vms.snapshotUsable !== undefined;
      const finalKey = snapshots ? hashParts(key, "finalize-snapshot", startCmd, readyCmd, String(build.cpuCount), String(build.memoryMB)) : hashParts(key, "finalize", startCmd, readyCmd);
      const finalPath = join(this.stepDir, `${finalKey}.json`);
      const cached = firstForced < 0 ? this.readFinal(finalPath) : undefined;
      let snapshot: string | undefined;
      if ((startCmd || readyCmd || snapshots) && cached && (!snapshots || (cached.snapshot !== undefined && this.d.vms.snapshotUsable!(cached.snapshot)))) {
        snapshot = cached.snapshot;
        touch(finalPath);
        log("info", `CACHED [finalize] START ${startCmd || "-"} READY ${readyCmd || "-"}${snapshot ? ` SNAPSHOT ${snapshot}` : ""}`, "finalize");
      } else if (startCmd || readyCmd || snapshots) {
        try {
          if (snapshots && vm) {
            await vm.stop();
            vm = undefined;
          }
          if (!vm) {
            log("info", `booting the build VM for the start command${snapshots ? " and the snapshot" : ""}`, "finalize");
            vm = await this.d.vms.boot({ id: buildID, layers: this.abs(state.layers), diskBytes: state.diskBytes, bootArgs: this.d.settings.bootArgs, cpuCount: build.cpuCount, memoryMB: build.memoryMB, signal });
          }
          await this.checkReady(vm, startCmd, readyCmd, state.context, log, signal);
          if (snapshots) {
            if (!vm.commitSnapshot) throw new TemplateError("template.build_failed", "the build VM cannot commit snapshots");
            const r = await vm.commitSnapshot({ templateID, buildID, record: (id) => writeFileSync(join(this.snapshotDir, id), "") });
            snapshot = r.snapshotId;
            log("info", `[finalize] SNAPSHOT ${snapshot} committed (memory ${(r.memoryBytes / 1048576).toFixed(1)} MiB)`, "finalize");
          }
        } catch (e) {
          if (e instanceof StepFailure) throw e;
          throw new StepFailure("finalize", "template.build_failed", `finalize: ${errorMessage(e)}`);
        }
        writeFileSync(finalPath, JSON.stringify({ ready: true, at: new Date().toISOString(), ...(snapshot ? { snapshot } : {}) } satisfies FinalEntry));
      }
      const boot: BootSpec = {
        layers: state.layers,
        bootArgs: this.d.settings.bootArgs,
        diskBytes: state.diskBytes,
        envs: state.context.envs,
        workdir: state.context.workdir,
        user: state.context.user,
        startCmd,
        readyCmd,
        ...(snapshot ? { snapshot } : {}),
      };
      await vm?.stop();
      vm = undefined;
      log("info", `build ready in ${((performance.now() - t0) / 1000).toFixed(1)} s: ${state.layers.length} layers`, "finalize");
      catalog.setStatus(templateID, buildID, "ready", { boot, diskSizeMB: Math.floor(state.diskBytes / 1048576) });
    } catch (e) {
      await vm?.stop();
      const step = e instanceof StepFailure ? e.step : undefined;
      const message = signal.aborted && !(e instanceof StepFailure) ? `build cancelled: ${errorMessage(e)}` : errorMessage(e);
      const code = e instanceof StepFailure ? String(e.details.cause ?? e.code) : ((e as AgentEnvError).code ?? "template.build_failed");
      log("error", message, step);
      const reason: BuildReason = { message, ...(step ? { step } : {}), code };
      // may throw (ENOSPC): the record is changed in memory first, the service logs the rest
      catalog.setStatus(templateID, buildID, "error", { reason });
    }
  }

  /** Apply one step; returns the context after it. @throws StepFailure. */
  private async apply(vm: BuildVm | undefined, step: BuildStep, ctx: StepContext, label: string, log: (l: LogLevel, m: string, s?: string) => void): Promise<StepContext> {
    const out = (_: string, text: string) => {
      for (const line of text.split("\n")) if (line.trim()) log("info", line, label);
    };
    const tail = (o: string) => o.trim().slice(-this.d.settings.errorOutputChars);
    const runRoot = async (script: string, what: string) => {
      const r = await vm!.run({ script, user: "root", cwd: "/", envs: ctx.envs, timeoutMs: this.d.settings.stepTimeoutMs, onOutput: out });
      if (r.exitCode !== 0) throw new StepFailure(label, "template.step_failed", `step ${label}: ${what} failed with exit code ${r.exitCode}: ${tail(r.output)}`, { exitCode: r.exitCode });
    };
    const resolve = (p: string) => (p.startsWith("/") ? posix.normalize(p) : posix.join(ctx.workdir, p));
    switch (step.type) {
      case "RUN": {
        const [cmd = "", user] = step.args;
        const r = await vm!.run({ script: cmd, user: user || ctx.user, cwd: ctx.workdir, envs: ctx.envs, timeoutMs: this.d.settings.stepTimeoutMs, onOutput: out });
        if (r.exitCode !== 0) {
          throw new StepFailure(label, "template.step_failed", `step ${label}: RUN ${cmd.slice(0, 200)} failed with exit code ${r.exitCode}: ${tail(r.output)}`, { exitCode: r.exitCode });
        }
        return ctx;
      }
      case "COPY":
      case "ADD": {
        const [src = "", destRaw = "", user, mode] = step.args;
        const archive = this.d.files.path(step.filesHash!);
        // staged on the root filesystem (a hard link puts each file in place), streamed through a FIFO in /run
        const id = step.filesHash!.slice(0, 16);
        const fifo = `/run/aenv-copy-${id}.fifo`;
        const stage = `/.aenv-copy-${id}`;
        await runRoot(`rm -rf ${q(stage)} ${q(fifo)} && mkfifo -m 600 ${q(fifo)} && mkdir -m 700 ${q(stage)}`, `${step.type} ${src}: staging`);
        const extract = await vm!.spawn({ script: extractScript(fifo, stage, isGzip(archive)), user: "root", cwd: "/", envs: ctx.envs });
        const [up, x] = await Promise.allSettled([vm!.upload(archive, fifo), extract.done]);
        if (x.status === "rejected") throw x.reason;
        if (x.value.exitCode !== 0) throw new StepFailure(label, "template.step_failed", `step ${label}: ${step.type} ${src}: the uploaded files do not unpack (exit code ${x.value.exitCode}): ${tail(x.value.output)}`, { exitCode: x.value.exitCode });
        if (up.status === "rejected") throw up.reason;
        const dest = resolve(destRaw) + (destRaw.endsWith("/") && destRaw !== "/" ? "/" : "");
        await runRoot(`${copyScript(stage, src, dest, user || ctx.user, mode ?? "")}\nrm -f ${q(fifo)}`, `${step.type} ${src} ${destRaw}`);
        return ctx;
      }
      case "ENV":
      case "ARG": {
        const envs = { ...ctx.envs };
        const a = step.args;
        if (step.type === "ARG" && a.length === 1) {
          if (!a[0]!.includes("=")) return ctx;
          const [k, ...v] = a[0]!.split("=");
          envs[k!] = expandEnv(v.join("="), envs);
        } else {
          if (a.length % 2 !== 0) throw new StepFailure(label, "template.bad_request", `step ${label}: ${step.type} needs key/value pairs, got ${a.length} args`);
          for (let j = 0; j < a.length; j += 2) envs[a[j]!] = expandEnv(a[j + 1]!, envs);
        }
        return { ...ctx, envs };
      }
      case "WORKDIR": {
        const dir = resolve(step.args[0] ?? "");
        await runRoot(`mkdir -p ${q(dir)} && chown ${q(ctx.user)} ${q(dir)} 2>/dev/null || mkdir -p ${q(dir)}`, `WORKDIR ${dir}`);
        return { ...ctx, workdir: dir };
      }
      case "USER": {
        const user = step.args[0] ?? "";
        if (!/^[a-z_][a-z0-9_-]*$/i.test(user) && !/^\d+$/.test(user)) throw new StepFailure(label, "template.bad_request", `step ${label}: invalid user ${JSON.stringify(user)}`);
        await runRoot(`id -u ${q(user)} >/dev/null 2>&1 || useradd -m -s /bin/sh ${q(user)} 2>/dev/null || adduser -D ${q(user)}`, `USER ${user}`);
        return { ...ctx, user };
      }
      default:
        return ctx; // EXPOSE, LABEL, ...: metadata only
    }
  }

  /** Start `startCmd` (if any) and poll `readyCmd` until it exits 0. @throws StepFailure "finalize". */
  private async checkReady(vm: BuildVm, startCmd: string, readyCmd: string, ctx: StepContext, log: (l: LogLevel, m: string, s?: string) => void, signal: AbortSignal): Promise<void> {
    const base = { user: ctx.user, cwd: ctx.workdir, envs: ctx.envs };
    let exited: { exitCode: number; output: string } | undefined;
    if (startCmd) {
      log("info", `[finalize] START ${startCmd}`, "finalize");
      const started = await vm.spawn({ script: startCmd, ...base, onOutput: (_, t) => t.split("\n").forEach((l) => l.trim() && log("info", l, "finalize")) });
      // the stream breaks when the VM stops at the end of the build: nothing to report then
      void started.done.then(
        (r) => (exited = r),
        () => {},
      );
    }
    if (!readyCmd) return;
    log("info", `[finalize] READY ${readyCmd}`, "finalize");
    const { settings } = this.d;
    const r = await waitReady({
      readyCmd,
      run: (script, timeoutMs) => vm.run({ script, ...base, timeoutMs, probe: true }),
      startFailure: () => (exited && exited.exitCode !== 0 ? `start command exited with code ${exited.exitCode} before it was ready: ${exited.output.trim().slice(-settings.errorOutputChars)}` : null),
      timeoutMs: settings.readyTimeoutMs,
      pollMs: settings.readyPollMs,
      probeTimeoutMs: settings.readyProbeTimeoutMs,
      signal,
    });
    if (r.ok) return;
    if (r.startFailure) throw new StepFailure("finalize", "template.step_failed", r.startFailure);
    throw new StepFailure("finalize", "template.ready_timeout", `ready command ${JSON.stringify(readyCmd)} did not succeed within ${settings.readyTimeoutMs} ms${r.lastOutput ? `: ${r.lastOutput.slice(-500)}` : ""}`);
  }

  private abs(layers: string[]): string[] {
    return layers.map((l) => (isAbsolute(l) ? l : join(this.d.homePath, l)));
  }

  /** Boot spec of a `build-base` template (no catalog record). */
  private legacyBoot(name: string): BootSpec {
    const m = readManifest(this.d.homePath, name);
    if (m.layers.length === 0) throw new StepFailure("base", "template.not_ready", `template ${name} has no overlaybd layer to build on`);
    return { layers: m.layers.map((l) => join("templates", name, l)), bootArgs: m.bootArgs, diskBytes: m.diskBytes, envs: {}, workdir: "/home/user", user: "user", startCmd: "", readyCmd: "" };
  }

  private readEntry(key: string): StepEntry | undefined {
    const p = join(this.stepDir, `${key}.json`);
    if (!existsSync(p)) return undefined;
    try {
      const r = STEP_ENTRY.parse(readFileSync(p, "utf8"));
      if (!r.ok) return undefined; // another version's entry, or damaged: a miss
      const e: StepEntry = r.value;
      // a cache entry whose layers were removed is a miss
      if (!this.abs(e.layers).every((l) => existsSync(l))) return undefined;
      touch(p); // newest use first when the cache is trimmed (gc.ts)
      return e;
    } catch {
      return undefined;
    }
  }

  /** The cached outcome of a finalize, or undefined (none, unreadable). */
  private readFinal(p: string): FinalEntry | undefined {
    try {
      const r = FINAL_ENTRY.parse(readFileSync(p, "utf8"));
      return r.ok ? r.value : undefined;
    } catch {
      return undefined;
    }
  }

  private writeEntry(key: string, e: StepEntry): void {
    const p = join(this.stepDir, `${key}.json`);
    writeFileDurable(p, JSON.stringify(e));
  }

  /** Remove temporary files a crashed build left in the layer cache. */
  reapLeftovers(): void {
    for (const dir of [this.layerDir, this.stepDir]) {
      for (const f of readdirSync(dir)) if (f.endsWith(".tmp") || f.endsWith(".partial")) rmSync(join(dir, f), { force: true });
    }
  }
}

/** Set a file's times to now (a cache entry's last use). @returns true. */
function touch(p: string): true {
  const now = new Date();
  utimesSync(p, now, now);
  return true;
}

/** One-line description of a step for the log. */
function describe(s: BuildStep): string {
  switch (s.type) {
    case "RUN":
      return `RUN ${s.args[0] ?? ""}${s.args[1] ? ` (as ${s.args[1]})` : ""}`;
    case "COPY":
    case "ADD":
      return `${s.type} ${s.args[0]} ${s.args[1]}`;
    case "ENV":
    case "ARG": {
      const pairs: string[] = [];
      for (let i = 0; i < s.args.length; i += 2) pairs.push(`${s.args[i]}=${s.args[i + 1] ?? ""}`);
      return `${s.type} ${pairs.join(" ")}`;
    }
    default:
      return `${s.type} ${s.args.join(" ")}`;
  }
}
