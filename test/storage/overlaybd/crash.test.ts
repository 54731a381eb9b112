/**
 * Process crashes (SIGKILL) in the middle of writes and of a commit, in a real child process:
 * the upper reopens with every block either its synced content or a complete later write, and
 * an interrupted commit leaves no file under the layer's name.
 */
import { afterAll, expect, test } from "bun:test";
import { existsSync, writeFileSync } from "node:fs";
import { createUpper, openStack } from "../../../src/storage/overlaybd/index.ts";
import { scratch } from "./helpers.ts";

const tmp = scratch();
afterAll(() => tmp.cleanup());
const INDEX_TS = new URL("../../../src/storage/overlaybd/index.ts", import.meta.url).pathname;

/** Start `script` with bun; resolve once it printed `marker`; SIGKILL it `afterMs` later. */
async function crashAfter(script: string, marker: string, afterMs: number): Promise<void> {
  const path = tmp.path(`child-${Math.random().toString(36).slice(2)}.ts`);
  writeFileSync(path, script);
  const p = Bun.spawn([process.execPath, path], { stdout: "pipe", stderr: "inherit" });
  const reader = p.stdout.getReader();
  let seen = "";
  const deadline = Date.now() + 30_000;
  while (!seen.includes(marker)) {
    if (Date.now() > deadline) throw new Error("child never reached its marker");
    const { value, done } = await reader.read();
    if (done) throw new Error(`child exited early: ${seen}`);
    seen += new TextDecoder().decode(value);
  }
  await Bun.sleep(afterMs);
  p.kill("SIGKILL");
  expect(await p.exited).not.toBe(0);
}

test("SIGKILL during writes: every block holds a complete write", async () => {
  const up = { data: tmp.path("w.data"), index: tmp.path("w.index") };
  await createUpper(up, 4 << 20);
  await crashAfter(`
    import { openStack } from ${JSON.stringify(INDEX_TS)};
    const img = await openStack({ lowers: [], upper: ${JSON.stringify(up)} });
    const blk = new Uint8Array(4096);
    for (let i = 0; i < 1024; i++) { blk.fill(1); new DataView(blk.buffer).setUint32(0, i); await img.pwrite(blk, i * 4096); }
    await img.sync();
    console.log("synced");
    for (let k = 2; ; k++) {
      const i = k % 1024;
      blk.fill(k & 0xff || 1); new DataView(blk.buffer).setUint32(0, i);
      await img.pwrite(blk, i * 4096);
    }
  `, "synced", 300);
  const img = await openStack({ lowers: [], upper: up });
  const blk = new Uint8Array(4096);
  for (let i = 0; i < 1024; i++) {
    await img.pread(blk, i * 4096);
    expect(new DataView(blk.buffer).getUint32(0)).toBe(i);
    const v = blk[4];
    expect(v).not.toBe(0);
    expect(blk.subarray(4).every((x) => x === v)).toBe(true);
  }
  // still writable after the crash
  await img.pwrite(new Uint8Array(4096).fill(0xee), 0);
  await img.sync();
  await img.close();
}, 60_000);

test("SIGKILL during a commit: no layer appears under its name; a retry succeeds", async () => {
  const up = { data: tmp.path("c.data"), index: tmp.path("c.index") };
  await createUpper(up, 256 << 20);
  const img = await openStack({ lowers: [], upper: up });
  const chunk = new Uint8Array(1 << 20);
  for (let off = 0; off < 256 << 20; off += chunk.length) {
    chunk.fill((off >> 20) + 1);
    await img.pwrite(chunk, off);
  }
  await img.sync();
  await img.close();
  const out = tmp.path("c.layer");
  await crashAfter(`
    import { openStack } from ${JSON.stringify(INDEX_TS)};
    const img = await openStack({ lowers: [], upper: ${JSON.stringify(up)} });
    console.log("committing");
    await img.commit(${JSON.stringify(out)});
    console.log("done");
  `, "committing", 150);
  expect(existsSync(out)).toBe(false);
  const again = await openStack({ lowers: [], upper: up });
  await again.commit(out);
  await again.close();
  expect(existsSync(`${out}.partial`)).toBe(false);
  const layer = await openStack({ lowers: [out] });
  const r = new Uint8Array(4096);
  await layer.pread(r, 255 << 20);
  expect(r.every((x) => x === 0 || x === 256 % 256)).toBe(true);
  await layer.pread(r, 7 << 20);
  expect(r.every((x) => x === 8)).toBe(true);
  await layer.close();
}, 120_000);
