/**
 * A SandboxRuntime without VMs for cluster tests and benchmarks: each sandbox is a small HTTP
 * + WebSocket server on 127.0.0.1 standing in for the guest (every guest port maps to it). It
 * answers `GET /whoami` with the sandbox id and node name, echoes request bodies at
 * `/echo`, and echoes WebSocket frames prefixed with the sandbox id.
 */
import type { Server } from "bun";
import type { RuntimeSandbox, RuntimeStartSpec, SandboxRuntime, TemplateInfo } from "../../src/orchestrator/index.ts";

export class LoopbackRuntime implements SandboxRuntime {
  readonly name = "loopback";
  private readonly servers = new Map<string, Server<{ id: string }>>();
  /** Sandboxes started (creates + resumes), for assertions. */
  starts = 0;

  /** @param templates template ids this node holds (each with itself as alias) */
  constructor(private readonly nodeName: string, private readonly templates: string[] = ["base"]) {}

  async listTemplates(): Promise<TemplateInfo[]> {
    const t = Date.UTC(2026, 0, 1);
    return this.templates.map((id) => ({ templateID: id, aliases: [id], cpuCount: 1, memoryMB: 128, diskSizeMB: 1024, envdVersion: "0.5.7", createdAt: t, updatedAt: t, buildID: "build1", buildStatus: "ready" as const }));
  }

  private serve(id: string): RuntimeSandbox {
    const node = this.nodeName;
    const server = Bun.serve<{ id: string }>({
      hostname: "127.0.0.1",
      port: 0,
      async fetch(req, srv) {
        const u = new URL(req.url);
        if (req.headers.get("upgrade")?.toLowerCase() === "websocket") return srv.upgrade(req, { data: { id } }) ? undefined : new Response("no", { status: 400 });
        if (u.pathname.endsWith("/whoami")) return Response.json({ sandbox: id, node, path: u.pathname, query: u.search });
        if (u.pathname.endsWith("/echo")) return new Response(await req.arrayBuffer());
        if (u.pathname === "/health") return new Response(null, { status: 204 });
        return new Response("not found", { status: 404 });
      },
      websocket: {
        message(ws, m) {
          ws.send(`${ws.data.id}:${typeof m === "string" ? m : new TextDecoder().decode(m)}`);
        },
      },
    });
    this.servers.set(id, server);
    return { endpoint: { host: "127.0.0.1" }, runtimeState: { port: server.port }, envdVersion: "0.5.7" };
  }

  async start(spec: RuntimeStartSpec): Promise<RuntimeSandbox> {
    this.starts++;
    const r = this.serve(spec.id);
    return { ...r, endpoint: { host: "127.0.0.1", ports: { "49983": r.runtimeState.port as number, "8080": r.runtimeState.port as number } } };
  }

  async pause(id: string): Promise<Record<string, unknown>> {
    this.servers.get(id)?.stop(true);
    this.servers.delete(id);
    return { paused: true };
  }

  async resume(spec: RuntimeStartSpec): Promise<RuntimeSandbox> {
    return this.start(spec);
  }

  async kill(id: string): Promise<void> {
    this.servers.get(id)?.stop(true);
    this.servers.delete(id);
  }

  async reap() {
    return { stoppedVms: [], removed: [] };
  }

  async close(): Promise<void> {
    for (const s of this.servers.values()) s.stop(true);
    this.servers.clear();
  }
}
