/**
 * SDK parity end to end (issue 13) with the real parts: `agentenv server` with QEMU microVMs
 * booting the base template, envd in the guest, driven by the unmodified e2b SDK pinned in
 * package.json (raw HTTP where it has no call). One node for the file, metrics sampled every 1 s.
 */
import { expect, test } from "bun:test";
import { bootManifests, logLines, nodeForFile } from "./world.ts";

const node = nodeForFile({ AENV__metrics__sample_interval_ms: "1000", AENV_LOG_LEVEL: "info" });

test("getMetrics() shows a 10 s CPU-bound command and the guest's memory; logs name create, pause and a console line", async () => {
  const world = node();
  const o = await world.client("parity-telemetry.ts");
  // the first read found no sample (nobody had asked) and took one; from then on it is watched
  expect(o.metricsBefore).toBeGreaterThanOrEqual(1);
  const during = (o.metrics as any[]).filter((m) => m.at > o.busyFrom + 1500 && m.at < o.busyTo);
  expect(during.length).toBeGreaterThan(2);
  // one vCPU spinning: the guest sees it nearly all busy
  expect(Math.max(...during.map((m) => m.cpuUsedPct))).toBeGreaterThan(80);
  for (const m of o.metrics) {
    expect(m.cpuCount).toBe(1);
    // 512 MiB guest: MemTotal is what the kernel kept after its own reservations
    expect(m.memTotal).toBeGreaterThan(400 * 1048576);
    expect(m.memTotal).toBeLessThanOrEqual(512 * 1048576);
    expect(m.memUsed).toBeGreaterThan(10 * 1048576);
    expect(m.memUsed).toBeLessThan(m.memTotal);
    expect(m.diskTotal).toBeGreaterThan(1024 * 1048576);
    expect(m.diskUsed).toBeGreaterThan(100 * 1048576);
  }
  expect(o.prometheus).toContain(`agentenv_sandbox_cpu_count{sandbox_id="${o.id}"} 1`);
  expect(o.paused).toBe(true);
  expect(o.metricsWhilePaused).toBeGreaterThanOrEqual(o.metrics.length);
  expect(o.logsStatus).toBe(200);
  const lines = (o.logs as any[]).map((e) => `${e.source}:${e.message}`);
  const idx = (s: string) => lines.findIndex((l) => l.includes(s));
  expect(idx("lifecycle:sandbox created")).toBeGreaterThan(0);
  expect(idx("console:parity-console-marker-42")).toBeGreaterThan(idx("lifecycle:sandbox created"));
  expect(idx("lifecycle:sandbox paused")).toBeGreaterThan(idx("console:parity-console-marker-42"));
  // envd's own lines are there too (the sandbox is a restore of the template's snapshot: the
  // guest's boot lines were printed when the template was committed, not here)
  expect(lines.some((l) => l.startsWith("envd:"))).toBe(true);
  expect(o.killed).toBe(true);
  console.log(`parity telemetry: ${o.metrics.length} samples, busy max ${Math.max(...during.map((m) => m.cpuUsedPct))}%, ${lines.length} log lines`);
  expect(o.logsAfterKill).toMatchObject({ status: 404, body: { code: 404 } });
}, 300_000);

test("cpuCount / memoryMB at create are the guest's real vCPUs and RAM; oversize asks are a 400 naming the limit", async () => {
  const o = await node().client("parity-resources.ts");
  expect(o.createStatus).toBe(201);
  expect(o.nproc).toBe("2");
  // MemTotal is the RAM the guest was given minus what the kernel reserved at boot
  expect(o.memTotalKb).toBeGreaterThan(640 * 1024);
  expect(o.memTotalKb).toBeLessThanOrEqual(768 * 1024);
  expect(o.info).toEqual({ cpuCount: 2, memoryMB: 768 });
  expect(o.oversize).toEqual({
    status: 400,
    body: { code: 400, message: "cpuCount 64 (requested) is outside 1..8, this node's limit [orchestrator] max_cpu_count", error_code: "orchestrator.bad_request" },
  });
}, 300_000);

