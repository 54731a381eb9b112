// The whole tree (src, test, bench, services, scripts) type-checks under the pinned TypeScript,
// and so does the browser console (src/console/web: its own tsconfig, DOM and JSX).
import { expect, test } from "bun:test";
import { join } from "node:path";

const root = join(import.meta.dir, "..");

async function tsc(project: string): Promise<{ errors: string[]; code: number }> {
  const proc = Bun.spawn([join(root, "node_modules/.bin/tsc"), "--noEmit", "-p", project], { cwd: root, stdout: "pipe", stderr: "pipe" });
  const [out, code] = await Promise.all([new Response(proc.stdout).text(), proc.exited]);
  return { errors: out.split("\n").filter((l) => l.includes("error TS")), code };
}

test("tsc --noEmit reports no errors", async () => {
  const r = await tsc(root);
  expect(r.errors).toEqual([]);
  expect(r.code).toBe(0);
}, 240_000);

test("tsc --noEmit reports no errors in the browser console", async () => {
  const r = await tsc(join(root, "src/console/web"));
  expect(r.errors).toEqual([]);
  expect(r.code).toBe(0);
}, 240_000);
