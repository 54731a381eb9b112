/**
 * The configuration of the cluster's control plane (services/): `[scheduler]` and `[gateway]`,
 * part of the one schema (schema.ts) so every command reads the same file.
 */
import { int, list, MS_MAX, oneOf, section, str, TIB } from "./fields.ts";

/** `[scheduler]` and `[gateway]`, in the order config/default.toml lists them. */
export const CONTROL_PLANE_SECTIONS = {
  scheduler: section("`agentenv scheduler`: picks nodes for new sandboxes and remembers where each sandbox lives.", {
    addr: str("0.0.0.0:9090", "gRPC listen address host:port.", { pattern: "^.+:[0-9]{1,5}$" }),
    strategy: oneOf(
      ["round_robin", "random", "least_loaded"],
      "round_robin",
      'Placement: "round_robin", "random", or "least_loaded" (fewest running + starting sandboxes\nfrom the heartbeats, then most free memory). Nodes whose reports stopped are never picked.',
    ),
    store: oneOf(["sqlite", "redis"], "sqlite", 'Where bindings (sandbox -> node) and observed nodes persist: "sqlite" (db_path) or "redis"\n(redis_url; several scheduler replicas may share it).'),
    db_path: str("", "SQLite file. Empty: $home_path/scheduler.db."),
    redis_url: str("redis://127.0.0.1:6379", 'Redis server of store = "redis" (redis://[user:password@]host:port[/db]).'),
    redis_prefix: str("agentenv:scheduler:", "Prefix of every Redis key the scheduler writes."),
    redis_connect_timeout_ms: int(3000, "Bound on connecting to the Redis server, ms; an RPC needing the store then fails UNAVAILABLE.", { min: 1, max: MS_MAX, unit: "ms" }),
    binding_ttl_secs: int(
      30,
      "Freshness of a binding of a node that never reported, seconds: one not refreshed for this long\n(by a RecordAssignment) is dropped at the next lookup. Bindings of reporting nodes follow their\nrosters and gone_node_ttl_secs instead. A restarted scheduler counts it from its own start, so\ndowntime loses no binding.",
      { min: 1, unit: "s" },
    ),
    report_ttl_secs: int(10, "A node that reported once and then sent nothing for this long is UNHEALTHY: never scheduled,\nleft out of cluster-wide lists. Its bindings stay (see gone_node_ttl_secs). Seconds.", { min: 1, unit: "s" }),
    gone_node_ttl_secs: int(
      86_400,
      "Bindings of a node whose reports stopped (or that left keeping them, its sandboxes paused or\ndetached for its next start) stay this long after its last report: its sandboxes keep routing\nto it (502 naming it while it is down) and a restarted node finds them bound to it. Then they\nare dropped (at that moment: a timer armed at the earliest report's end). Seconds.",
      { min: 1, unit: "s" },
    ),
    rebind_after_secs: int(
      60,
      "A node silent for this long (since its last report) is gone for RebindSandbox: a connect through\nthe gateway moves its paused sandboxes whose pause snapshots are in the shared snapshot store\n([snapshot.s3] push_kinds with \"pause\") to another node, which resumes them. Longer than a\nnode's restart, so an upgrade moves nothing. Seconds.",
      { min: 1, unit: "s" },
    ),
    discovery: oneOf(["static", "kubernetes"], "static", 'Node discovery: "static" (the nodes list) or "kubernetes" (EndpointSlices of a headless\nService, ready endpoints only).'),
    nodes: list([], 'Static nodes, "id=http://host:port" each (id as the node reports it in [node] id).\nAENV__scheduler__nodes="a=http://10.0.0.1:8000,b=http://10.0.0.2:8000" overrides it.'),
    max_p2p_artifacts: int(100_000, "Bound on P2P artifact records kept (ListP2pPeers / LookupP2pArtifact bookkeeping).", { min: 1, unit: "count" }),

    kubernetes: section("", {
      namespace: str("", "Namespace of the Service. Empty: the scheduler Pod's own (service account namespace file)."),
      service_name: str("agentenv-nodes", "Headless Service whose EndpointSlices list the nodes (label kubernetes.io/service-name).", { minLength: 1 }),
      port: int(8000, "Port of the node API on each endpoint, and the URL scheme the gateway uses.", { min: 1, max: 65535 }),
      scheme: oneOf(["http", "https"], "http", ""),
      api_url: str("", "API server URL. Empty: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (in-cluster)."),
      token_path: str("/var/run/secrets/kubernetes.io/serviceaccount/token", "Service account token and CA bundle (in-cluster defaults)."),
      ca_path: str("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", ""),
      watch_timeout_secs: int(300, "Server-side timeout of one watch request, seconds (the client re-watches from the last\nresourceVersion after it).", { min: 1, max: 86_400, unit: "s" }),
      retry_backoff_ms: int(2000, "Wait before re-listing after a failed list or watch, and before watching again after a\nwatch that ended without any event, ms.", { min: 1, max: MS_MAX, unit: "ms" }),
      request_timeout_ms: int(10_000, "Bound on a list request, and on a watch's response headers, ms. A watch is cut\nwatch_timeout_secs plus this after it started (the server should have ended it).", { min: 1, max: MS_MAX, unit: "ms" }),
      max_list_bytes: int(67_108_864, "Largest EndpointSlice list answer read, bytes; a longer one fails the list (retried after\nretry_backoff_ms).", { min: 1024, max: TIB, unit: "bytes" }),
      max_event_bytes: int(
        4_194_304,
        "Largest watch event (one line) read, bytes: one EndpointSlice holds at most 1000 endpoints.\nA longer line cuts the watch, and discovery lists again.",
        { min: 1024, max: TIB, unit: "bytes" },
      ),
    }),
  }),

  gateway: section(
    "`agentenv gateway`: the cluster's E2B API. Clients authenticate with [api] key\n(AENV_API_KEY; empty: generated in $home_path/api-key); the gateway sends node_api_key to\nnodes. Scheduler address: [cluster] scheduler_endpoint.",
    {
      addr: str("0.0.0.0:8080", "Listen address host:port.", { pattern: "^.+:[0-9]{1,5}$" }),
      node_api_key: str("", "X-API-Key the gateway presents to nodes (every node must be configured with it).\nEmpty: the gateway's own key, i.e. one key for the whole cluster."),
      sandbox_proxy_domains: list(
        [],
        "DNS suffixes for host routes {port}-{sandboxID}.{domain} on the gateway; the first is\nreturned to SDKs as the sandbox `domain`. AENV_GATEWAY_SANDBOX_PROXY_DOMAINS overrides it.",
      ),
      request_timeout_ms: int(
        30_000,
        "Bound on connecting to a node (until it reads a streamed request body, or for a control-plane\nrequest without one until its response headers arrive), and on the response headers after a\ncontrol-plane body's end, ms; then 502 naming the node. Reads the gateway merges from every\nnode (lists) are bounded whole, body included, and so is opening a WebSocket to a node.\nCreates, pauses and resumes take longer: create_timeout_ms bounds those.",
        { min: 1, max: MS_MAX, unit: "ms" },
      ),
      idle_timeout_ms: int(
        120_000,
        "Once a request body streams through the gateway: the longest pause between its chunks, ms.\nA body may stream for as long as it keeps moving; one that stalls is cut (502 naming the node).",
        { min: 1, max: MS_MAX, unit: "ms" },
      ),
      response_timeout_ms: int(
        300_000,
        "Sandbox traffic: the longest wait for the answer's headers, ms, from the request body's end or,\nfor a request without a body, from its start (as the node's [sandbox_proxy] response_timeout_ms:\nslow and long-polling endpoints); then 502 naming the node.",
        { min: 1, max: MS_MAX, unit: "ms" },
      ),
      create_timeout_ms: int(150_000, "Bound on a create, pause, resume or connect forwarded to a node (a VM boot or snapshot), ms.", { min: 1, max: MS_MAX, unit: "ms" }),
      scheduler_timeout_ms: int(3000, "Bound on one scheduler RPC, ms; a scheduler that does not answer makes creates 503.", { min: 1, max: MS_MAX, unit: "ms" }),
      scheduler_retry_ms: int(100, "Pause between tries of a scheduler RPC that found the channel down (it reconnects), within\nscheduler_timeout_ms, ms.", { min: 1, max: MS_MAX, unit: "ms" }),
      create_attempts: int(3, "Schedule calls one create may make: a node that refused the connection (nothing reached it)\nis left out and the create goes to the next node the scheduler picks.", { min: 1, max: 100, unit: "count" }),
      route_cache_size: int(100_000, "Sandbox -> node routes the gateway remembers (LRU). Routing of known sandboxes keeps working\nfrom it while the scheduler is down.", { min: 1, unit: "count" }),
      node_list_ttl_ms: int(2000, "How long the node list from the scheduler is reused for list/aggregation fan-out, ms.", { min: 0, max: MS_MAX, unit: "ms" }),
      max_body_bytes: int(1_048_576, "Largest control-plane request body the gateway accepts, bytes (sandbox traffic is streamed).", { min: 1024, max: TIB, unit: "bytes" }),
      max_answer_bytes: int(
        67_108_864,
        "Largest node answer the gateway reads whole, bytes: each node's part of a merged list, a create\nor fork answer it rewrites. A longer one is 502 naming the node (sandbox traffic and other\nforwarded answers stream through unread).",
        { min: 1024, max: TIB, unit: "bytes" },
      ),
      webhook_sync_interval_ms: int(
        2000,
        "Webhooks registered through the gateway are kept in its data directory (gateway-webhooks.json)\nand given to every live node: a round every this many ms sends each node what it lacks (a node\nthat joined or came back gets every registration; a change it missed is sent again), ms.",
        { min: 1, max: MS_MAX, unit: "ms" },
      ),
      webhook_full_check_ms: int(
        60_000,
        "Longest time between two full checks of a node's webhooks (its list read, every registration it\nlacks sent again), besides the check when it joins or comes back, ms.",
        { min: 1, max: MS_MAX, unit: "ms" },
      ),
    },
  ),
};
