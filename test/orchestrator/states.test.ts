import { expect, test } from "bun:test";
import { assertTransition, canTransition, publicState, parseState, SANDBOX_STATES, TRANSITIONS } from "../../src/orchestrator/states.ts";
import { OrchestratorError } from "../../src/orchestrator/errors.ts";

test("transition table: exactly the documented edges are allowed", () => {
  const allowed = new Set<string>();
  for (const from of SANDBOX_STATES) for (const to of SANDBOX_STATES) if (canTransition(from, to)) allowed.add(`${from}>${to}`);
  expect([...allowed].sort()).toEqual(
    [
      "creating>running", "creating>failed",
      "running>pausing", "running>killing", "running>failed",
      "pausing>paused", "pausing>running", "pausing>failed",
      "paused>resuming", "paused>killing",
      "resuming>running", "resuming>paused", "resuming>failed",
      "killing>killed", "killing>failed",
      "failed>killing", "failed>killed",
    ].sort(),
  );
  expect(TRANSITIONS.killed).toEqual([]);
});


test("a disallowed transition is orchestrator.bad_transition with details", () => {
  let err: unknown;
  try {
    assertTransition("abc", "killed", "running");
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(OrchestratorError);
  expect((err as OrchestratorError).code).toBe("orchestrator.bad_transition");
  expect((err as OrchestratorError).details).toEqual({ sandboxId: "abc", from: "killed", to: "running" });
  expect(() => assertTransition("abc", "paused", "resuming")).not.toThrow();
});

test("public states are E2B's running/paused; killed and failed do not exist for clients", () => {
  expect(SANDBOX_STATES.map((s) => publicState(s))).toEqual(["running", "running", "paused", "paused", "running", null, null, null]);
  expect(parseState("x", "paused")).toBe("paused");
  expect(() => parseState("x", "zombie")).toThrow(OrchestratorError);
});
