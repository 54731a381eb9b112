/**
 * The rule for request bodies of JSON routes (the node's API and the gateway's): a body that is
 * not empty must say it is JSON (`application/json`, or a `+json` type such as
 * `application/merge-patch+json`; parameters like `charset` are fine) and parse as JSON. The
 * messages name what the client sent, so a `text/plain` body (curl `-d`, a form) is not mistaken
 * for a schema problem.
 */

/** Whether `contentType` (a Content-Type header value) names JSON. */
export function isJsonContentType(contentType: string | null): boolean {
  const media = (contentType ?? "").split(";")[0]!.trim().toLowerCase();
  return media === "application/json" || (media.startsWith("application/") && media.endsWith("+json"));
}

/**
 * Why a non-empty body with `contentType` is refused, or null when it is JSON: the message says
 * a JSON body is required and what content type was sent.
 */
export function notJsonReason(contentType: string | null): string | null {
  if (isJsonContentType(contentType)) return null;
  const sent = contentType ? `content-type ${JSON.stringify(contentType)}` : "no content-type";
  return `this route takes a JSON body (content-type: application/json); the request sent ${sent}`;
}

/** The message for a body that says it is JSON and does not parse (`detail`: the parser's). */
export function malformedJsonMessage(detail: string): string {
  return `the request body is not valid JSON: ${detail}`;
}
