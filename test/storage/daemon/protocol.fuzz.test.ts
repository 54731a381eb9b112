/**
 * Fuzz test of the disk daemon protocol's readers (src/storage/daemon/protocol.ts, messages.ts;
 * untrusted input: whatever a process connecting to the daemon's socket sends, and what the
 * node reads back). From fixed seeds:
 * - 4,000 byte streams of frames fed in random chunks: valid streams come out exact, cut streams
 *   yield the frames before the cut and hold the rest, mutated and random ones yield only JSON
 *   objects or typed errors (`disk.malformed_frame`, or `disk.frame_too_large` after which the
 *   reader is done), and the reader never holds more than one frame (prefix + limit);
 * - 6,000 requests: valid ones of every kind parse unchanged; ones with a field replaced, dropped
 *   or retyped either parse or throw DiskError `disk.bad_request` naming a field of the request;
 * - responses with mutated fields are accepted or named as bad, never thrown.
 */
import { describe, expect, test } from "bun:test";
import { DiskError } from "../../../src/storage/errors.ts";
import { encodeFrame, FRAME_HEADER, FrameReader, parseRequest, parseResponse, REQUEST_KINDS } from "../../../src/storage/daemon/protocol.ts";
import { Fuzz, show } from "../../helpers/fuzz.ts";

const MAX = 512;

/** A random JSON value (depth-bounded). */
function json(f: Fuzz, depth = 0): unknown {
  switch (f.int(0, depth > 2 ? 5 : 7)) {
    case 0:
      return null;
    case 1:
      return f.pick([true, false]);
    case 2:
      return f.pick([0, -1, 1.5, 512, 4096, 2 ** 53, -0, 1e300]);
    case 3:
      return f.pick(["", "/a/b", "../x", "/x/../y", "sb-1", "a".repeat(f.int(0, 200)), "é\u0000", "raw", "overlaybd", "fuse", "ublk"]);
    case 4:
      return Buffer.from(f.bytes(f.int(0, 12))).toString("latin1");
    case 5:
      return f.int(-5, 70_000);
    case 6:
      return Array.from({ length: f.int(0, 4) }, () => json(f, depth + 1));
    default:
      return Object.fromEntries(Array.from({ length: f.int(0, 4) }, (_, i) => [f.pick(["kind", "seq", "dev_id", "target", "x", `k${i}`]), json(f, depth + 1)]));
  }
}

describe("frames", () => {
  test("4000 valid, cut, mutated and random streams in random chunks: frames exact or typed, never more than one frame held", () => {
    const f = new Fuzz(0xd15c_0001);
    let refused = 0;
    for (let i = 0; i < 4000; i++) {
      const msgs = Array.from({ length: f.int(0, 5) }, () => ({ kind: f.pick(["list", "ok", "x"]), seq: f.int(0, 1000), pad: "p".repeat(f.int(0, MAX - 60)) }));
      const frames = msgs.map((m) => encodeFrame(m));
      const bytes = Uint8Array.from(frames.flatMap((x) => [...x]));
      const kind = i % 4;
      const input = kind === 0 ? bytes : kind === 1 ? f.truncate(bytes) : kind === 2 ? f.mutate(bytes) : f.bytes(f.int(0, 400));
      const r = new FrameReader(MAX);
      const out: ReturnType<FrameReader["push"]> = [];
      const step = f.pick([1, 3, 64, 4096]);
      for (let at = 0; at < input.length; at += step) {
        const got = r.push(input.slice(at, at + step));
        out.push(...got);
        if (r.pending > FRAME_HEADER + MAX) throw new Error(`case ${i} ${show(input)}: ${r.pending} bytes held`);
      }
      let dead = false;
      for (const fr of out) {
        if (dead) throw new Error(`case ${i} ${show(input)}: a frame after a fatal one`);
        if (fr.ok) {
          expect(typeof fr.value === "object" && fr.value !== null && !Array.isArray(fr.value)).toBe(true);
          continue;
        }
        refused++;
        expect(fr.error).toBeInstanceOf(DiskError);
        expect(fr.error.code).toBe(fr.fatal ? "disk.frame_too_large" : "disk.malformed_frame");
        dead = fr.fatal;
      }
      if (kind === 0) expect(out).toEqual(msgs.map((m) => ({ ok: true, value: m })));
      if (kind === 1) {
        let end = 0;
        let whole = 0;
        while (whole < frames.length && end + frames[whole]!.length <= input.length) end += frames[whole++]!.length;
        expect(out).toEqual(msgs.slice(0, whole).map((m) => ({ ok: true, value: m })));
        expect(r.pending).toBe(input.length - end);
      }
    }
    expect(refused).toBeGreaterThan(500);
  });
});

