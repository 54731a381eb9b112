/**
 * Egress interception (issue 28): header transforms of outbound HTTPS per host with secrets
 * resolved on the node (`network.rules`), and the user's egress proxy (`network.egressProxy`).
 * docs/security.md.
 */
export { EgressCa, type LeafCert } from "./ca.ts";
export { parseClientHello, type HelloResult } from "./client-hello.ts";
export { dial, DialError } from "./dial.ts";
export { headerValues, RequestReader, serializeHead, type Http1Event, type RequestHead } from "./http1.ts";
export { EgressInterceptor, type InterceptorOptions, type InterceptorStats, type ResolveSecret, type SlotEgress } from "./interceptor.ts";
export { maskProxy, parseEgressProxy, type EgressProxy } from "./proxy-config.ts";
export { egressChain, redirectScript, type RedirectedSlot } from "./redirect.ts";
export { maskHeaderValue, matchRule, parsePlaceholders, parseRuleDomain, parseRules, referencedSecrets, type HeaderTransform, type HostRule, type ValuePart } from "./rules.ts";
export { deniedFor, EgressService, type EgressDeps } from "./service.ts";
export { maskNetwork } from "./mask.ts";
