/**
 * Kubernetes discovery against a stand-in API server (no Kubernetes API server can run on this
 * machine): a Bun.serve on 127.0.0.1 that speaks the published EndpointSlice list + watch
 * protocol of discovery.k8s.io/v1 — list with metadata.resourceVersion, `watch=1` streaming one
 * JSON event per line (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR), HTTP 410 or an ERROR event with
 * Status code 410 for an expired resourceVersion — and checks the bearer token and label selector.
 */
import { afterEach, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { KubernetesDiscovery, nodesFromSlices, type EndpointSlice, type KubernetesOptions } from "../../../services/scheduler/index.ts";
import { waitFor } from "../../helpers/wait.ts";

type Ev = { type: string; object: unknown };

/** The stand-in API server. Events pushed with `emit` go to every open watch. */
function fakeApi(token: string) {
  const state = {
    rv: 10,
    items: new Map<string, EndpointSlice>(),
    watches: new Set<ReadableStreamDefaultController<Uint8Array>>(),
    requests: [] as string[],
    goneBelow: 0,
    /** Misbehaviour: never answer lists / watches, or end every watch at once with no event. */
    fault: null as null | "hang-list" | "hang-watch" | "end-watch",
  };
  const enc = new TextEncoder();
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch(req) {
      const u = new URL(req.url);
      state.requests.push(u.pathname + u.search);
      if (req.headers.get("authorization") !== `Bearer ${token}`) return Response.json({ kind: "Status", code: 401 }, { status: 401 });
      if (u.pathname !== "/apis/discovery.k8s.io/v1/namespaces/agentenv/endpointslices") return new Response("not found", { status: 404 });
      if (u.searchParams.get("labelSelector") !== "kubernetes.io/service-name=agentenv-nodes") return Response.json({ items: [] });
      if (u.searchParams.get("watch") !== "1") {
        if (state.fault === "hang-list") return new Promise<Response>(() => {});
        return Response.json({ kind: "EndpointSliceList", apiVersion: "discovery.k8s.io/v1", metadata: { resourceVersion: String(state.rv) }, items: [...state.items.values()] });
      }
      if (Number(u.searchParams.get("resourceVersion")) < state.goneBelow) return Response.json({ kind: "Status", code: 410, reason: "Expired" }, { status: 410 });
      if (state.fault === "hang-watch") return new Promise<Response>(() => {});
      if (state.fault === "end-watch") return new Response("", { headers: { "content-type": "application/json" } });
      let ctl!: ReadableStreamDefaultController<Uint8Array>;
      const body = new ReadableStream<Uint8Array>({
        start(c) {
          ctl = c;
          state.watches.add(c);
          c.enqueue(enc.encode("\n")); // a blank line: the response headers go out now
        },
        cancel() {
          state.watches.delete(ctl);
        },
      });
      return new Response(body, { headers: { "content-type": "application/json" } });
    },
  });
  const send = (ev: Ev) => {
    for (const c of state.watches) c.enqueue(enc.encode(JSON.stringify(ev) + "\n"));
  };
  return {
    url: `http://127.0.0.1:${server.port}`,
    state,
    /** Change a slice and tell the watchers. */
    put(s: EndpointSlice, type: "ADDED" | "MODIFIED" = "ADDED") {
      state.rv++;
      s.metadata.resourceVersion = String(state.rv);
      state.items.set(s.metadata.name, s);
      send({ type, object: s });
    },
    del(name: string) {
      state.rv++;
      const s = state.items.get(name)!;
      state.items.delete(name);
      send({ type: "DELETED", object: { ...s, metadata: { ...s.metadata, resourceVersion: String(state.rv) } } });
    },
    raw: send,
    /** End every open watch (as the API server does at timeoutSeconds). */
    endWatches() {
      for (const c of state.watches) c.close();
      state.watches.clear();
    },
    stop: () => server.stop(true),
  };
}

function slice(name: string, eps: { pod: string; ip: string; ready?: boolean | null; serving?: boolean; terminating?: boolean }[], port = 8000): EndpointSlice {
  return {
    metadata: { name, labels: { "kubernetes.io/service-name": "agentenv-nodes" } },
    addressType: "IPv4",
    endpoints: eps.map((e) => ({
      addresses: [e.ip],
      conditions: { ...(e.ready === undefined ? {} : { ready: e.ready }), ...(e.serving === undefined ? {} : { serving: e.serving }), ...(e.terminating === undefined ? {} : { terminating: e.terminating }) },
      nodeName: `host-${e.pod}`,
      targetRef: { kind: "Pod", name: e.pod, namespace: "agentenv" },
    })),
    ports: [{ name: "api", port, protocol: "TCP" }],
  };
}

