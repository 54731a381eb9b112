/**
 * The real VM runtime for tests that boot no VM: its network manager is never started and its
 * disk daemon starts on first use only, so templates, snapshots, start-up reaping (and, with
 * `volumes`, the volume content routes) run for real while sandboxes come from elsewhere (a
 * LoopbackRuntime over it). The caller closes it (`close()`, or the node or orchestrator that
 * owns it).
 */
import { join } from "node:path";
import type { Config } from "../../src/config/index.ts";
import type { Db } from "../../src/db/index.ts";
import { netConfigFromConfig, NetworkManager } from "../../src/net/index.ts";
import { openSecrets } from "../../src/secrets/index.ts";
import { orchestratorConfig } from "../../src/orchestrator/index.ts";
import { vmRuntimeOptions, VmRuntime } from "../../src/sandbox/index.ts";
import type { LocalRepository } from "../../src/snapshot/index.ts";
import { diskConfig, DiskService } from "../../src/storage/daemon/index.ts";
import { QemuDriver, qemuOptions } from "../../src/vmm/index.ts";

/**
 * A VmRuntime over `cfg` (home and runtime paths from it) and `db`, with no kernel and no tools
 * drive, and its snapshot repository; `volumes`: with volume support, a small listing limit (100)
 * and a short idle mount (200 ms).
 */
export function idleVmRuntime(cfg: Config, db: Db, o: { volumes?: boolean } = {}): { runtime: VmRuntime; repo: LocalRepository } {
  const disks = new DiskService({ dir: join(cfg.runtime_path, "disk"), config: diskConfig(cfg) });
  const opts = vmRuntimeOptions(cfg, orchestratorConfig(cfg), {
    driver: new QemuDriver(qemuOptions(cfg)),
    // rules' secrets are checked against the node's store, as the real factory wires it
    net: new NetworkManager(netConfigFromConfig(cfg), db, { resolveSecret: (name) => openSecrets(cfg, db).source.resolve(name) }),
    disks,
    kernelPath: () => "/nonexistent",
    toolsImage: () => "/nonexistent",
  });
  const volumes = o.volumes ? { ...opts.volumes!, defaults: { uid: 1000, gid: 1000, fileMode: 0o644, dirMode: 0o755 }, maxListEntries: 100, hostIdleMs: 200, guestOpTimeoutMs: 30_000 } : undefined;
  return { runtime: new VmRuntime({ ...opts, volumes }), repo: opts.snapshots.repo };
}
