/**
 * What a synchronous call threw, for tests that check an error's class, code and details.
 * @throws Error "expected a throw" when `fn` returns normally.
 */
export function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (e) {
    return e;
  }
  throw new Error("expected a throw");
}