const cleanup: (() => unknown)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

function discovery(api: ReturnType<typeof fakeApi>, tokenPath: string, o: Partial<KubernetesOptions> = {}) {
  const d = new KubernetesDiscovery({ apiUrl: api.url, namespace: "agentenv", serviceName: "agentenv-nodes", port: 8000, scheme: "http", tokenPath, caPath: null, watchTimeoutSecs: 300, retryBackoffMs: 20, requestTimeoutMs: 5000, maxListBytes: 1 << 20, maxEventBytes: 64 * 1024, ...o });
  cleanup.push(() => d.close());
  return d;
}

const ids = (d: KubernetesDiscovery) => d.nodes().active.map((n) => `${n.nodeId}@${n.endpoint}`);

test("lists, then follows ADDED/MODIFIED/DELETED; ready endpoints only; watch restarts and 410 re-lists", async () => {
  const dir = mkdtempSync("/tmp/aenv-k8s-");
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, "token"), "tok123\n");
  const api = fakeApi("tok123");
  cleanup.push(() => api.stop());
  api.state.items.set("s1", slice("s1", [{ pod: "node-a", ip: "10.0.0.1" }, { pod: "node-x", ip: "10.0.0.9", ready: false }]));
  const d = discovery(api, join(dir, "token"));
  await d.start();
  expect(ids(d)).toEqual(["node-a@http://10.0.0.1:8000"]);
  await waitFor("a watch", () => api.state.watches.size === 1);
  const watchReq = api.state.requests.find((r) => r.includes("watch=1"))!;
  expect(watchReq).toContain("resourceVersion=10");
  expect(watchReq).toContain("allowWatchBookmarks=true");

  // node-x becomes ready, node-b appears in a second slice
  api.put(slice("s1", [{ pod: "node-a", ip: "10.0.0.1" }, { pod: "node-x", ip: "10.0.0.9", ready: true }]), "MODIFIED");
  api.put(slice("s2", [{ pod: "node-b", ip: "10.0.0.2" }]));
  await waitFor("three nodes", () => ids(d).length === 3);
  expect(ids(d)).toEqual(["node-a@http://10.0.0.1:8000", "node-b@http://10.0.0.2:8000", "node-x@http://10.0.0.9:8000"]);

  // node-a terminating but still serving: lingering, not active; a slice on another port is ignored
  api.put(slice("s1", [{ pod: "node-a", ip: "10.0.0.1", ready: false, serving: true, terminating: true }]), "MODIFIED");
  api.put(slice("s3", [{ pod: "node-q", ip: "10.0.0.7" }], 9999));
  await waitFor("node-a lingering", () => d.nodes().lingering.length === 1);
  expect(ids(d)).toEqual(["node-b@http://10.0.0.2:8000"]);
  expect(d.nodes().lingering).toEqual([{ nodeId: "node-a", endpoint: "http://10.0.0.1:8000" }]);

  // a bookmark moves the resourceVersion; the server ends the watch; the client re-watches from it
  api.raw({ type: "BOOKMARK", object: { metadata: { resourceVersion: "77" } } });
  await waitFor("the bookmark to be read", () => d.resourceVersion === "77");
  api.endWatches();
  await waitFor("a second watch", () => api.state.requests.filter((r) => r.includes("watch=1")).length === 2);
  expect(api.state.requests.filter((r) => r.includes("watch=1"))[1]).toContain("resourceVersion=77");
  await waitFor("the second watch open", () => api.state.watches.size === 1);

  // DELETED
  api.del("s2");
  await waitFor("node-b gone", () => ids(d).length === 0);

  // expired resourceVersion: ERROR event with 410 → list again (sees changes made meanwhile)
  const listsBefore = d.lists;
  api.state.items.set("s4", slice("s4", [{ pod: "node-c", ip: "10.0.0.3" }]));
  api.raw({ type: "ERROR", object: { kind: "Status", code: 410, reason: "Expired", message: "too old resource version" } });
  await waitFor("a re-list after the 410 event", () => d.lists === listsBefore + 1);
  await waitFor("node-c from the re-list", () => ids(d).includes("node-c@http://10.0.0.3:8000"));

  // HTTP 410 at watch start → list again
  api.state.goneBelow = 10_000;
  api.endWatches();
  await waitFor("a re-list after HTTP 410", () => d.lists >= listsBefore + 2);
  api.state.goneBelow = 0;
});

