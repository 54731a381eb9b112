// One file per owning subsystem (sandboxes.ts, net.ts, ...); re-exported here for drizzle.
export * from "./sandboxes.ts";
export * from "./net.ts";
export * from "./events.ts";
export * from "./secrets.ts";
