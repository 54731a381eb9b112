/**
 * Kubernetes manifests of a cluster (`agentenv deploy render`): nodes as a privileged DaemonSet
 * (one per host: /dev/kvm, /dev/fuse, host network for sandbox namespaces and iptables, the
 * data directory on a hostPath) behind the headless Service `agentenv-nodes` whose
 * EndpointSlices the scheduler watches; the scheduler (Deployment, SQLite on a volume claim,
 * RBAC to list/watch EndpointSlices) and the gateway (Deployment) with their Services; and a
 * ConfigMap holding config/default.toml verbatim, so node configuration stays single-sourced
 * (operators edit the ConfigMap; the environment below only wires the cluster together).
 * The API key comes from a Secret the operator creates (`agentenv-api-key`, key `key`), and so does
 * the key the cluster's secrets are sealed with (`agentenv-secrets-key`, key `key`: 64 hex digits),
 * mounted into the gateway as `[secrets] key_path`. With `--redis-secret` (a Secret whose key `url`
 * is the cluster's Redis) the gateway replicas keep the secrets in that Redis, sealed, and the
 * scheduler its bindings; without it each gateway replica has a store of its own on a throwaway
 * directory. Nodes ask the gateway for secret values (`[secrets] gateway_url`). Registry
 * settings (`[image]`: mirrors, proxy) travel in the ConfigMap (`--config`); registry credentials
 * and CAs in a Secret and a ConfigMap the operator creates, mounted into every node.
 * The scheduler's gRPC port has no authentication, so a NetworkPolicy admits only the gateway
 * Pods (by label) and the node hosts: nodes run on the host network, where Pod selectors do not
 * apply (their traffic comes from the host's address), so they are admitted by the CIDRs of
 * `--node-cidr`.
 */
import { createHash } from "node:crypto";
import YAML from "yaml";
import defaultToml from "../config/default.toml" with { type: "text" };

/** What `agentenv deploy render` varies. */
export interface RenderOptions {
  namespace: string;
  /** Image holding the `agentenv` binary (and QEMU for nodes). */
  image: string;
  /** Gateway replicas. */
  gatewayReplicas: number;
  /**
   * Addresses of the node hosts (CIDRs) the scheduler's NetworkPolicy admits. The default, the
   * RFC 1918 private ranges, works on most clusters but also admits Pods in those ranges:
   * narrow it to the nodes' subnet.
   */
  nodeCidrs: string[];
  /** The ConfigMap's agentenv.toml, which every node reads (default: config/default.toml). */
  configToml?: string;
  /**
   * Secret (key `config.json`: a Docker config.json of registry credentials) mounted into every
   * node and named by `[image] auth_file`.
   */
  registryAuthSecret?: string;
  /** ConfigMap of PEM CA certificates (keys ending in .crt or .pem) mounted into every node and named by `[image] ca_path`. */
  registryCaConfigMap?: string;
  /**
   * Secret whose key `url` is the cluster's Redis (redis://[user:password@]host:port[/db]): the
   * gateway replicas share the secrets store there (`[secrets] store = "redis"`) and the
   * scheduler keeps its bindings there (`[scheduler] store = "redis"`).
   */
  redisSecret?: string;
}

