/**
 * E2B request fields this node does not implement. Accepting them silently would tell the
 * client something happened that did not (a volume mounted, a filesystem-only snapshot, ...),
 * so a non-default value is refused with 400 `api.unsupported` naming the field.
 * Field meanings: ../shared/docs/e2b-contract.md, E2B's spec/openapi.yml.
 */
import { ApiError } from "./errors.ts";

/** A field path and a test that is true when its value asks for something unsupported. */
type Rule = [path: string, asks: (v: unknown) => boolean, why: string];

const present = (v: unknown) => v !== undefined && v !== null;

const CREATE: Rule[] = [
  ["mcp", present, "MCP gateways are not supported by this node"],
  ["iam", present, "IAM settings are not supported by this node"],
];
const RESUME: Rule[] = [["autoPause", (v) => v === true, "autoPause on resume is not supported; set it at create"]];

/** Which rules apply to which request body. */
export const UNSUPPORTED = { create: CREATE, resume: RESUME } as const;

/**
 * Refuse a body that asks for an unsupported feature.
 * @param body the parsed JSON body (may be undefined).
 * @throws ApiError `api.unsupported` (400) naming the first such field and why.
 */
export function refuseUnsupported(body: unknown, rules: readonly Rule[]): void {
  if (typeof body !== "object" || body === null) return;
  for (const [path, asks, why] of rules) {
    let v: unknown = body;
    for (const part of path.split(".")) v = typeof v === "object" && v !== null ? (v as Record<string, unknown>)[part] : undefined;
    if (asks(v)) throw new ApiError("api.unsupported", `${path}: ${why}`, { field: path });
  }
}
