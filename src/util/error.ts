/**
 * Reading a caught value. `catch (e)` gives `unknown`: a thrown Error, or anything else a
 * library threw (a string, a Response, an object). These helpers replace casting a caught value to Error.
 */

/**
 * The message of a caught value: an Error's `message`, a string as is, else its JSON (or
 * `String(e)` when it has none), never `undefined`.
 */
export function errorMessage(e: unknown): string {
  if (e instanceof Error) return e.message;
  if (typeof e === "string") return e;
  try {
    const json = JSON.stringify(e);
    if (json !== undefined) return json;
  } catch {
    // cyclic: fall through
  }
  return String(e);
}

/** A caught value as an Error: the value itself when it is one, else an Error carrying its message (the value as `cause`). */
export function asError(e: unknown): Error {
  return e instanceof Error ? e : new Error(errorMessage(e), { cause: e });
}

/** The `code` property of a caught value (Node's `ENOENT`, our typed errors' codes), or undefined. */
export function errorCode(e: unknown): string | undefined {
  if (typeof e !== "object" || e === null || !("code" in e)) return undefined;
  const code = (e as { code: unknown }).code;
  return typeof code === "string" ? code : undefined;
}