export const DEFAULT_RENDER: RenderOptions = { namespace: "agentenv", image: "agentenv:latest", gatewayReplicas: 2, nodeCidrs: ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"] };

/** Where the registry credentials and CAs are mounted in node Pods. */
export const REGISTRY_AUTH_DIR = "/etc/agentenv/registry-auth";
export const REGISTRY_CA_DIR = "/etc/agentenv/registry-ca";
/** The Secret of the key the cluster's secrets are sealed with, and where the gateway reads it. */
export const SECRETS_KEY_SECRET = "agentenv-secrets-key";
export const SECRETS_KEY_DIR = "/etc/agentenv-secrets";

const NODE_PORT = 8000;
const SCHEDULER_PORT = 9090;
const GATEWAY_PORT = 8080;
const GATEWAY_SERVICE_PORT = 80;
const CONFIG_FILE = "agentenv.toml";
const CONFIG_DIR = "/etc/agentenv";

type Obj = Record<string, unknown>;

const labels = (component: string) => ({ "app.kubernetes.io/name": "agentenv", "app.kubernetes.io/component": component });
const apiKeyEnv = { name: "AENV_API_KEY", valueFrom: { secretKeyRef: { name: "agentenv-api-key", key: "key" } } };
const configEnv = { name: "AENV_CONFIG_PATH", value: `${CONFIG_DIR}/${CONFIG_FILE}` };
const configMount = { name: "config", mountPath: CONFIG_DIR, readOnly: true };
const configVolume = { name: "config", configMap: { name: "agentenv-config" } };
const health = (port: number) => ({ httpGet: { path: "/health", port }, periodSeconds: 5, failureThreshold: 3 });

/** The manifests as plain objects, in apply order. */
export function manifests(o: RenderOptions = DEFAULT_RENDER): Obj[] {
  const ns = o.namespace;
  const toml = o.configToml ?? defaultToml;
  // registry credentials and CAs ([image] auth_file, ca_path): the same mounts on every node
  const registryEnv = [
    ...(o.registryAuthSecret ? [{ name: "AENV__image__auth_file", value: `${REGISTRY_AUTH_DIR}/config.json` }] : []),
    ...(o.registryCaConfigMap ? [{ name: "AENV__image__ca_path", value: REGISTRY_CA_DIR }] : []),
  ];
  const registryMounts = [
    ...(o.registryAuthSecret ? [{ name: "registry-auth", mountPath: REGISTRY_AUTH_DIR, readOnly: true }] : []),
    ...(o.registryCaConfigMap ? [{ name: "registry-ca", mountPath: REGISTRY_CA_DIR, readOnly: true }] : []),
  ];
  const registryVolumes = [
    ...(o.registryAuthSecret ? [{ name: "registry-auth", secret: { secretName: o.registryAuthSecret, defaultMode: 0o400, items: [{ key: "config.json", path: "config.json" }] } }] : []),
    ...(o.registryCaConfigMap ? [{ name: "registry-ca", configMap: { name: o.registryCaConfigMap } }] : []),
  ];
  const meta = (name: string, component: string) => ({ name, namespace: ns, labels: labels(component) });
  const schedulerAddr = `agentenv-scheduler.${ns}.svc:${SCHEDULER_PORT}`;
  // one Redis per cluster: the scheduler's bindings and the gateway's secrets (the URL may hold a password)
  const redisUrl = (section: string) => (o.redisSecret ? [{ name: `AENV__${section}__store`, value: "redis" }, { name: `AENV__${section}__redis_url`, valueFrom: { secretKeyRef: { name: o.redisSecret, key: "url" } } }] : []);
  return [
    { apiVersion: "v1", kind: "Namespace", metadata: { name: ns, labels: { "app.kubernetes.io/name": "agentenv" } } },
    { apiVersion: "v1", kind: "ConfigMap", metadata: meta("agentenv-config", "config"), data: { [CONFIG_FILE]: toml } },
    { apiVersion: "v1", kind: "ServiceAccount", metadata: meta("agentenv-scheduler", "scheduler") },
    {
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "Role",
      metadata: meta("agentenv-scheduler", "scheduler"),
      rules: [{ apiGroups: ["discovery.k8s.io"], resources: ["endpointslices"], verbs: ["get", "list", "watch"] }],
    },
    {
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "RoleBinding",
      metadata: meta("agentenv-scheduler", "scheduler"),
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "agentenv-scheduler" },
      subjects: [{ kind: "ServiceAccount", name: "agentenv-scheduler", namespace: ns }],
    },
    {
      apiVersion: "apps/v1",
      kind: "DaemonSet",
      metadata: meta("agentenv-node", "node"),
      spec: {
        selector: { matchLabels: labels("node") },
        updateStrategy: { type: "RollingUpdate", rollingUpdate: { maxUnavailable: 1 } },
        template: {
          // a changed configuration rolls every node onto it (one set of settings per cluster)
          metadata: { labels: labels("node"), annotations: { "agentenv.io/config-sha256": createHash("sha256").update(toml).digest("hex") } },
          spec: {
            hostNetwork: true,
            dnsPolicy: "ClusterFirstWithHostNet",
            // sandboxes are paused or killed on SIGTERM ([orchestrator] shutdown_action)
            terminationGracePeriodSeconds: 120,
            containers: [
              {
                name: "node",
                image: o.image,
                command: ["agentenv", "server"],
                securityContext: { privileged: true },
                ports: [{ name: "api", containerPort: NODE_PORT, protocol: "TCP" }],
                env: [
                  configEnv,
                  apiKeyEnv,
                  { name: "AENV_API_ADDR", value: `0.0.0.0:${NODE_PORT}` },
                  // the Pod name is the node id Kubernetes discovery gives it (EndpointSlice targetRef)
                  { name: "AENV_NODE_ID", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } },
                  { name: "AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED", value: "true" },
                  { name: "AENV_OBSERVABILITY_SCHEDULER_ENDPOINT", value: schedulerAddr },
                  // the gateway keeps the cluster's secrets; the egress interceptor asks it per request
                  { name: "AENV__secrets__gateway_url", value: `http://agentenv-gateway.${ns}.svc:${GATEWAY_SERVICE_PORT}` },
                  ...registryEnv,
                ],
                readinessProbe: health(NODE_PORT),
                volumeMounts: [
                  configMount,
                  { name: "data", mountPath: "/var/lib/agentenv" },
                  { name: "run", mountPath: "/run/agentenv" },
                  { name: "kvm", mountPath: "/dev/kvm" },
                  { name: "fuse", mountPath: "/dev/fuse" },
                  { name: "netns", mountPath: "/run/netns", mountPropagation: "Bidirectional" },
                  ...registryMounts,
                ],
              },
            ],
            volumes: [
              configVolume,
              { name: "data", hostPath: { path: "/var/lib/agentenv", type: "DirectoryOrCreate" } },
              { name: "run", hostPath: { path: "/run/agentenv", type: "DirectoryOrCreate" } },
              { name: "kvm", hostPath: { path: "/dev/kvm", type: "CharDevice" } },
              { name: "fuse", hostPath: { path: "/dev/fuse", type: "CharDevice" } },
              { name: "netns", hostPath: { path: "/run/netns", type: "DirectoryOrCreate" } },
              ...registryVolumes,
            ],
          },
        },
      },
    },
    {
      apiVersion: "v1",
      kind: "Service",
      metadata: meta("agentenv-nodes", "node"),
      spec: { clusterIP: "None", selector: labels("node"), ports: [{ name: "api", port: NODE_PORT, targetPort: NODE_PORT, protocol: "TCP" }] },
    },
    {
      apiVersion: "v1",
      kind: "PersistentVolumeClaim",
      metadata: meta("agentenv-scheduler-data", "scheduler"),
      spec: { accessModes: ["ReadWriteOnce"], resources: { requests: { storage: "1Gi" } } },
    },
    {
      apiVersion: "apps/v1",
      kind: "Deployment",
      metadata: meta("agentenv-scheduler", "scheduler"),
      spec: {
        // SQLite: one replica (store = "redis", --redis-secret, allows more)
        replicas: 1,
        strategy: { type: "Recreate" },
        selector: { matchLabels: labels("scheduler") },
        template: {
          metadata: { labels: labels("scheduler") },
          spec: {
            serviceAccountName: "agentenv-scheduler",
            containers: [
              {
                name: "scheduler",
                image: o.image,
                command: ["agentenv", "scheduler"],
                ports: [{ name: "grpc", containerPort: SCHEDULER_PORT, protocol: "TCP" }],
                env: [
                  configEnv,
                  { name: "AENV_HOME_PATH", value: "/var/lib/agentenv-scheduler" },
                  { name: "AENV__scheduler__addr", value: `0.0.0.0:${SCHEDULER_PORT}` },
                  { name: "AENV__scheduler__discovery", value: "kubernetes" },
                  { name: "AENV__scheduler__kubernetes__namespace", valueFrom: { fieldRef: { fieldPath: "metadata.namespace" } } },
                  { name: "AENV__scheduler__kubernetes__service_name", value: "agentenv-nodes" },
                  { name: "AENV__scheduler__kubernetes__port", value: String(NODE_PORT) },
                  ...redisUrl("scheduler"),
                ],
                readinessProbe: { tcpSocket: { port: SCHEDULER_PORT }, periodSeconds: 5 },
                volumeMounts: [configMount, { name: "data", mountPath: "/var/lib/agentenv-scheduler" }],
              },
            ],
            volumes: [configVolume, { name: "data", persistentVolumeClaim: { claimName: "agentenv-scheduler-data" } }],
          },
        },
      },
    },
    {
      apiVersion: "v1",
      kind: "Service",
      metadata: meta("agentenv-scheduler", "scheduler"),
      spec: { selector: labels("scheduler"), ports: [{ name: "grpc", port: SCHEDULER_PORT, targetPort: SCHEDULER_PORT, protocol: "TCP" }] },
    },
    {
      // the gRPC port is unauthenticated: only the gateway Pods and the node hosts may reach it
      apiVersion: "networking.k8s.io/v1",
      kind: "NetworkPolicy",
      metadata: meta("agentenv-scheduler", "scheduler"),
      spec: {
        podSelector: { matchLabels: labels("scheduler") },
        policyTypes: ["Ingress"],
        ingress: [
          {
            from: [{ podSelector: { matchLabels: labels("gateway") } }, ...o.nodeCidrs.map((cidr) => ({ ipBlock: { cidr } }))],
            ports: [{ protocol: "TCP", port: SCHEDULER_PORT }],
          },
        ],
      },
    },
    {
      apiVersion: "apps/v1",
      kind: "Deployment",
      metadata: meta("agentenv-gateway", "gateway"),
      spec: {
        replicas: o.gatewayReplicas,
        selector: { matchLabels: labels("gateway") },
        template: {
          metadata: { labels: labels("gateway") },
          spec: {
            containers: [
              {
                name: "gateway",
                image: o.image,
                command: ["agentenv", "gateway"],
                ports: [{ name: "http", containerPort: GATEWAY_PORT, protocol: "TCP" }],
                env: [
                  configEnv,
                  apiKeyEnv,
                  { name: "AENV_HOME_PATH", value: "/tmp/agentenv-gateway" },
                  { name: "AENV__gateway__addr", value: `0.0.0.0:${GATEWAY_PORT}` },
                  { name: "AENV__cluster__scheduler_endpoint", value: schedulerAddr },
                  // every replica seals and opens with the one key of the Secret (never made in the Pod)
                  { name: "AENV__secrets__key_path", value: `${SECRETS_KEY_DIR}/key` },
                  ...redisUrl("secrets"),
                ],
                readinessProbe: health(GATEWAY_PORT),
                volumeMounts: [configMount, { name: "secrets-key", mountPath: SECRETS_KEY_DIR, readOnly: true }],
              },
            ],
            // 0400: the key file check refuses a key others may read
            volumes: [configVolume, { name: "secrets-key", secret: { secretName: SECRETS_KEY_SECRET, defaultMode: 0o400, items: [{ key: "key", path: "key" }] } }],
          },
        },
      },
    },
    {
      apiVersion: "v1",
      kind: "Service",
      metadata: meta("agentenv-gateway", "gateway"),
      spec: { selector: labels("gateway"), ports: [{ name: "http", port: GATEWAY_SERVICE_PORT, targetPort: GATEWAY_PORT, protocol: "TCP" }] },
    },
  ];
}

/** The manifests as one multi-document YAML stream. */
export function renderYaml(o: RenderOptions = DEFAULT_RENDER): string {
  const head = "# AgentENV on Kubernetes, rendered by `agentenv deploy render` (deploy/render.ts); do not edit by hand.\n# Before applying: kubectl create namespace agentenv; kubectl -n agentenv create secret generic agentenv-api-key --from-literal=key=e2b_<40 hex>\n# kubectl -n agentenv create secret generic agentenv-secrets-key --from-literal=key=<64 hex> (the key secrets are sealed with; back it up)\n";
  return head + manifests(o).map((m) => YAML.stringify(m, { lineWidth: 0 })).map((d) => "---\n" + d).join("");
}