test("the first list failing (bad token) is a discovery_failed error naming the server", async () => {
  const dir = mkdtempSync("/tmp/aenv-k8s-");
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, "token"), "wrong");
  const api = fakeApi("right");
  cleanup.push(() => api.stop());
  const d = discovery(api, join(dir, "token"));
  await expect(d.start()).rejects.toMatchObject({ code: "scheduler.discovery_failed", message: expect.stringContaining("HTTP 401") });
});

/** A token file for a fake API server (removed after the test). */
function tokenFile(token: string): string {
  const dir = mkdtempSync("/tmp/aenv-k8s-");
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, "token"), token);
  return join(dir, "token");
}

test("an API server that never answers: the first list fails naming the deadline; a hung watch is cut and discovery lists again", async () => {
  const api = fakeApi("t");
  cleanup.push(() => api.stop());
  api.state.items.set("s1", slice("s1", [{ pod: "node-a", ip: "10.0.0.1" }]));
  api.state.fault = "hang-list";
  const stuck = discovery(api, tokenFile("t"), { requestTimeoutMs: 100 });
  await expect(stuck.start()).rejects.toMatchObject({ code: "scheduler.discovery_failed", message: expect.stringContaining("did not answer the list within 100 ms") });
  // lists answer, watches never do: each watch is cut after requestTimeoutMs, then a re-list
  api.state.fault = "hang-watch";
  const d = discovery(api, tokenFile("t"), { requestTimeoutMs: 100 });
  await d.start();
  expect(ids(d)).toEqual(["node-a@http://10.0.0.1:8000"]);
  await waitFor("two cut watches, each followed by a list", () => d.lists >= 3 && d.watches >= 2);
  expect(ids(d)).toEqual(["node-a@http://10.0.0.1:8000"]);
});

test("a watch whose body stalls is cut at watch_timeout_secs + request_timeout_ms", async () => {
  const api = fakeApi("t");
  cleanup.push(() => api.stop());
  const d = discovery(api, tokenFile("t"), { watchTimeoutSecs: 1, requestTimeoutMs: 50 });
  await d.start();
  // the stand-in sends headers, then nothing, and never ends the watch
  await waitFor("a watch", () => api.state.watches.size === 1);
  expect(d.lists).toBe(1);
  // only a failed watch leads to a list (a watch the server ends leads to another watch)
  await waitFor("a re-list after the stalled watch was cut", () => d.lists === 2);
});

test("a server that ends every watch at once without an event does not make discovery spin", async () => {
  const api = fakeApi("t");
  cleanup.push(() => api.stop());
  api.state.fault = "end-watch";
  const d = discovery(api, tokenFile("t"), { retryBackoffMs: 600_000 });
  await d.start();
  await waitFor("the first watch", () => api.state.requests.filter((r) => r.includes("watch=1")).length === 1);
  await waitFor("the pause after the empty watch", () => d.pauses === 1);
  // one watch, then the pause: no second request (without the pause there would be thousands)
  expect(api.state.requests.filter((r) => r.includes("watch=1")).length).toBe(1);
  expect(d.watches).toBe(1);
  await d.close(); // cuts the pause short
});

