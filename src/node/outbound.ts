/**
 * The proxy of the node's outbound requests (src/util/proxy.ts), decided once at start from
 * `[image] proxy` / `no_proxy` or the environment, with the node's own internal destinations
 * always direct: loopback, the sandbox networks (the node reaches envd at host_interaction_cidr
 * addresses) and the scheduler.
 */
import { type Config, ConfigError } from "../config/index.ts";
import { errorMessage } from "../util/error.ts";
import { installProxyEnv, proxySettings, redactUrl, type ProxySettings } from "../util/proxy.ts";

/**
 * The node's proxy settings.
 * @throws ConfigError `config.bad_value` naming `image.proxy` (or the variable) when the proxy is not an http(s) URL
 */
export function nodeProxy(cfg: Config, env: Record<string, string | undefined> = process.env): ProxySettings {
  const direct = [cfg.network.internal.host_interaction_cidr, cfg.network.internal.veth_cidr];
  const sched = cfg.cluster.scheduler_endpoint.replace(/^[a-z]+:\/\//, "").replace(/\/.*$/, "");
  if (sched) direct.push(sched.replace(/:\d+$/, ""));
  try {
    return proxySettings({ proxy: cfg.image.proxy, noProxy: cfg.image.no_proxy }, env, direct);
  } catch (e) {
    const key = cfg.image.proxy ? "image.proxy" : "HTTPS_PROXY / HTTP_PROXY";
    throw new ConfigError("config.bad_value", `config: ${key}: ${errorMessage(e)}`, { key, value: redactUrl(cfg.image.proxy), expected: "http://host:port" });
  }
}

/**
 * Decide the node's proxy and put it into `process.env` (Bun's fetch and S3 client, and child
 * processes, read it there). Returns the settings for explicit use (`proxyFor`).
 * @throws ConfigError see nodeProxy
 */
export function setUpOutboundProxy(cfg: Config): ProxySettings {
  const s = nodeProxy(cfg);
  installProxyEnv(s);
  return s;
}
