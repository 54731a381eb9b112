// Stand-in for the `firecracker` binary (which cannot run here): serves Firecracker's API on
// `--api-sock`, validates every request body against ../shared/contracts/firecracker-api.yaml
// with ajv (unknown fields rejected, as Firecracker's serde deny_unknown_fields does), enforces the
// pre-boot/post-boot phases and the paused-only snapshot rule, and answers errors the way
// Firecracker does: 400 + {"fault_message": "..."}. Every request is appended as a JSON line to
// `<api-sock>.requests.jsonl`; `<api-sock>.start.json` records argv, pid and network namespace.
// Guest RAM writes are modelled (see takeGuestWrites) so that Full and Diff memory files differ.
import { join } from "node:path";
import Ajv from "ajv";
import { appendFileSync, closeSync, existsSync, fstatSync, openSync, readFileSync, readlinkSync, rmSync, ftruncateSync, writeFileSync, writeSync } from "node:fs";
import { parse } from "yaml";

const SPEC_PATH = process.env.FAKE_FC_SPEC ?? join(import.meta.dir, "../../../../shared/contracts/firecracker-api.yaml");
const argv = process.argv.slice(2);
const arg = (name: string) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : undefined;
};
const sock = arg("--api-sock");
const id = arg("--id") ?? "anonymous-instance";
if (!sock) {
  console.error("fake-firecracker: --api-sock is required");
  process.exit(1);
}
if (existsSync(sock)) {
  console.error(`fake-firecracker: socket ${sock} already exists`); // Firecracker refuses too
  process.exit(1);
}

