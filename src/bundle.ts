/**
 * Worker-thread entry modules. `bun build --compile` embeds only the modules reachable from its
 * entry points (a `new Worker(path)` is not followed), so each worker module is passed to it as an
 * extra entry point: every compile of the binary uses `compileEntrypoints()` (src/tools/build.ts,
 * tests) or names the same files (package.json `build`, kept equal by test/bundle.test.ts). In the
 * binary a worker module is then found under `/$bunfs/root/` + its path relative to `src/` (the
 * common folder of all entry points). From source, the path is the file itself.
 */
import { join } from "node:path";

/** Worker modules, relative to `src/`. */
export const WORKER_ENTRYPOINTS = ["storage/ublk/queue-worker.ts", "storage/fuse/reader-worker.ts", "ffi/pidfd-wait-worker.ts", "ffi/pidfd-watch-worker.ts"] as const;

/** True inside a `bun build --compile` binary. */
export function isCompiled(): boolean {
  return Bun.main.startsWith("/$bunfs/");
}

/** The specifier to start worker module `rel` (one of WORKER_ENTRYPOINTS) with `new Worker(...)`. */
export function workerEntry(rel: (typeof WORKER_ENTRYPOINTS)[number]): string {
  return isCompiled() ? `/$bunfs/root/${rel}` : join(import.meta.dir, rel);
}

/** Absolute source paths to give `bun build --compile`: `src/cli/main.ts` first, then every worker module. */
export function compileEntrypoints(): string[] {
  return [join(import.meta.dir, "cli/main.ts"), ...WORKER_ENTRYPOINTS.map((e) => join(import.meta.dir, e))];
}
