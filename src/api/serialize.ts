/**
 * Sandbox records -> E2B response bodies (`Sandbox`, `SandboxDetail`, `ListedSandbox`).
 */
import type { SandboxRecord, TemplateListing } from "../orchestrator/index.ts";
import { publicState } from "../orchestrator/index.ts";
import { maskNetwork } from "../net/index.ts";

/** E2B's deprecated constant `clientID`. */
export const CLIENT_ID = "6532622b";

const iso = (ms: number) => new Date(ms).toISOString();

/** `Sandbox` (create/connect/resume response). `domain` is the first configured proxy domain. */
export function toSandbox(r: SandboxRecord, domain: string | null) {
  return {
    sandboxID: r.id,
    templateID: r.templateId,
    clientID: CLIENT_ID,
    envdVersion: r.envdVersion,
    ...(r.envdAccessToken ? { envdAccessToken: r.envdAccessToken } : {}),
    trafficAccessToken: r.trafficAccessToken,
    domain,
    ...(r.alias ? { alias: r.alias } : {}),
  };
}

/** `ListedSandbox`. */
export function toListed(r: SandboxRecord) {
  return {
    templateID: r.templateId,
    ...(r.alias ? { alias: r.alias } : {}),
    sandboxID: r.id,
    clientID: CLIENT_ID,
    startedAt: iso(r.startedAt),
    endAt: iso(r.endAt),
    cpuCount: r.cpuCount,
    memoryMB: r.memoryMB,
    diskSizeMB: r.diskSizeMB,
    metadata: r.metadata,
    state: publicState(r.state) ?? "running",
    envdVersion: r.envdVersion,
    volumeMounts: r.volumeMounts.map((m) => ({ name: m.name, path: m.path })),
  };
}

/** `SandboxDetail`. */
export function toDetail(r: SandboxRecord, domain: string | null) {
  return {
    ...toListed(r),
    ...(r.envdAccessToken ? { envdAccessToken: r.envdAccessToken } : {}),
    allowInternetAccess: r.allowInternetAccess,
    domain,
    // rule header values masked, the egress proxy's password left out
    ...(r.network ? { network: maskNetwork(r.network) } : {}),
    lifecycle: { autoResume: r.autoResume, onTimeout: r.autoPause ? ("pause" as const) : ("kill" as const) },
  };
}

/** `Template`. */
export function toTemplate(tpl: TemplateListing) {
  return {
    templateID: tpl.templateID,
    buildID: tpl.buildID,
    cpuCount: tpl.cpuCount,
    memoryMB: tpl.memoryMB,
    diskSizeMB: tpl.diskSizeMB,
    public: true,
    aliases: tpl.aliases,
    names: tpl.aliases.length ? tpl.aliases : [tpl.templateID],
    createdAt: iso(tpl.createdAt),
    updatedAt: iso(tpl.updatedAt),
    createdBy: null,
    lastSpawnedAt: tpl.lastSpawnedAt === null ? null : iso(tpl.lastSpawnedAt),
    spawnCount: tpl.spawnCount,
    buildCount: 1,
    envdVersion: tpl.envdVersion,
    buildStatus: tpl.buildStatus,
  };
}
