import { AgentEnvError, type ErrorTable } from "../../src/errors.ts";

/** Stable codes of `agentenv cluster up` errors, each with its meaning. */
export const CLUSTER_ERRORS = {
  "cluster.bad_option": "an option cluster up cannot work with (details.option, value)",
  "cluster.member_failed": "a member (scheduler, gateway, node) exited before it printed its ready line (details.member, exitCode, output)",
  "cluster.member_not_ready": "a member printed no ready line within [cluster.up] ready_timeout_ms and was killed (details.member, timeoutMs)",
  "cluster.prerequisite_failed": "building a missing guest kernel or base template failed (details.step, exitCode)",
} as const satisfies ErrorTable;
export type ClusterErrorCode = keyof typeof CLUSTER_ERRORS;

/** Errors of `agentenv cluster up` (services/cluster). */
export class ClusterError extends AgentEnvError<ClusterErrorCode> {}