test("a volume written by one sandbox survives its pause, kill and a node restart; two read-only sandboxes read it; 409 while mounted", async () => {
  const world = node();
  const o = await world.client("parity-volumes.ts", [], 400_000);
  expect(o.aWrite).toEqual({ exitCode: 0, stdout: "user\next4\n", stderr: "" });
  // the guest sees the volume's own drive: 1 GiB ([volumes] size_mib), writable, its id as the
  // serial (not the 64 MiB read-write placeholder of the boot snapshot it was restored from)
  expect(o.aDrive).toEqual({ exitCode: 0, stdout: `${(1024 * 1048576) / 512} 0 ${o.volumeId}\n`, stderr: "" });
  expect(o.info).toEqual([{ name: "e2e-data", path: "/mnt/data" }]);
  expect(o.apiReadWhileRunning).toBe("written-by-a\n");
  // created through A's envd with the default owner (the templates' user, uid 1000) and mode 644
  expect(o.aSeesApiFile).toEqual({ exitCode: 0, stdout: "put through the APIuser 644\n", stderr: "" });
  expect(o.apiList).toEqual(["a.txt", "from-api.txt", "lost+found"]);
  expect(o.paused).toBe(true);
  expect(o.afterResume).toEqual({ exitCode: 0, stdout: "written-by-a\n", stderr: "" });
  expect(o.destroyWhileMounted).toEqual({ name: "VolumeError", message: `409: volume ${o.volumeId} is mounted by sandbox ${o.idA}; kill it first` });
  expect(o.secondWriter).toMatchObject({ status: 409, body: { code: 409, error_code: "orchestrator.volume_in_use" } });
  expect(o.killA).toBe(true);
  // what A wrote right before its kill reached the volume's disk (synced and unmounted in the guest first)
  expect(o.apiReadAfterKill).toBe("written-by-a\nmore\n");
  expect(o.readers).toHaveLength(2);
  for (const r of o.readers) {
    expect(r.read).toEqual({ exitCode: 0, stdout: "written-by-a\nmore\nput through the API", stderr: "" });
    expect(r.write.exitCode).not.toBe(0);
    expect(r.write.stderr).toContain("Read-only file system");
    // read-only in the guest's block layer too: the re-probe read the drive's flag
    expect(r.drive).toEqual({ exitCode: 0, stdout: `${(1024 * 1048576) / 512} 1 ${o.volumeId}\n`, stderr: "" });
  }
  // every create with the volume restored a boot snapshot with one volume slot (made by the
  // first), none booted the kernel; A's resume restored its pause (memory and all)
  const slotted = bootManifests(world).filter((m) => m.vm.volumeSlots === 1);
  expect(slotted).toHaveLength(1);
  expect(logLines(world, "boot snapshot committed").filter((l) => l.volumeSlots === 1)).toHaveLength(1);
  const ours = (l: Record<string, any>) => [o.idA, ...o.readerIds].includes(l.sandboxId);
  expect(logLines(world, "sandbox booted from a boot snapshot").filter(ours).map((l) => [l.sandboxId, l.bootSnapshot === slotted[0]!.id])).toEqual([
    [o.idA, true],
    [o.readerIds[0], true],
    [o.readerIds[1], true],
  ]);
  expect(logLines(world, "sandbox booted").filter(ours)).toEqual([]);
  expect(logLines(world, "sandbox restored").filter(ours).map((l) => l.sandboxId)).toEqual([o.idA]);
  expect(o.apiReadBesideReaders).toBe("put through the API");
  expect(o.apiWriteBesideReaders).toContain("read-only");

  expect(await world.stop()).toBe(0);
  await world.start({ AENV__metrics__sample_interval_ms: "1000", AENV_LOG_LEVEL: "info" });
  const p = await world.client("parity-volumes-2.ts", [o.volumeId], 300_000);
  expect(p.listed).toEqual(["e2e-data"]);
  expect(p.apiRead).toBe("written-by-a\nmore\n");
  expect(p.dRead).toBe("written-by-a\nmore\nput through the API");
  expect(p.dSerials).toBe(`/mnt/vol ${o.volumeId}\n/mnt/more ${p.moreId}\n`);
  expect(p.dWrite).toBe(0);
  expect(p.moreRead).toBe("d-was-here\n");
  expect(p.apiReadAfterD).toBe("written-by-a\nmore\nd-too\n");
  // two volumes: a boot snapshot with two volume slots, made for D; the one-slot one is kept
  expect(bootManifests(world).filter((m) => m.vm.volumeSlots).map((m) => m.vm.volumeSlots).sort()).toEqual([1, 2]);
  const two = bootManifests(world).find((m) => m.vm.volumeSlots === 2);
  expect(logLines(world, "sandbox booted from a boot snapshot").filter((l) => l.sandboxId === p.dId).map((l) => l.bootSnapshot)).toEqual([two!.id]);
  expect(p.destroyedMore).toBe(true);
  expect(p.destroyed).toBe(true);
  expect(p.listedAfter).toEqual([]);
}, 700_000);

test("filesystem-only snapshots: pause({keepMemory:false}), autoPauseMemory:false and onResume 'reboot' cold-boot on the kept disk; traffic does not resume them", async () => {
  const o = await node().client("parity-fsonly.ts", [], 600_000);
  expect(o.sleeperBefore).toBe("1");
  expect(o.paused).toBe(true);
  expect(o.stateAfterPause).toBe("paused");
  expect(o.trafficWhilePaused).toStartWith("error:");
  expect(o.stateAfterTraffic).toBe("paused");
  // a new boot: new boot id, no processes of the old one; the disk, the volume and envd's setup kept
  expect(o.after.boot).not.toBe(o.bootBefore);
  expect(o.after.boot).toMatch(/^[0-9a-f-]{36}$/);
  expect(o.after.file).toBe("on-disk\n");
  expect(o.after.volume).toBe("in-volume\n");
  expect(o.after.sleepers).toBe("0");
  expect(o.after.env).toBe("kept\n");
  expect(o.after.whoami).toBe("user\n/home/user\n");
  expect(o.lifecycle).toEqual(expect.arrayContaining(["sandbox paused", "sandbox resumed", "sandbox cold-booted on its disk (no memory restored)"]));
  expect(o.killA).toBe(true);
  expect(o.volumeAfter).toBe("in-volume\n");

  expect(o.stateB).toBe("paused");
  expect(o.afterB.boot).not.toBe(o.bootB.split("\n")[0]);
  expect(o.afterB.home).toBe("b");
  // the resume's cold boot keeps /tmp (on the root disk): only a sandbox's first boot empties it
  expect(o.afterB.tmp).toBe("b");

  expect(o.afterC.boot).not.toBe(o.bootC.split("\n")[0]);
  expect(o.afterC.file).toBe("c");
  expect(o.afterC3).toBe(o.afterC.boot);
}, 700_000);
