/**
 * `agentenv ublk ...`: serve one target as a ublk device in the foreground, inspect the kernel's
 * ublk devices, remove one a dead server left, stop one another process serves. Every command exits non-zero with one line on
 * stderr (`agentenv ublk <cmd>: <reason>`) on failure (2 for bad usage).
 */
import { defineCommand } from "citty";
import { type Config, loadConfig } from "../../config/index.ts";
import { log, logger } from "../../observability/log.ts";
import { checkUblkConfig, ublkConfig, type UblkConfig } from "./config.ts";
import { UblkError } from "./errors.ts";
import { UblkServer, ublkAvailable } from "./server.ts";
import { openConfigTarget, openCowTarget, openRawTarget, type UblkTarget } from "./targets.ts";
import { errorCode, errorMessage } from "../../util/error.ts";

class UsageError extends Error {}

function guarded(name: string, body: (args: Record<string, any>) => Promise<void>) {
  return async ({ args }: { args: Record<string, any> }) => {
    try {
      await body(args);
    } catch (e) {
      const code = errorCode(e);
      process.stderr.write(`agentenv ublk ${name}: ${code ? `${code}: ` : ""}${errorMessage(e).split("\n")[0]}\n`);
      process.exit(e instanceof UsageError ? 2 : 1);
    }
  };
}

function int(v: unknown, what: string): number {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 0) throw new UsageError(`${what} must be a non-negative integer, got ${JSON.stringify(v)}`);
  return n;
}

/** The config (file + AENV_* environment) with its `[log] level` applied to this process's logger. */
function nodeConfig(): Config {
  const cfg = loadConfig();
  log.level = cfg.log.level;
  return cfg;
}

function config(a: Record<string, any>): UblkConfig {
  const c = ublkConfig(nodeConfig());
  return checkUblkConfig({
    ...c,
    ...(a.queues !== undefined ? { queues: int(a.queues, "--queues") } : {}),
    ...(a.depth !== undefined ? { queueDepth: int(a.depth, "--depth") } : {}),
    ...(a["max-io"] !== undefined ? { maxIoBytes: int(a["max-io"], "--max-io") } : {}),
  });
}

async function target(a: Record<string, any>, cfg: UblkConfig): Promise<UblkTarget> {
  const kinds = [a.config, a.raw, a.cow].filter((x) => x !== undefined).length;
  if (kinds !== 1) throw new UsageError("give exactly one of --config, --raw, --cow");
  if (a.config !== undefined) return openConfigTarget(String(a.config), { readOnly: a["read-only"] === true });
  if (a.raw !== undefined) return openRawTarget(String(a.raw), { readOnly: a["read-only"] === true });
  if (a.origin === undefined) throw new UsageError("--cow needs --origin");
  return openCowTarget({ origin: String(a.origin), cow: String(a.cow), chunkBytes: cfg.cowChunkBytes, create: a.create === true });
}

const serve = defineCommand({
  meta: { name: "serve", description: "serve one target as /dev/ublkbN; prints `ready <id> <path>`. SIGTERM/SIGINT: stop and remove the device; SIGUSR2: stop serving and leave the device for --recover" },
  args: {
    config: { type: "string", description: "overlaybd config.v1.json (lowers + optional upper; see `agentenv image stack`)" },
    raw: { type: "string", description: "raw image file" },
    cow: { type: "string", description: "CoW file over --origin (chunked copy-on-write)" },
    origin: { type: "string", description: "read-only origin of --cow" },
    create: { type: "boolean", description: "create the --cow file when missing" },
    "read-only": { type: "boolean", description: "serve read-only (an overlaybd config's upper is not opened)" },
    id: { type: "string", description: "device id to ask for (default: the kernel picks)" },
    recover: { type: "string", description: "take over this device id after its server died (user recovery)" },
    recovery: { type: "boolean", description: "ask for user recovery (default [ublk] user_recovery); --no-recovery: the kernel removes the device when this server dies" },
    queues: { type: "string", description: "queues (worker threads); default [ublk] queues" },
    depth: { type: "string", description: "queue depth; default [ublk] queue_depth" },
    "max-io": { type: "string", description: "largest request, bytes; default [ublk] max_io_bytes" },
  },
  run: guarded("serve", async (a) => {
    const cfg = config(a);
    const server = UblkServer.open(cfg);
    const t = await target(a, cfg);
    const dev = a.recover !== undefined
      ? await server.recover(int(a.recover, "--recover"), t)
      : await server.create(t, { devId: a.id !== undefined ? int(a.id, "--id") : undefined, userRecovery: typeof a.recovery === "boolean" ? a.recovery : undefined });
    const signalled = new Promise<string>((resolve) => {
      process.once("SIGTERM", () => resolve("SIGTERM"));
      process.once("SIGINT", () => resolve("SIGINT"));
      process.once("SIGUSR2", () => resolve("SIGUSR2"));
    });
    process.stdout.write(`ready ${dev.devId} ${dev.blockPath}\n`);
    const why = await Promise.race([signalled, dev.ended.then((r) => `ended: ${r}`)]);
    logger("ublk").info({ devId: dev.devId, why, ...dev.stats() }, "ublk device stats");
    if (why === "SIGUSR2") await dev.detach();
    await server.close();
    if (why.startsWith("ended")) throw new UblkError("ublk.queue_failed", `device ${dev.devId} stopped serving (${why})`, { devId: dev.devId });
    process.exit(0);
  }),
});

/** Open the ublk control device with the node's `[ublk]` config, run `f`, close it (also when `f` throws). */
async function withServer<T>(f: (server: UblkServer) => Promise<T>): Promise<T> {
  const server = UblkServer.open(ublkConfig(nodeConfig()));
  try {
    return await f(server);
  } finally {
    await server.close();
  }
}

const features = defineCommand({
  meta: { name: "features", description: "print the kernel's ublk support as JSON" },
  run: guarded("features", async () => {
    if (!ublkAvailable()) {
      console.log(JSON.stringify({ available: false }));
      return;
    }
    const f = await withServer((server) => server.features());
    console.log(JSON.stringify({ available: true, flags: `0x${f.flags.toString(16)}`, encodedOps: f.encodedOps, userRecovery: (f.flags & 8n) !== 0n }));
  }),
});

const list = defineCommand({
  meta: { name: "list", description: "print every ublk device of this kernel as JSON" },
  run: guarded("list", async () => {
    console.log(JSON.stringify(await withServer((server) => server.list())));
  }),
});

const remove = defineCommand({
  meta: { name: "remove", description: "remove a device whose server died (STOP_DEV + DEL_DEV)" },
  args: { id: { type: "positional", required: true, description: "device id" } },
  run: guarded("remove", async (a) => {
    const id = int(a.id, "ID");
    await withServer((server) => server.remove(id));
  }),
});

const stop = defineCommand({
  meta: { name: "stop", description: "STOP_DEV of a device another process serves: its block device goes, its server sees the queues aborted" },
  args: { id: { type: "positional", required: true, description: "device id" } },
  run: guarded("stop", async (a) => {
    const id = int(a.id, "ID");
    await withServer((server) => server.stop(id));
  }),
});

export default defineCommand({
  meta: { name: "ublk", description: "ublk block devices: serve a target, list, remove, stop" },
  subCommands: { serve, features, list, remove, stop },
});
