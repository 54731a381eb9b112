/**
 * The Kubernetes manifests `agentenv deploy render` prints: parsed back from YAML, kinds,
 * selectors against the Pod labels, Services against container ports, the node DaemonSet's
 * host access, RBAC for the EndpointSlice watch, and the ConfigMap equal to config/default.toml.
 */
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import YAML from "yaml";
import { defaultConfig, loadConfig } from "../../src/config/index.ts";

const ROOT = join(import.meta.dir, "../..");

function render(args: string[] = []): any[] {
  const r = Bun.spawnSync([process.execPath, join(ROOT, "src/cli/main.ts"), "deploy", "render", ...args], { stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`deploy render failed: ${r.stderr.toString()}`);
  return YAML.parseAllDocuments(r.stdout.toString()).map((d) => {
    if (d.errors.length) throw new Error(`YAML error: ${d.errors[0]!.message}`);
    return d.toJS();
  });
}

const docs = render();
const byKind = (kind: string) => docs.filter((d) => d.kind === kind);
const one = (kind: string, name: string) => {
  const d = docs.find((x) => x.kind === kind && x.metadata.name === name);
  if (!d) throw new Error(`no ${kind} ${name}`);
  return d;
};

test("kinds and names", () => {
  expect(docs.map((d) => `${d.kind}/${d.metadata.name}`)).toEqual([
    "Namespace/agentenv",
    "ConfigMap/agentenv-config",
    "ServiceAccount/agentenv-scheduler",
    "Role/agentenv-scheduler",
    "RoleBinding/agentenv-scheduler",
    "DaemonSet/agentenv-node",
    "Service/agentenv-nodes",
    "PersistentVolumeClaim/agentenv-scheduler-data",
    "Deployment/agentenv-scheduler",
    "Service/agentenv-scheduler",
    "NetworkPolicy/agentenv-scheduler",
    "Deployment/agentenv-gateway",
    "Service/agentenv-gateway",
  ]);
  for (const d of docs.slice(1)) expect(d.metadata.namespace).toBe("agentenv");
});

test("every selector matches its Pod template's labels; Services target declared container ports", () => {
  const workloads = [...byKind("DaemonSet"), ...byKind("Deployment")];
  for (const w of workloads) {
    const podLabels = w.spec.template.metadata.labels;
    for (const [k, v] of Object.entries(w.spec.selector.matchLabels)) expect(podLabels[k]).toBe(v);
  }
  for (const svc of byKind("Service")) {
    const targets = workloads.filter((w) => Object.entries(svc.spec.selector).every(([k, v]) => w.spec.template.metadata.labels[k] === v));
    expect(targets.length).toBe(1);
    const ports = targets[0].spec.template.spec.containers.flatMap((c: any) => c.ports.map((p: any) => p.containerPort));
    for (const p of svc.spec.ports) expect(ports).toContain(p.targetPort);
  }
  expect(one("Service", "agentenv-nodes").spec.clusterIP).toBe("None");
  expect(one("Service", "agentenv-nodes").spec.selector).toEqual(one("DaemonSet", "agentenv-node").spec.template.metadata.labels);
});

test("the node DaemonSet: privileged, host network, /dev/kvm, hostPath data dir, node id = Pod name, reporting on", () => {
  const spec = one("DaemonSet", "agentenv-node").spec.template.spec;
  expect(spec.hostNetwork).toBe(true);
  const c = spec.containers[0];
  expect(c.securityContext.privileged).toBe(true);
  expect(c.command).toEqual(["agentenv", "server"]);
  const vol = (name: string) => spec.volumes.find((v: any) => v.name === name);
  expect(vol("kvm").hostPath).toEqual({ path: "/dev/kvm", type: "CharDevice" });
  expect(vol("data").hostPath.path).toBe("/var/lib/agentenv");
  expect(c.volumeMounts.find((m: any) => m.name === "kvm").mountPath).toBe("/dev/kvm");
  const env = Object.fromEntries(c.env.map((e: any) => [e.name, e.value ?? e.valueFrom]));
  expect(env.AENV_NODE_ID).toEqual({ fieldRef: { fieldPath: "metadata.name" } });
  expect(env.AENV_OBSERVABILITY_SCHEDULER_REPORT_ENABLED).toBe("true");
  expect(env.AENV_OBSERVABILITY_SCHEDULER_ENDPOINT).toBe("agentenv-scheduler.agentenv.svc:9090");
  expect(env.AENV_API_KEY).toEqual({ secretKeyRef: { name: "agentenv-api-key", key: "key" } });
  // the config the environment names is the one mounted from the ConfigMap
  expect(env.AENV_CONFIG_PATH).toBe("/etc/agentenv/agentenv.toml");
  expect(vol("config").configMap.name).toBe("agentenv-config");
  // every environment override names a real config key (loads without error)
  const plain = Object.fromEntries(c.env.filter((e: any) => typeof e.value === "string" && e.name !== "AENV_CONFIG_PATH").map((e: any) => [e.name, e.value]));
  expect(loadConfig({ env: plain }).observability.scheduler_report.enabled).toBe(true);
});

test("scheduler: Kubernetes discovery of agentenv-nodes with RBAC to watch EndpointSlices", () => {
  const d = one("Deployment", "agentenv-scheduler").spec.template.spec;
  expect(d.serviceAccountName).toBe("agentenv-scheduler");
  const env = Object.fromEntries(d.containers[0].env.filter((e: any) => e.value && e.name !== "AENV_CONFIG_PATH").map((e: any) => [e.name, e.value]));
  const cfg = loadConfig({ env });
  expect(cfg.scheduler.discovery).toBe("kubernetes");
  expect(cfg.scheduler.kubernetes.service_name).toBe("agentenv-nodes");
  expect(one("Role", "agentenv-scheduler").rules).toEqual([{ apiGroups: ["discovery.k8s.io"], resources: ["endpointslices"], verbs: ["get", "list", "watch"] }]);
  const rb = one("RoleBinding", "agentenv-scheduler");
  expect(rb.roleRef.name).toBe("agentenv-scheduler");
  expect(rb.subjects).toEqual([{ kind: "ServiceAccount", name: "agentenv-scheduler", namespace: "agentenv" }]);
  const g = one("Deployment", "agentenv-gateway").spec.template.spec.containers[0];
  expect(g.env.find((e: any) => e.name === "AENV__cluster__scheduler_endpoint").value).toBe("agentenv-scheduler.agentenv.svc:9090");
});

test("the scheduler's unauthenticated gRPC port admits only the gateway Pods and the node hosts", () => {
  const np = one("NetworkPolicy", "agentenv-scheduler");
  expect(np.spec.podSelector.matchLabels).toEqual(one("Deployment", "agentenv-scheduler").spec.template.metadata.labels);
  expect(np.spec.policyTypes).toEqual(["Ingress"]);
  expect(np.spec.ingress).toEqual([
    {
      from: [{ podSelector: { matchLabels: one("Deployment", "agentenv-gateway").spec.template.metadata.labels } }, { ipBlock: { cidr: "10.0.0.0/8" } }, { ipBlock: { cidr: "172.16.0.0/12" } }, { ipBlock: { cidr: "192.168.0.0/16" } }],
      ports: [{ protocol: "TCP", port: 9090 }],
    },
  ]);
  const narrow = render(["--node-cidr", "10.1.0.0/24,fd00::/64"]).find((d) => d.kind === "NetworkPolicy");
  expect(narrow.spec.ingress[0].from.slice(1)).toEqual([{ ipBlock: { cidr: "10.1.0.0/24" } }, { ipBlock: { cidr: "fd00::/64" } }]);
  for (const bad of ["10.1.0.0", "10.1.0.0/33", "nope/8", ""]) {
    const r = Bun.spawnSync([process.execPath, join(ROOT, "src/cli/main.ts"), "deploy", "render", "--node-cidr", bad], { stderr: "pipe" });
    expect([bad, r.exitCode]).toEqual([bad, 2]);
    expect(r.stderr.toString()).toContain("--node-cidr must list CIDRs");
  }
});

test("the ConfigMap is config/default.toml byte for byte, and parses to the default config", () => {
  const text = one("ConfigMap", "agentenv-config").data["agentenv.toml"];
  expect(text).toBe(readFileSync(join(ROOT, "config/default.toml"), "utf8"));
  const tmp = `/tmp/aenv-cm-${process.pid}.toml`;
  require("node:fs").writeFileSync(tmp, text);
  try {
    expect(loadConfig({ path: tmp, env: {} })).toEqual(defaultConfig());
  } finally {
    require("node:fs").rmSync(tmp);
  }
});

test("options: namespace and image; a bad replica count is refused", () => {
  const d = render(["--namespace", "sbx", "--image", "reg/agentenv:1"]);
  expect(d.slice(1).every((x) => x.metadata.namespace === "sbx")).toBe(true);
  expect(d.find((x) => x.kind === "DaemonSet").spec.template.spec.containers[0].image).toBe("reg/agentenv:1");
  const r = Bun.spawnSync([process.execPath, join(ROOT, "src/cli/main.ts"), "deploy", "render", "--gateway-replicas", "0"], { stderr: "pipe" });
  expect(r.exitCode).toBe(2);
  expect(r.stderr.toString()).toContain("--gateway-replicas must be a positive integer");
});

test("registry settings reach every node: --config becomes the ConfigMap ([image] mirrors, proxy), credentials and CAs are mounted and named by [image]; a bad config is refused", () => {
  const dir = require("node:fs").mkdtempSync(`/tmp/aenv-render-`);
  try {
    const file = join(dir, "node.toml");
    const toml = '[image]\nmirror_only = ["docker.io"]\nproxy = "http://proxy.corp:3128"\nno_proxy = [".corp"]\n\n[image.registry_mirrors]\n"docker.io" = ["harbor.corp/dockerhub-proxy", "10.0.0.5:5000"]\n';
    require("node:fs").writeFileSync(file, toml);
    const d = render(["--config", file, "--registry-auth-secret", "registry-creds", "--registry-ca-configmap", "corp-ca"]);
    const cm = d.find((x) => x.kind === "ConfigMap");
    expect(cm.data["agentenv.toml"]).toBe(toml);
    const ds = d.find((x) => x.kind === "DaemonSet").spec.template;
    const c = ds.spec.containers[0];
    const env = Object.fromEntries(c.env.filter((e: any) => typeof e.value === "string" && e.name !== "AENV_CONFIG_PATH").map((e: any) => [e.name, e.value]));
    expect(env.AENV__image__auth_file).toBe("/etc/agentenv/registry-auth/config.json");
    expect(env.AENV__image__ca_path).toBe("/etc/agentenv/registry-ca");
    expect(c.volumeMounts.filter((m: any) => m.name.startsWith("registry-"))).toEqual([
      { name: "registry-auth", mountPath: "/etc/agentenv/registry-auth", readOnly: true },
      { name: "registry-ca", mountPath: "/etc/agentenv/registry-ca", readOnly: true },
    ]);
    expect(ds.spec.volumes.filter((v: any) => v.name.startsWith("registry-"))).toEqual([
      { name: "registry-auth", secret: { secretName: "registry-creds", defaultMode: 0o400, items: [{ key: "config.json", path: "config.json" }] } },
      { name: "registry-ca", configMap: { name: "corp-ca" } },
    ]);
    // what a node loads: the ConfigMap's file and the DaemonSet's environment
    const cmPath = join(dir, "cm.toml");
    require("node:fs").writeFileSync(cmPath, cm.data["agentenv.toml"]);
    const cfg = loadConfig({ path: cmPath, env });
    expect(cfg.image.registry_mirrors).toEqual({ "docker.io": ["harbor.corp/dockerhub-proxy", "10.0.0.5:5000"] });
    expect(cfg.image.mirror_only).toEqual(["docker.io"]);
    expect(cfg.image.proxy).toBe("http://proxy.corp:3128");
    expect(cfg.image.auth_file).toBe("/etc/agentenv/registry-auth/config.json");
    // a changed configuration changes the Pod template (the DaemonSet rolls every node)
    const sum = ds.metadata.annotations["agentenv.io/config-sha256"];
    expect(sum).toBe(require("node:crypto").createHash("sha256").update(toml).digest("hex"));
    expect(one("DaemonSet", "agentenv-node").spec.template.metadata.annotations["agentenv.io/config-sha256"]).not.toBe(sum);
    // the defaults mount nothing extra
    expect(one("DaemonSet", "agentenv-node").spec.template.spec.volumes.some((v: any) => v.name.startsWith("registry-"))).toBe(false);
    // refused: an unknown key, a bad value, a bad object name
    for (const [text, msg] of [["[image]\nmirrors = 1\n", "unknown key image.mirrors"], ['[image]\nmirror_only = "docker.io"\n', "expected a list of strings"]] as const) {
      require("node:fs").writeFileSync(file, text);
      const r = Bun.spawnSync([process.execPath, join(ROOT, "src/cli/main.ts"), "deploy", "render", "--config", file], { stderr: "pipe" });
      expect(r.exitCode).toBe(2);
      expect(r.stderr.toString()).toContain(msg);
    }
    const r = Bun.spawnSync([process.execPath, join(ROOT, "src/cli/main.ts"), "deploy", "render", "--registry-auth-secret", "Bad_Name"], { stderr: "pipe" });
    expect(r.exitCode).toBe(2);
    expect(r.stderr.toString()).toContain("--registry-auth-secret must be a Kubernetes object name");
  } finally {
    require("node:fs").rmSync(dir, { recursive: true, force: true });
  }
});

test("the cluster's secrets: the sealing key from a Secret mounted 0400 into the gateway, nodes resolve at the gateway, --redis-secret shares the store", () => {
  const gwSpec = (d: any[]) => d.find((x) => x.kind === "Deployment" && x.metadata.name === "agentenv-gateway").spec.template.spec;
  const envOf = (c: any) => Object.fromEntries(c.env.map((e: any) => [e.name, e.value ?? e.valueFrom]));
  const g = gwSpec(docs);
  const c = g.containers[0];
  expect(g.volumes.find((v: any) => v.name === "secrets-key")).toEqual({ name: "secrets-key", secret: { secretName: "agentenv-secrets-key", defaultMode: 0o400, items: [{ key: "key", path: "key" }] } });
  expect(c.volumeMounts.find((m: any) => m.name === "secrets-key")).toEqual({ name: "secrets-key", mountPath: "/etc/agentenv-secrets", readOnly: true });
  const env = envOf(c);
  expect(env.AENV__secrets__key_path).toBe("/etc/agentenv-secrets/key");
  // without Redis: the file store (each replica its own), and nothing names a Redis
  expect(env.AENV__secrets__store).toBeUndefined();
  expect(loadConfig({ env: { AENV__secrets__key_path: env.AENV__secrets__key_path } }).secrets.store).toBe("file");
  const node = envOf(one("DaemonSet", "agentenv-node").spec.template.spec.containers[0]);
  expect(node.AENV__secrets__gateway_url).toBe("http://agentenv-gateway.agentenv.svc:80");
  expect(one("Service", "agentenv-gateway").spec.ports[0].port).toBe(80);
  // the default 2 replicas without Redis is rendered with a warning naming the loss
  const warn = Bun.spawnSync([process.execPath, join(ROOT, "src/cli/main.ts"), "deploy", "render"], { stdout: "pipe", stderr: "pipe" });
  expect(warn.stderr.toString()).toContain("2 gateway replicas without --redis-secret");
  const single = Bun.spawnSync([process.execPath, join(ROOT, "src/cli/main.ts"), "deploy", "render", "--gateway-replicas", "1"], { stdout: "pipe", stderr: "pipe" });
  expect([single.exitCode, single.stderr.toString()]).toEqual([0, ""]);

  // with Redis: the gateway and the scheduler take store = "redis" and the URL from the Secret's key url
  const d = render(["--redis-secret", "agentenv-redis", "--namespace", "sbx"]);
  const rc = gwSpec(d).containers[0];
  const renv = envOf(rc);
  const fromSecret = { secretKeyRef: { name: "agentenv-redis", key: "url" } };
  expect([renv.AENV__secrets__store, renv.AENV__secrets__redis_url, renv.AENV__secrets__key_path]).toEqual(["redis", fromSecret, "/etc/agentenv-secrets/key"]);
  const senv = envOf(d.find((x) => x.kind === "Deployment" && x.metadata.name === "agentenv-scheduler").spec.template.spec.containers[0]);
  expect([senv.AENV__scheduler__store, senv.AENV__scheduler__redis_url]).toEqual(["redis", fromSecret]);
  expect(envOf(d.find((x) => x.kind === "DaemonSet").spec.template.spec.containers[0]).AENV__secrets__gateway_url).toBe("http://agentenv-gateway.sbx.svc:80");
  // what a gateway loads from that environment (the URL as the Secret would give it)
  const cfg = loadConfig({ env: { AENV__secrets__store: renv.AENV__secrets__store, AENV__secrets__redis_url: "redis://redis.sbx.svc:6379", AENV__secrets__key_path: renv.AENV__secrets__key_path } });
  expect([cfg.secrets.store, cfg.secrets.redis_url, cfg.secrets.redis_prefix]).toEqual(["redis", "redis://redis.sbx.svc:6379", "agentenv:secrets:"]);
  const r = Bun.spawnSync([process.execPath, join(ROOT, "src/cli/main.ts"), "deploy", "render", "--redis-secret", "Not_A_Name"], { stderr: "pipe" });
  expect(r.exitCode).toBe(2);
  expect(r.stderr.toString()).toContain("--redis-secret must be a Kubernetes object name");
});
