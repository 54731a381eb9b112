import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ERROR_STATUS, ERROR_TABLES, errorResponse, statusOf, toErrorResponse } from "../../src/api/status.ts";
import { AgentEnvError } from "../../src/errors.ts";
import { EnvdError } from "../../src/envd/errors.ts";
import { NetError } from "../../src/net/errors.ts";
import { OrchestratorError } from "../../src/orchestrator/errors.ts";

const ALL = Object.entries(ERROR_TABLES).flatMap(([subsystem, t]) => Object.keys(t).map((code) => ({ subsystem, code })));
// FFI modules each own a prefix; every other table's codes carry the subsystem's name
const FFI_PREFIXES = ["syscall", "flock", "io_uring", "inotify", "pty", "xattr", "mount", "procmem", "random", "sockopt", "ksm"];

test("every code of every table answers its status with E2B's error body", async () => {
  expect(ALL.length).toBeGreaterThan(120);
  for (const { subsystem, code } of ALL) {
    const prefix = code.split(".")[0]!;
    expect(subsystem === "ffi" ? FFI_PREFIXES : [subsystem]).toContain(prefix);
    const status = statusOf(code);
    expect(status === 500 || (status! >= 400 && status! < 500) || status === 503).toBe(true);
    const res = toErrorResponse(new AgentEnvError(code, `m-${code}`, {}));
    expect(res.status).toBe(status!);
    expect(await res.json()).toEqual({ code: status, message: `m-${code}`, error_code: code });
    expect(res.headers.get("retry-after")).toBe(status === 429 ? "1" : null);
  }
  expect(Object.keys(ERROR_STATUS).sort()).toEqual(ALL.map((c) => c.code).sort());
  expect(new Set(ALL.map((c) => c.code)).size).toBe(ALL.length); // no code in two tables
});

test("every subsystem code table under src/ is one of the tables the API maps (NODE_ERRORS: start-up only)", async () => {
  const src = join(import.meta.dir, "../../src");
  const found: string[] = [];
  for (const file of new Bun.Glob("**/*.ts").scanSync(src)) {
    for (const m of readFileSync(join(src, file), "utf8").matchAll(/^export const ([A-Z_]+_ERRORS)\b/gm)) {
      const table = ((await import(join(src, file))) as Record<string, object>)[m[1]!]!;
      found.push(`${m[1]} ${Object.values(ERROR_TABLES).includes(table as never) ? "mapped" : "unmapped"}`);
    }
  }
  expect(found.length).toBe(Object.keys(ERROR_TABLES).length + 1);
  expect(found.filter((f) => f.endsWith("unmapped"))).toEqual(["NODE_ERRORS unmapped"]);
});

test("statuses E2B clients depend on", () => {
  const want: Record<string, number> = {
    "orchestrator.not_found": 404,
    "orchestrator.template_not_found": 404,
    "orchestrator.conflict": 409,
    "orchestrator.busy": 409,
    "orchestrator.bad_request": 400,
    "orchestrator.capacity": 429,
    "orchestrator.shutting_down": 503,
    "orchestrator.create_failed": 500,
    "orchestrator.envd_unready": 500,
    "orchestrator.snapshot_missing": 500,
    "orchestrator.disk_failed": 500,
    "api.unauthorized": 401,
    "api.validation": 400,
    "api.no_route": 404,
    "api.body_too_large": 413,
    "api.starting": 503,
    "net.bad_policy": 400,
    "vmm.qmp_timeout": 500,
    "overlaybd.crc_mismatch": 500,
    "config.bad_value": 500,
    "image.bad_reference": 400,
    "image.pull_failed": 500,
    "ublk.io_failed": 500,
  };
  for (const [code, status] of Object.entries(want)) expect([code, statusOf(code)]).toEqual([code, status]);
});

test("subsystem classes map by code; unknown codes and plain errors are 500", async () => {
  expect(toErrorResponse(new OrchestratorError("orchestrator.capacity", "full")).status).toBe(429);
  expect(toErrorResponse(new NetError("net.bad_policy", "bad cidr")).status).toBe(400);
  const envd = toErrorResponse(new EnvdError("not_found", "no file"));
  expect(envd.status).toBe(500); // envd's codes are envd's own HTTP answers, not the node API's
  expect(((await envd.json()) as { error_code: string }).error_code).toBe("envd.not_found");
  const plain = toErrorResponse(new Error("boom"));
  expect(plain.status).toBe(500);
  expect(await plain.json()).toEqual({ code: 500, message: "boom", error_code: "api.internal" });
  expect(toErrorResponse("a string").status).toBe(500);
  expect(statusOf("nope.nothing")).toBeUndefined();
  const r = errorResponse("api.starting", "wait", { "retry-after": "1" });
  expect([r.status, r.headers.get("retry-after")]).toEqual([503, "1"]);
});
