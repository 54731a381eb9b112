/**
 * The local snapshot repository on a temp directory: content addressing (equal layers stored
 * once), visibility only after publish, tombstones, removal, garbage collection (unreferenced
 * layers, staging of dead processes, grace period, pins of commits in progress), digest checks
 * and bad input.
 */
import { afterEach, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { hashFile, LocalRepository, newSnapshotId, parseManifest, SnapshotError, type SnapshotManifest } from "../../src/snapshot/index.ts";
import { commitFake } from "./helpers.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function repo(opts: Partial<{ verifyDigests: boolean; gcGraceMs: number }> = {}): LocalRepository {
  const d = mkdtempSync(join(tmpdir(), "snaprepo-"));
  dirs.push(d);
  return new LocalRepository(join(d, "snapshots"), { verifyDigests: true, gcGraceMs: 0, ...opts });
}

const sha = (s: string) => new Bun.CryptoHasher("sha256").update(s).digest("hex");

describe("local snapshot repository", () => {
  test("layers are content-addressed: equal bytes are stored once, under their sha256", () => {
    const r = repo();
    const a = commitFake(r, { disk: ["same bytes"], memory: ["m1"] });
    const b = commitFake(r, { disk: ["same bytes"], memory: ["m2"] });
    expect(a.disk.layers[0]).toEqual({ digest: `sha256:${sha("same bytes")}`, size: 10 });
    expect(b.disk.layers[0]).toEqual(a.disk.layers[0]!);
    const files = readdirSync(join(r.root, "layers")).sort();
    // disk (1, shared) + memory (2) + state (2)
    expect(files.length).toBe(5);
    expect(files).toContain(sha("same bytes"));
    expect(readFileSync(r.layerPath(a.disk.layers[0]!), "utf8")).toBe("same bytes");
    expect(statSync(r.layerPath(a.disk.layers[0]!)).mode & 0o777).toBe(0o444);
    // staging is empty once commits are done
    expect(readdirSync(join(r.root, "staging"))).toEqual([]);
  });

  test("a snapshot is visible only after publish; an aborted commit leaves nothing visible", () => {
    const r = repo();
    const txn = r.begin();
    const p = txn.file("layer");
    writeFileSync(p, "data");
    const ref = txn.addLayer(p);
    expect(r.list()).toEqual([]);
    txn.abort();
    expect(existsSync(txn.dir)).toBe(false);
    expect(r.list()).toEqual([]);
    // the layer was linked in but no manifest names it: garbage
    expect(r.gc().layers).toEqual([ref.digest]);
    expect(existsSync(r.layerPath(ref))).toBe(false);
  });

  test("publish refuses a manifest naming a layer the repository lacks, and a bad manifest", () => {
    const r = repo();
    const m = commitFake(r);
    const txn = r.begin();
    const missing: SnapshotManifest = { ...m, id: newSnapshotId(), disk: { ...m.disk, layers: [{ digest: `sha256:${"0".repeat(64)}`, size: 1 }] } };
    expect(() => txn.publish(missing)).toThrow(expect.objectContaining({ code: "snapshot.commit_failed" }));
    expect(r.find(missing.id)).toBeUndefined();
    expect(() => r.begin().publish({ ...m, id: "NOT-AN-ID" })).toThrow(expect.objectContaining({ code: "snapshot.bad_manifest" }));
    // the same id twice
    expect(() => r.begin().publish(m)).toThrow(expect.objectContaining({ code: "snapshot.commit_failed" }));
  });

  test("get/list/tombstone/remove; gc keeps what manifests (tombstoned too) name", () => {
    const r = repo();
    const a = commitFake(r, { disk: ["a-disk"], memory: ["a-mem"] });
    const b = commitFake(r, { disk: ["b-disk"], memory: null });
    expect(r.list().map((m) => m.id)).toEqual([a.id, b.id]);
    expect(r.get(a.id)).toEqual(a);
    r.tombstone(a.id);
    expect(r.isTombstoned(a.id)).toBe(true);
    expect(() => r.get(a.id)).toThrow(expect.objectContaining({ code: "snapshot.not_found" }));
    expect(r.find(a.id)?.id).toBe(a.id);
    expect(r.list().map((m) => m.id)).toEqual([b.id]);
    expect(r.list({ hidden: true }).map((m) => m.id)).toEqual([a.id, b.id]);
    expect(r.gc().layers).toEqual([]);
    r.remove(a.id);
    expect(r.find(a.id)).toBeUndefined();
    const gone = r.gc();
    expect(gone.layers.sort()).toEqual([a.disk.layers[0]!.digest, a.memory!.layers[0]!.digest, a.vmState!.digest].sort());
    expect(gone.bytes).toBe(a.disk.layers[0]!.size + a.memory!.layers[0]!.size + a.vmState!.size);
    expect(r.hasLayer(b.disk.layers[0]!)).toBe(true);
    expect(() => r.get("nosuchsnapshotxxxxxx")).toThrow(expect.objectContaining({ code: "snapshot.not_found" }));
    expect(() => r.get("../../etc/passwd")).toThrow(expect.objectContaining({ code: "snapshot.not_found" }));
  });

  test("gc spares young layers (grace), pinned layers, and staging of live processes; reaps dead ones", () => {
    const r = repo({ gcGraceMs: 60_000 });
    const txn = r.begin();
    const p = txn.file("l");
    writeFileSync(p, "young");
    const ref = txn.addLayer(p);
    // pinned by the open commit of this process
    expect(r.gc(undefined, Date.now() + 3_600_000).layers).toEqual([]);
    txn.abort();
    // unpinned but younger than the grace period
    expect(r.gc().layers).toEqual([]);
    expect(r.gc(undefined, Date.now() + 120_000).layers).toEqual([ref.digest]);
    // a staging folder of a dead process goes, one of a live process stays while young
    const dead = join(r.root, "staging", "999999999.abc");
    const live = join(r.root, "staging", `${process.ppid}.xyz`);
    mkdirSync(dead);
    mkdirSync(live);
    expect(r.gc().staging).toEqual(["999999999.abc"]);
    expect(existsSync(live)).toBe(true);
    const old = new Date(Date.now() - 3_600_000);
    utimesSync(live, old, old);
    expect(r.gc().staging).toEqual([`${process.ppid}.xyz`]);
  });

  test("a commit of another process: its recorded layers stay while it lives (grace or not); killed, they go at the next gc, within the grace", async () => {
    const r = repo({ gcGraceMs: 600_000 });
    const named = commitFake(r, { disk: ["named by a manifest"], memory: null });
    // a committer in another process: links a new layer and one equal to a named one, then waits
    const script = `
      import { writeFileSync } from "node:fs";
      import { LocalRepository } from ${JSON.stringify(join(import.meta.dir, "../../src/snapshot/index.ts"))};
      const r = new LocalRepository(process.argv[1], { verifyDigests: true, gcGraceMs: 600_000 });
      const txn = r.begin();
      for (const [name, text] of [["a", "only the child's"], ["b", "named by a manifest"]]) {
        const p = txn.file(name);
        writeFileSync(p, text);
        txn.addLayer(p);
      }
      console.log(txn.dir);
      await Bun.sleep(600_000);`;
    const child = Bun.spawn([process.execPath, "-e", script, r.root], { stdout: "pipe", stderr: "inherit" });
    try {
      const reader = child.stdout.getReader();
      let out = "";
      while (!out.includes("\n")) {
        const c = await reader.read();
        if (c.done) throw new Error(`committer exited: ${out}`);
        out += new TextDecoder().decode(c.value);
      }
      const stagingDir = out.trim();
      const childOnly = `sha256:${sha("only the child's")}`;
      expect(r.hasLayer({ digest: childOnly, size: 0 })).toBe(true);
      expect(readFileSync(join(stagingDir, ".linked-layers"), "utf8").split("\n").filter(Boolean).sort()).toEqual([childOnly, named.disk.layers[0]!.digest].sort());
      // older than the grace period and named by no manifest, yet the live commit lists it
      const old = new Date(Date.now() - 3_600_000);
      utimesSync(r.layerPath(childOnly), old, old);
      expect(r.gc()).toEqual({ layers: [], staging: [], bytes: 0 });
      // a layer nobody records (a writer of an older format) keeps the grace period
      const loose = `sha256:${sha("loose")}`;
      writeFileSync(r.layerPath(loose), "loose");
      child.kill("SIGKILL");
      await child.exited;
      const name = stagingDir.split("/").pop()!;
      // the killed commit's own layer goes at once (young or not: within the grace here), with
      // its staging folder; the layer it shares with a manifest and the unrecorded one stay
      utimesSync(r.layerPath(childOnly), new Date(), new Date());
      expect(r.gc()).toEqual({ layers: [childOnly], staging: [name], bytes: "only the child's".length });
      expect(existsSync(stagingDir)).toBe(false);
      expect(r.hasLayer(named.disk.layers[0]!)).toBe(true);
      expect(r.hasLayer({ digest: loose, size: 5 })).toBe(true);
      expect(r.gc(undefined, Date.now() + 3_600_000).layers).toEqual([loose]);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  });

  test("a layer recorded by a dead commit stays while a live commit lists it too, or a manifest names it", () => {
    const r = repo({ gcGraceMs: 600_000 });
    const f = (text: string) => `sha256:${sha(text)}`;
    for (const t of ["dead only", "dead and live", "dead and named"]) writeFileSync(r.layerPath(f(t)), t);
    const named = commitFake(r, { disk: ["dead and named"], memory: null });
    const dead = join(r.root, "staging", "999999999.dead");
    const live = join(r.root, "staging", `${process.ppid}.live`);
    mkdirSync(dead);
    mkdirSync(live);
    writeFileSync(join(dead, ".linked-layers"), [f("dead only"), f("dead and live"), f("dead and named"), "not a digest", ""].join("\n"));
    writeFileSync(join(live, ".linked-layers"), `${f("dead and live")}\n`);
    // a staging file (an adopt or fetch in progress) has no record and is not a commit folder
    writeFileSync(join(r.root, "staging", "999999999.fetch-x"), "partial");
    const g = r.gc();
    expect(g.layers).toEqual([f("dead only")]);
    expect(g.staging.sort()).toEqual(["999999999.dead", "999999999.fetch-x"]);
    expect(r.hasLayer({ digest: f("dead and live"), size: 0 })).toBe(true);
    expect(r.hasLayer(named.disk.layers[0]!)).toBe(true);
    expect(existsSync(live)).toBe(true);
    // the live commit gone too: its young layer now only has the grace period
    rmSync(live, { recursive: true });
    expect(r.gc().layers).toEqual([]);
    expect(r.gc(undefined, Date.now() + 3_600_000).layers).toEqual([f("dead and live")]);
  });

  test("verifyLayer: a changed or missing layer is a typed error; an intact one passes", () => {
    const r = repo();
    const m = commitFake(r, { disk: ["intact layer bytes"] });
    const ref = m.disk.layers[0]!;
    r.verifyLayer(ref);
    const path = r.layerPath(ref);
    rmSync(path);
    writeFileSync(path, "intact layer bytez"); // same size, one byte off
    expect(() => r.verifyLayer(ref)).toThrow(expect.objectContaining({ code: "snapshot.corrupt_layer", details: expect.objectContaining({ digest: ref.digest }) }));
    writeFileSync(path, "short");
    expect(() => r.verifyLayer(ref)).toThrow(expect.objectContaining({ code: "snapshot.corrupt_layer" }));
    rmSync(path);
    expect(() => r.verifyLayer(ref)).toThrow(expect.objectContaining({ code: "snapshot.corrupt_layer", message: expect.stringContaining("missing") }));
    expect(() => r.layerPath("sha256:xyz")).toThrow(SnapshotError);
  });

  test("hashFile and digestOf: sha256 and size of a file; digestOf remembers until the file changes", () => {
    const r = repo();
    const f = join(r.root, "outside");
    writeFileSync(f, "hello");
    expect(hashFile(f)).toEqual({ digest: `sha256:${sha("hello")}`, size: 5 });
    expect(r.digestOf(f).digest).toBe(`sha256:${sha("hello")}`);
    writeFileSync(f, "hello world");
    expect(r.digestOf(f)).toEqual({ digest: `sha256:${sha("hello world")}`, size: 11 });
    expect(() => hashFile(join(r.root, "absent"))).toThrow(expect.objectContaining({ code: "snapshot.corrupt_layer" }));
  });

  test("addLayer with keepSource links a file from outside the staging folder and leaves it", () => {
    const r = repo();
    const src = join(r.root, "..", "template.layer");
    writeFileSync(src, "template layer");
    const txn = r.begin();
    const ref = txn.addLayer(src, { keepSource: true });
    txn.abort();
    expect(existsSync(src)).toBe(true);
    expect(statSync(src).ino).toBe(statSync(r.layerPath(ref)).ino); // a hard link, no copy
  });

  test("parseManifest names the field at fault", () => {
    const r = repo();
    const m = commitFake(r);
    const bad = (patch: Record<string, unknown>) => () => parseManifest({ ...m, ...patch }, "t");
    expect(bad({ version: 2 })).toThrow(expect.objectContaining({ code: "snapshot.bad_manifest", details: expect.objectContaining({ field: "version" }) }));
    expect(bad({ kind: "other" })).toThrow(expect.objectContaining({ details: expect.objectContaining({ field: "kind" }) }));
    for (const kind of ["template", "user", "pause", "fork", "boot"] as const) expect(parseManifest({ ...m, kind }, "t").kind).toBe(kind);
    expect(bad({ names: ["bad name"] })).toThrow(expect.objectContaining({ details: expect.objectContaining({ field: "names" }) }));
    expect(bad({ disk: { virtualSize: 1, layers: [] } })).toThrow(expect.objectContaining({ details: expect.objectContaining({ field: "disk" }) }));
    expect(bad({ memory: null })).toThrow(expect.objectContaining({ details: expect.objectContaining({ field: "vmState" }) }));
    expect(bad({ vm: { ...m.vm, vcpus: 0 } })).toThrow(expect.objectContaining({ details: expect.objectContaining({ field: "vm.vcpus" }) }));
    // volume slots: a whole count, on a boot snapshot only
    expect(parseManifest({ ...m, kind: "boot", vm: { ...m.vm, volumeSlots: 2 } }, "t").vm.volumeSlots).toBe(2);
    expect(parseManifest({ ...m, kind: "boot", vm: { ...m.vm, volumeSlots: 16 } }, "t").vm.volumeSlots).toBe(16);
    for (const [kind, volumeSlots] of [["boot", -1], ["boot", 1.5], ["boot", "2"], ["boot", 17], ["template", 1]] as const) {
      expect(bad({ kind, vm: { ...m.vm, volumeSlots } })).toThrow(expect.objectContaining({ details: expect.objectContaining({ field: "vm.volumeSlots" }) }));
    }
    expect(() => parseManifest(null, "t")).toThrow(expect.objectContaining({ code: "snapshot.bad_manifest" }));
    // an unreadable manifest file is reported when asked for, skipped in listings
    writeFileSync(join(r.root, "manifests", "aaaaaaaaaaaaaaaaaaaa.json"), "{");
    expect(() => r.find("aaaaaaaaaaaaaaaaaaaa")).toThrow(expect.objectContaining({ code: "snapshot.bad_manifest" }));
    expect(r.list().map((x) => x.id)).toEqual([m.id]);
    // ... and keeps gc from removing any layer it might name
    r.remove(m.id);
    expect(r.gc().layers).toEqual([]);
    expect(r.hasLayer(m.disk.layers[0]!)).toBe(true);
    rmSync(join(r.root, "manifests", "aaaaaaaaaaaaaaaaaaaa.json"));
    expect(r.gc().layers.length).toBe(3);
  });
});