describe("requests", () => {
  const raw = { kind: "raw", path: "/x/b.raw", read_only: true };
  const stack = { kind: "overlaybd", lowers: ["/t/l0", "/t/l1"], upper: { data: "/s/u.data", index: "/s/u.index" }, create_upper_size: 4096 };
  const valid: Record<string, unknown>[] = [
    { kind: "get_features", seq: 1 },
    { kind: "create_runtime_device", dev_id: "sb-1", engine: "fuse", target: stack, fuse: { mount_point: "/m", file_name: "root.img", direct_io: false } },
    { kind: "delete", dev_id: "sb-1" },
    { kind: "restack_snapshot", dev_id: "sb-2", output_layer_path: "/s/layer", next_upper: { data: "/s/n.data", index: "/s/n.index" } },
    { kind: "acquire", access_mode: "shared", share_key: "snap-1", target: raw },
    { kind: "acquire", access_mode: "exclusive", dev_id: "sb-3", target: stack },
    { kind: "release", dev_id: "shared.snap-1" },
    { kind: "update_size", dev_id: "sb-2", new_size: 8192 },
    { kind: "hold", dev_id: "sb-2", holder_pid: 10, holder_fd: 3 },
    { kind: "list" },
    { kind: "stats", dev_id: "sb-2" },
    { kind: "shutdown", seq: 0 },
  ];

  /** Every dotted field of `v` (nested objects; list elements are their list's field). */
  function fields(v: unknown, prefix = ""): string[] {
    if (typeof v !== "object" || v === null || Array.isArray(v)) return [];
    return Object.entries(v).flatMap(([k, x]) => [prefix + k, ...fields(x, `${prefix}${k}.`)]);
  }

  /** A copy of `v` with one nested field replaced by a random value, dropped, or one added. */
  function mutateField(f: Fuzz, v: Record<string, unknown>): Record<string, unknown> {
    const out = structuredClone(v);
    const all = fields(out);
    const path = f.pick(all.length ? all : ["kind"]).split(".");
    let o: Record<string, unknown> = out;
    for (const k of path.slice(0, -1)) o = o[k] as Record<string, unknown>;
    const last = path[path.length - 1]!;
    switch (f.int(0, 2)) {
      case 0:
        o[last] = json(f);
        break;
      case 1:
        delete o[last];
        break;
      default:
        o[f.pick(["extra", "seq", "engine", "fuse", "upper", "upper_read_only"])] = json(f);
    }
    return out;
  }

  test("every kind's valid request parses unchanged", () => {
    expect(new Set(valid.map((v) => v.kind))).toEqual(new Set(REQUEST_KINDS));
    for (const v of valid) expect(parseRequest(structuredClone(v)) as unknown).toEqual(v);
  });

  test("6000 requests with a field replaced, dropped or added: parsed, or disk.bad_request naming a field", () => {
    const f = new Fuzz(0xd15c_0002);
    const counts = { parsed: 0, refused: 0 };
    for (let i = 0; i < 6000; i++) {
      const v = i % 3 === 2 ? (json(f) as Record<string, unknown>) : mutateField(f, f.pick(valid));
      if (typeof v !== "object" || v === null || Array.isArray(v)) continue;
      const before = JSON.stringify(v);
      try {
        const r = parseRequest(v);
        counts.parsed++;
        // a request that passes is the object sent, unchanged
        expect(JSON.stringify(r)).toBe(before);
      } catch (e) {
        if (!(e instanceof DiskError) || e.code !== "disk.bad_request") throw new Error(`case ${i} ${before}: unexpected ${e}`);
        counts.refused++;
        const field = String(e.details.field);
        // the field named is one of the request's, or one it lacks that its kind requires
        expect(field).toMatch(/^[a-z_]+(\.[a-z_]+)*$/);
        expect(e.message).toStartWith(`bad request: ${field} `);
      }
    }
    expect(counts.parsed).toBeGreaterThan(300);
    expect(counts.refused).toBeGreaterThan(2000);
  });
});

describe("responses", () => {
  test("3000 answers with a field replaced: accepted or named as bad, never thrown", () => {
    const f = new Fuzz(0xd15c_0003);
    const good: Record<string, unknown>[] = [
      { kind: "devices", seq: 1, devices: [{ dev_id: "a", engine: "fuse", path: "/m/disk.img", access: "exclusive", refcount: 1, fuse_fd: 9 }], lost: [{ dev_id: "b", engine: "ublk", reason: "gone", at: 5 }] },
      { kind: "released", seq: 2, dev_id: "a", refcount: 0 },
      { kind: "error", seq: 3, code: "disk.not_found", message: "no a", details: { devId: "a" } },
      { kind: "device_lost", dev_id: "a", engine: "fuse", reason: "r", at: 1 },
    ];
    for (const g of good) expect(parseResponse(structuredClone(g)) as unknown).toEqual({ ok: true, value: g });
    let bad = 0;
    for (let i = 0; i < 3000; i++) {
      const v = structuredClone(f.pick(good));
      const keys = Object.keys(v);
      v[f.pick(keys)] = json(f);
      const r = parseResponse(v);
      if (!r.ok) {
        bad++;
        expect(typeof r.field).toBe("string");
        expect(r.why.length).toBeGreaterThan(0);
      }
    }
    expect(bad).toBeGreaterThan(1000);
  });
});
