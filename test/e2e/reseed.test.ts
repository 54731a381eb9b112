/**
 * Fresh randomness in every clone (issue 28): `agentenv server` in a private namespace, the
 * unmodified SDK, real QEMU guests. Every VM here is a restore of one lineage (the base template's
 * snapshot, and snapshots taken from its sandboxes): restores of a user snapshot (and the sandbox
 * it was taken of, running on), fork children (and their parent), restore-pool adoptions, and a
 * resumed sandbox (and restores of its pause state). Each reads a UUID and 16 urandom bytes as its
 * first command: all of them differ from each other (≥ 50 pairs, 0 equal), and envd reports it
 * reseeded the kernel generator from the /init entropy. Without the reseed, clones of one snapshot
 * print the same UUID (the issue saw it in 3 of 5 runs).
 */
import { afterAll, expect, test } from "bun:test";
import { logLines, NodeWorld, vmPrerequisites } from "./world.ts";

const missing = vmPrerequisites();
let world: NodeWorld | undefined;
afterAll(async () => {
  await world?.dispose();
}, 60_000);

type Read = { group: string; id: string; uuid: string; bytes: string; reseeds: number };

async function untilLogged(w: NodeWorld, msg: string, n: number): Promise<void> {
  for (let i = 0; i < 1200; i++) {
    if (logLines(w, msg).length >= n) return;
    await Bun.sleep(100);
  }
  throw new Error(`the node did not log ${n} x "${msg}": ${w.log.slice(-3000)}`);
}

test("restores, fork children, pool adoptions and a resume each read a UUID and urandom bytes of their own first thing", async () => {
  if (missing) throw new Error(`VM prerequisites missing: ${missing}`);
  world = new NodeWorld();
  const w = world;
  // creates race the pool filling (three TCG restores at once): a loaded host needs minutes
  await w.start({ AENV_LOG_LEVEL: "info", AENV__orchestrator__create_timeout_ms: "600000", AENV__pool__restore__low_watermark: "1", AENV__pool__restore__high_watermark: "2", AENV__pool__restore__fill_delay_ms: "0" });
  const reads: Read[] = [];
  const run = async (...args: string[]) => reads.push(...(await w.client<{ reads: Read[] }>("reseed.ts", args, 600_000)).reads);
  // the first create of base makes it the pooled snapshot; the next ones adopt VMs restored ahead
  await run("pool", "1");
  await untilLogged(w, "restore pool VM ready", 2);
  await run("pool", "2");
  expect(logLines(w, "sandbox started from the restore pool").length).toBe(2);
  await run("restores");
  await run("forks");
  await run("resume");
  const groups = Object.fromEntries(["pool", "restores", "forks", "resume"].map((g) => [g, reads.filter((r) => r.group === g).length]));
  expect(groups).toEqual({ pool: 3, restores: 6, forks: 5, resume: 4 });
  for (const r of reads) {
    expect(r.uuid).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(r.bytes).toMatch(/^[0-9a-f]{32}$/);
  }
  // every VM derives from the base template's snapshot: every pair is a pair of clones
  let pairs = 0;
  const equal: string[] = [];
  for (let i = 0; i < reads.length; i++) {
    for (let j = i + 1; j < reads.length; j++) {
      pairs++;
      if (reads[i]!.uuid === reads[j]!.uuid || reads[i]!.bytes === reads[j]!.bytes) equal.push(`${reads[i]!.group}/${reads[i]!.id} = ${reads[j]!.group}/${reads[j]!.id}`);
    }
  }
  expect(pairs).toBeGreaterThanOrEqual(50);
  expect(equal).toEqual([]);
  // and each of them was reseeded by its envd (a restored envd counts every reseed it made)
  expect(reads.filter((r) => r.reseeds < 1).map((r) => `${r.group}/${r.id}`)).toEqual([]);
}, 900_000);
