/**
 * Decoding of the `metadata` list filter. The E2B SDK URL-encodes each key and value, joins
 * them as `k=v&k2=v2` and URL-encodes that string once more as one query parameter
 * (e2b-contract.md §2.4). The query parser has undone the outer layer; this undoes the rest.
 */
import { ApiError } from "./errors.ts";

/**
 * Parse `k=v&k2=v2` (each part URL-encoded) into a map.
 * @throws ApiError api.bad_metadata (400) for a pair without `=` or bad percent-encoding.
 */
export function parseMetadataFilter(raw: string): Record<string, string> {
  const out: Record<string, string> = {};
  if (raw === "") return out;
  for (const pair of raw.split("&")) {
    const eq = pair.indexOf("=");
    if (eq <= 0) throw new ApiError("api.bad_metadata", `invalid metadata filter ${JSON.stringify(raw)}: expected key=value pairs`, { metadata: raw });
    try {
      out[decodeURIComponent(pair.slice(0, eq))] = decodeURIComponent(pair.slice(eq + 1));
    } catch {
      throw new ApiError("api.bad_metadata", `invalid metadata filter ${JSON.stringify(raw)}: bad percent-encoding`, { metadata: raw });
    }
  }
  return out;
}
