/** The scheduler (`agentenv scheduler`): placement, persisted bindings, node reports. */
export { startScheduler, openStore, type RunningScheduler } from "./server.ts";
export { schedulerConfig, type SchedulerConfig } from "./config.ts";
export { SchedulerCore, type SchedulerCoreOptions } from "./core.ts";
export { SchedulerError, type SchedulerErrorCode } from "./errors.ts";
export { StaticDiscovery, parseNodeEntry } from "./discovery/static.ts";
export { KubernetesDiscovery, nodesFromSlices, type EndpointSlice, type KubernetesOptions } from "./discovery/kubernetes.ts";
export { SqliteStore } from "./store/sqlite.ts";
export { RedisStore } from "./store/redis.ts";
export type { SchedulerStore, RosterChange } from "./store/types.ts";
export type * from "./types.ts";
