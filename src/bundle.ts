/**
 * Worker-thread entry modules. `bun build --compile` embeds only the modules reachable from its
 * entry points, so each worker module is passed to it as an extra entry point (src/template/base.ts,
 * package.json `build`), and is then found under `/$bunfs/root/` + its path relative to `src/` (the
 * common folder of all entry points). From source, the path is the file itself.
 */
import { join } from "node:path";

/** Worker modules, relative to `src/`. */
export const WORKER_ENTRYPOINTS = ["storage/ublk/queue-worker.ts"] as const;

/** The specifier to start worker module `rel` (one of WORKER_ENTRYPOINTS) with `new Worker(...)`. */
export function workerEntry(rel: (typeof WORKER_ENTRYPOINTS)[number]): string {
  return Bun.main.startsWith("/$bunfs/") ? `/$bunfs/root/${rel}` : join(import.meta.dir, rel);
}
