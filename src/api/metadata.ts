/**
 * Decoding of the `metadata` list filter. The E2B JS SDK (e2b 2.51.0, SandboxPaginator) URL-encodes
 * each key and value (encodeURIComponent), joins them with URLSearchParams (which form-encodes
 * them again: `%` becomes `%25`, a space `+`), and its HTTP client URL-encodes that whole string
 * as one query parameter: `{"team name": "blue/green"}` travels as
 * `metadata=team%252520name%3Dblue%25252Fgreen`. The query parser undoes the outer layer; this
 * undoes the form layer and then each pair's own encoding.
 */
import { ApiError } from "./errors.ts";

/**
 * Parse the query-decoded filter (`team%2520name=blue%252Fgreen&k2=v2`) into a map.
 * @throws ApiError api.bad_metadata (400) for a pair without `=`, an empty key, or bad percent-encoding.
 */
export function parseMetadataFilter(raw: string): Record<string, string> {
  const out: Record<string, string> = {};
  if (raw === "") return out;
  for (const pair of raw.split("&")) {
    if (pair.indexOf("=") <= 0) throw new ApiError("api.bad_metadata", `invalid metadata filter ${JSON.stringify(raw)}: expected key=value pairs`, { metadata: raw });
  }
  for (const [k, v] of new URLSearchParams(raw)) {
    try {
      out[decodeURIComponent(k)] = decodeURIComponent(v);
    } catch {
      throw new ApiError("api.bad_metadata", `invalid metadata filter ${JSON.stringify(raw)}: bad percent-encoding`, { metadata: raw });
    }
  }
  return out;
}