// ---- contract: compile one body validator per (method, path template)
const doc = parse(readFileSync(SPEC_PATH, "utf8")) as any;
for (const def of Object.values<any>(doc.definitions)) {
  if (def.type === "object" && def.properties && def.additionalProperties === undefined) def.additionalProperties = false;
}
const ajv = new Ajv({ strict: false, validateFormats: false, allErrors: true });
ajv.addSchema({ definitions: doc.definitions }, "fc");
const rewrite = (s: any): any =>
  Array.isArray(s) ? s.map(rewrite) : s && typeof s === "object"
    ? Object.fromEntries(Object.entries(s).map(([k, v]) => [k, k === "$ref" && typeof v === "string" ? v.replace(/^#/, "fc#") : rewrite(v)]))
    : s;
interface Route { method: string; template: string; re: RegExp; params: string[]; validate?: ReturnType<typeof ajv.compile>; bodyRequired: boolean }
const routes: Route[] = [];
for (const [template, ops] of Object.entries<any>(doc.paths)) {
  const params: string[] = [];
  const re = new RegExp("^" + template.replace(/\{(\w+)\}/g, (_, p) => (params.push(p), "([^/]+)")) + "$");
  for (const [method, op] of Object.entries<any>(ops)) {
    const bodyParam = (op.parameters ?? []).find((p: any) => p.in === "body");
    routes.push({
      method: method.toUpperCase(), template, re, params,
      validate: bodyParam ? ajv.compile(rewrite(bodyParam.schema)) : undefined,
      bodyRequired: !!bodyParam?.required,
    });
  }
}

// ---- microVM model
let state: "Not started" | "Running" | "Paused" = "Not started";
const configured = new Set<string>(); // pre-boot resources set so far
const ifaces = new Set<string>();
let machine: any = {};
let mmds: unknown = null;
const PRE_BOOT = new Set(["/boot-source", "/drives/{drive_id}", "/machine-config", "/network-interfaces/{iface_id}", "/mmds/config", "/vsock", "/balloon", "/entropy", "/cpu-config", "/serial", "/pmem/{id}"]);

// Guest memory model: pages the "guest" wrote (page index -> fill byte) and KVM's dirty log. A
// test plays the guest by writing `<api-sock>.guest-writes.json` ([[page, byte], ...]); the writes
// are applied (and the file removed) at the next snapshot.
const guestPages = new Map<number, number>();
const dirty = new Set<number>();
function takeGuestWrites(): void {
  const f = `${sock}.guest-writes.json`;
  if (!existsSync(f)) return;
  for (const [p, b] of JSON.parse(readFileSync(f, "utf8")) as [number, number][]) {
    guestPages.set(p, b);
    dirty.add(p);
  }
  rmSync(f);
}

const logFile = `${sock}.requests.jsonl`;
let netns = "";
try {
  netns = readlinkSync("/proc/self/ns/net");
} catch {}
writeFileSync(`${sock}.start.json`, JSON.stringify({ argv, pid: process.pid, netns }));

const fault = (status: number, msg: string) => Response.json({ fault_message: msg }, { status });

function handle(method: string, path: string, body: any, raw: string): Response {
  const candidates = routes.filter((r) => r.re.test(path));
  const route = candidates.find((r) => r.method === method);
  if (!route) return fault(400, `Invalid request method and/or path: ${method} ${path}.`);
  const m = route.re.exec(path)!;
  if (route.validate) {
    if (raw === "" && route.bodyRequired) return fault(400, "Empty request body.");
    if (raw !== "") {
      if (body === undefined) return fault(400, "An error occurred when deserializing the json body of a request: invalid JSON.");
      if (!route.validate(body)) return fault(400, `An error occurred when deserializing the json body of a request: ${ajv.errorsText(route.validate.errors)}.`);
    }
  }
  route.params.forEach((p, i) => {
    if (body && p in body && body[p] !== decodeURIComponent(m[i + 1]!)) throw fault(400, "The id from the path does not match the id from the body!");
  });
  if (method === "GET") {
    if (path === "/") return Response.json({ id, state, vmm_version: "1.16.1-fake", app_name: "Firecracker" });
    if (path === "/version") return Response.json({ firecracker_version: "1.16.1-fake" });
    if (path === "/mmds") return Response.json(mmds);
    return Response.json({});
  }
  const started = state !== "Not started";
  if (PRE_BOOT.has(route.template) && method === "PUT" && started) return fault(400, "The requested operation is not supported after starting the microVM.");
  if (route.template === "/machine-config" && method === "PATCH" && started) return fault(400, "The requested operation is not supported after starting the microVM.");
  switch (route.template) {
    case "/boot-source":
      if (!existsSync(body.kernel_image_path)) return fault(400, `The kernel file cannot be opened: No such file or directory (os error 2)`);
      break;
    case "/drives/{drive_id}":
      if (method === "PUT" && body.path_on_host && !existsSync(body.path_on_host)) {
        return fault(400, `Unable to create the block device: BackingFile(Os { code: 2, kind: NotFound, message: "No such file or directory" }, "${body.path_on_host}")`);
      }
      // "Updates the properties of a drive. Post-boot only."
      if (method === "PATCH" && !started) return fault(400, "The requested operation is not supported before starting the microVM.");
      if (method === "PATCH" && body.path_on_host && !existsSync(body.path_on_host)) return fault(400, `Unable to patch the block device: BackingFile(NotFound, "${body.path_on_host}")`);
      break;
    case "/machine-config":
      machine = { ...machine, ...body };
      break;
    case "/network-interfaces/{iface_id}":
      if (method === "PUT") ifaces.add(body.iface_id);
      break;
    case "/mmds/config":
      for (const i of body.network_interfaces) if (!ifaces.has(i)) return fault(400, `The list of network interface IDs that allow forwarding MMDS requests is empty or contains unknown ids.`);
      break;
    case "/mmds":
      mmds = method === "PUT" ? body : { ...(mmds as object), ...body };
      return new Response(null, { status: 204 });
    case "/actions":
      if (body.action_type === "InstanceStart") {
        if (started) return fault(400, "The requested operation is not supported after starting the microVM.");
        if (!configured.has("/boot-source")) return fault(400, "Cannot start microvm without kernel configuration.");
        state = "Running";
      }
      return new Response(null, { status: 204 });
    case "/vm":
      if (!started) return fault(400, "The requested operation is not supported before starting the microVM.");
      state = body.state === "Paused" ? "Paused" : "Running";
      return new Response(null, { status: 204 });
    case "/snapshot/create": {
      if (state !== "Paused") return fault(400, "Cannot create snapshot: the microVM must be paused.");
      takeGuestWrites();
      const kind = body.snapshot_type ?? "Full";
      writeFileSync(body.snapshot_path, JSON.stringify({ fakeFirecrackerSnapshot: 1, machine, kind }));
      // as upstream's snapshot_memory_to_file: opened without truncation, emptied only when its
      // size differs from guest RAM, then sized to it; Full writes every page, Diff the dirty ones
      const size = (machine.mem_size_mib ?? 1) * 1024 * 1024;
      const existed = existsSync(body.mem_file_path);
      const fd = openSync(body.mem_file_path, existed ? "r+" : "w+");
      if (existed && fstatSync(fd).size !== size) ftruncateSync(fd, 0);
      ftruncateSync(fd, size);
      const pages = kind === "Diff" ? [...dirty] : [...guestPages.keys()];
      for (const p of pages) writeSync(fd, new Uint8Array(4096).fill(guestPages.get(p) ?? 0), 0, 4096, p * 4096);
      closeSync(fd);
      // reading KVM's dirty log clears it (Full resets it too)
      dirty.clear();
      return new Response(null, { status: 204 });
    }
    case "/snapshot/load": {
      if (started || [...configured].some((c) => c !== "/logger" && c !== "/metrics")) {
        return fault(400, "Loading a microVM snapshot not allowed after configuring boot-specific resources.");
      }
      const memPath = body.mem_backend?.backend_path ?? body.mem_file_path;
      if (!memPath) return fault(400, "Missing memory backend.");
      let snap: any;
      try {
        snap = JSON.parse(readFileSync(body.snapshot_path, "utf8"));
      } catch {
        return fault(400, `Load snapshot error: Failed to restore from snapshot: Failed to load snapshot state from file: ${body.snapshot_path}`);
      }
      if (!existsSync(memPath)) return fault(400, `Load snapshot error: Failed to restore from snapshot: Cannot open the memory file: ${memPath}`);
      machine = snap.machine;
      // a loaded VM's dirty bitmap starts clean
      dirty.clear();
      state = body.resume_vm ? "Running" : "Paused";
      return new Response(null, { status: 204 });
    }
  }
  configured.add(route.template);
  return new Response(null, { status: 204 });
}

const server = Bun.serve({
  unix: sock,
  async fetch(req) {
    const url = new URL(req.url);
    const raw = await req.text();
    let body: any;
    try {
      body = raw === "" ? undefined : JSON.parse(raw);
    } catch {
      body = undefined;
    }
    let res: Response;
    try {
      res = handle(req.method, url.pathname, body, raw);
    } catch (e) {
      res = e instanceof Response ? e : fault(500, String(e));
    }
    const entry: Record<string, unknown> = { method: req.method, path: url.pathname, status: res.status, state };
    if (raw !== "") entry.body = body ?? raw;
    if (res.status >= 400) entry.fault = ((await res.clone().json()) as { fault_message: string }).fault_message;
    appendFileSync(logFile, JSON.stringify(entry) + "\n");
    return res;
  },
});

const shutdown = () => {
  server.stop(true);
  rmSync(sock, { force: true });
  process.exit(0);
};
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);
