/**
 * The FUSE export: one regular file per connection exposing a BlockImage, served by a process's
 * shared reader threads (`FuseReaderPool`) and a `FuseConnection` per mount on its main thread.
 *
 * - `mountFuse(mountPoint, maxWrite)` → the /dev/fuse fd of a new mount
 * - `new FuseReaderPool({ threads, bufSize })` once per process
 * - `new FuseConnection(pool, { fd, mountPoint, maxWrite, requestTimeoutSec, resume, serve? })`
 */
export { FuseConnection } from "./connection.ts";
export type { DirectFile, DirectFileImage, DirectPlan, FuseConnectionOptions, FuseStats, ServeOptions, SyncReadImage } from "./serve.ts";
export { FuseError } from "./errors.ts";
export { FUSE_FS_NAME, mountFuse } from "./mount.ts";
export { FuseReaderPool, type ReaderPoolOptions } from "./reader-pool.ts";
