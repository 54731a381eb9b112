// The whole tree (src, test, bench, services, scripts) type-checks under the pinned TypeScript.
import { expect, test } from "bun:test";
import { join } from "node:path";

test("tsc --noEmit reports no errors", async () => {
  const root = join(import.meta.dir, "..");
  const proc = Bun.spawn([join(root, "node_modules/.bin/tsc"), "--noEmit", "-p", root], { cwd: root, stdout: "pipe", stderr: "pipe" });
  const [out, code] = await Promise.all([new Response(proc.stdout).text(), proc.exited]);
  const errors = out.split("\n").filter((l) => l.includes("error TS"));
  expect(errors).toEqual([]);
  expect(code).toBe(0);
}, 240_000);