test("what the API server sends is bounded and checked: an over-long or malformed event cuts the watch and discovery lists again; an over-long list fails naming the bound", async () => {
  const api = fakeApi("t");
  cleanup.push(() => api.stop());
  api.state.items.set("s1", slice("s1", [{ pod: "node-a", ip: "10.0.0.1" }]));
  const big = discovery(api, tokenFile("t"), { maxListBytes: 1024 });
  api.state.items.set("s2", slice("s2", Array.from({ length: 20 }, (_, i) => ({ pod: `node-${i}`, ip: `10.0.1.${i}` }))));
  await expect(big.start()).rejects.toMatchObject({ code: "scheduler.discovery_failed", message: expect.stringContaining("exceeds 1024 bytes ([scheduler.kubernetes] max_list_bytes)") });
  api.state.items.delete("s2");

  const d = discovery(api, tokenFile("t"), { maxEventBytes: 2048 });
  await d.start();
  expect(ids(d)).toEqual(["node-a@http://10.0.0.1:8000"]);
  const cases: [string, () => void][] = [
    ["a line past max_event_bytes (never ended)", () => {
      for (const c of api.state.watches) c.enqueue(new Uint8Array(3000).fill(0x7b));
    }],
    ["an ADDED event whose addresses are not strings", () => api.raw({ type: "ADDED", object: { metadata: { name: "s9" }, endpoints: [{ addresses: [5] }] } })],
    ["an event that is not JSON", () => {
      for (const c of api.state.watches) c.enqueue(new TextEncoder().encode("{nope\n"));
    }],
    ["an ERROR event whose code is a string", () => api.raw({ type: "ERROR", object: { code: "410" } })],
  ];
  for (const [what, send] of cases) {
    await waitFor(`a watch before ${what}`, () => api.state.watches.size === 1);
    const lists = d.lists;
    send();
    await waitFor(`a re-list after ${what}`, () => d.lists === lists + 1);
    expect([what, ids(d)]).toEqual([what, ["node-a@http://10.0.0.1:8000"]]);
  }
});

test("nodesFromSlices: nil ready counts as ready, IPv6 in brackets, an endpoint without a Pod name is left out", () => {
  const s: EndpointSlice = {
    metadata: { name: "x" },
    endpoints: [
      { addresses: ["fd00::5"], conditions: {}, targetRef: { name: "v6" } },
      { addresses: ["10.1.1.1"], conditions: { ready: null }, targetRef: { name: "nilready" } },
      { addresses: ["10.1.1.2"], conditions: { ready: true } },
      { addresses: ["not-an-ip"], conditions: { ready: true }, targetRef: { name: "dns" } },
    ],
    ports: [{ port: 8000 }],
  };
  expect(nodesFromSlices([s], 8000, "https")).toEqual({
    active: [
      { nodeId: "nilready", endpoint: "https://10.1.1.1:8000" },
      { nodeId: "v6", endpoint: "https://[fd00::5]:8000" },
    ],
    lingering: [],
  });
});

test("`agentenv scheduler` config with discovery = kubernetes: ListNodes serves the watched slices", async () => {
  const dir = mkdtempSync("/tmp/aenv-k8s-");
  cleanup.push(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, "token"), "tokcfg");
  const api = fakeApi("tokcfg");
  cleanup.push(() => api.stop());
  api.state.items.set("s1", slice("s1", [{ pod: "agentenv-node-x1", ip: "10.2.0.1" }, { pod: "agentenv-node-x2", ip: "10.2.0.2", ready: false }]));
  const { startTestScheduler } = await import("../helpers.ts");
  const s = await startTestScheduler({
    AENV_HOME_PATH: dir,
    AENV__scheduler__discovery: "kubernetes",
    AENV__scheduler__kubernetes__api_url: api.url,
    AENV__scheduler__kubernetes__namespace: "agentenv",
    AENV__scheduler__kubernetes__token_path: join(dir, "token"),
    AENV__scheduler__kubernetes__ca_path: join(dir, "no-ca.crt"),
  });
  cleanup.push(() => s.close());
  expect((await s.client.listNodes({})).nodes).toEqual([{ nodeId: "agentenv-node-x1", endpoint: "http://10.2.0.1:8000" }]);
  await waitFor("the scheduler's watch", () => api.state.watches.size === 1);
  api.put(slice("s1", [{ pod: "agentenv-node-x1", ip: "10.2.0.1" }, { pod: "agentenv-node-x2", ip: "10.2.0.2", ready: true }]), "MODIFIED");
  let listed: { nodeId: string }[] = [];
  await waitFor("the scheduler to see agentenv-node-x2", async () => {
    listed = (await s.client.listNodes({})).nodes;
    return listed.length === 2;
  });
  expect(listed.map((n) => n.nodeId)).toEqual(["agentenv-node-x1", "agentenv-node-x2"]);
  expect((await s.client.schedule({ hint: undefined })).node!.nodeId).toBe("agentenv-node-x1");
  expect((await s.client.schedule({ hint: undefined })).node!.nodeId).toBe("agentenv-node-x2");
});
