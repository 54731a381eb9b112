// Unit tests of the disk daemon's wire protocol (src/storage/daemon/protocol.ts): frame encoding
// (4-byte big-endian length + JSON), splitting a byte stream into frames, malformed and oversize
// frames, the validation of every request kind, and the error codes on the wire: the daemon
// sends only DiskError codes, the client refuses any other. No daemon, no root.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DaemonClient } from "../../../src/storage/daemon/client.ts";
import { encodeFrame, errorResponse, FrameReader, parseRequest, REQUEST_KINDS } from "../../../src/storage/daemon/protocol.ts";
import { DISK_ERRORS, DiskError } from "../../../src/storage/errors.ts";
import { SyscallError } from "../../../src/ffi/errors.ts";
import { UblkError } from "../../../src/storage/ublk/errors.ts";

const frame = (body: string | Uint8Array) => {
  const b = typeof body === "string" ? new TextEncoder().encode(body) : body;
  const out = new Uint8Array(4 + b.byteLength);
  new DataView(out.buffer).setUint32(0, b.byteLength, false);
  out.set(b, 4);
  return out;
};

function refused(v: Record<string, unknown>): { code: string; field: unknown } {
  try {
    parseRequest(v);
  } catch (e) {
    expect(e).toBeInstanceOf(DiskError);
    return { code: (e as DiskError).code, field: (e as DiskError).details.field };
  }
  throw new Error(`accepted ${JSON.stringify(v)}`);
}

describe("frames", () => {
  test("a frame is a big-endian length and the JSON bytes", () => {
    const f = encodeFrame({ kind: "list", seq: 7 });
    const json = '{"kind":"list","seq":7}';
    expect(Array.from(f.subarray(0, 4))).toEqual([0, 0, 0, json.length]);
    expect(new TextDecoder().decode(f.subarray(4))).toBe(json);
  });

  test("frames split across chunks and several in one chunk come out whole and in order", () => {
    const r = new FrameReader(1024);
    const a = encodeFrame({ kind: "list", seq: 1 });
    const b = encodeFrame({ kind: "get_features", seq: 2 });
    const all = new Uint8Array([...a, ...b]);
    expect(r.push(all.subarray(0, 3))).toEqual([]);
    expect(r.push(all.subarray(3, a.length + 5))).toEqual([{ ok: true, value: { kind: "list", seq: 1 } }]);
    expect(r.pending).toBe(5);
    expect(r.push(all.subarray(a.length + 5))).toEqual([{ ok: true, value: { kind: "get_features", seq: 2 } }]);
    expect(r.pending).toBe(0);
    const two = r.push(all);
    expect(two.map((f) => (f.ok ? f.value.seq : null))).toEqual([1, 2]);
  });

  test("malformed frames are reported one by one and the stream continues", () => {
    const r = new FrameReader(1024);
    const out = r.push(new Uint8Array([...frame("{not json"), ...frame("[1,2]"), ...frame(new Uint8Array([0xff, 0xfe])), ...frame('"str"'), ...encodeFrame({ kind: "list" })]));
    expect(out.map((f) => (f.ok ? "ok" : `${f.error.code}:${f.fatal}`))).toEqual([
      "disk.malformed_frame:false", "disk.malformed_frame:false", "disk.malformed_frame:false", "disk.malformed_frame:false", "ok",
    ]);
  });

  test("an oversize length is fatal: reported once, then nothing more is read", () => {
    const r = new FrameReader(100);
    const head = new Uint8Array(4);
    new DataView(head.buffer).setUint32(0, 101, false);
    const out = r.push(new Uint8Array([...encodeFrame({ kind: "list" }), ...head, 1, 2, 3]));
    expect(out.length).toBe(2);
    expect(out[0]!.ok).toBe(true);
    expect(out[1]!.ok).toBe(false);
    if (!out[1]!.ok) {
      expect(out[1]!.error.code).toBe("disk.frame_too_large");
      expect(out[1]!.error.details).toEqual({ length: 101, max: 100 });
      expect(out[1]!.fatal).toBe(true);
    }
    expect(r.push(encodeFrame({ kind: "list" }))).toEqual([]);
    // exactly at the limit is fine
    const ok = new FrameReader(100);
    const body = `{"kind":"list","pad":"${"x".repeat(100 - 24)}"}`;
    expect(body.length).toBe(100);
    expect(ok.push(frame(body))[0]!.ok).toBe(true);
  });
});

describe("requests", () => {
  const raw = { kind: "raw", path: "/x/b.raw", read_only: false };
  const stack = { kind: "overlaybd", lowers: ["/t/l0", "/t/l1"], upper: { data: "/s/u.data", index: "/s/u.index" }, create_upper_size: 0 };

  test("every request kind has a valid form that parses unchanged", () => {
    const good: Record<string, unknown>[] = [
      { kind: "get_features" },
      { kind: "create_runtime_device", seq: 3, dev_id: "sb-1", target: raw, fuse: { mount_point: "/m", file_name: "root.img", direct_io: true } },
      { kind: "create_runtime_device", dev_id: "sb-2", engine: "fuse", target: stack },
      { kind: "delete", dev_id: "sb-1" },
      { kind: "restack_snapshot", dev_id: "sb-2", output_layer_path: null, next_upper: { data: "/s/n.data", index: "/s/n.index" } },
      { kind: "restack_snapshot", dev_id: "sb-2", output_layer_path: "/s/layer", next_upper: { data: "/s/n.data", index: "/s/n.index" } },
      { kind: "acquire", access_mode: "exclusive", dev_id: "sb-3", target: stack },
      { kind: "acquire", access_mode: "shared", share_key: "snap-1", target: { kind: "overlaybd", lowers: ["/m/l0"], accept_writable_open: true } },
      { kind: "create_runtime_device", dev_id: "vol-1", target: { kind: "overlaybd", lowers: ["/v/base.layer"], upper: { data: "/v/u.data", index: "/v/u.index" }, upper_read_only: true } },
      { kind: "release", dev_id: "shared.snap-1" },
      { kind: "update_size", dev_id: "sb-2", new_size: 4096 },
      { kind: "hold", dev_id: "sb-2", holder_pid: 1, holder_fd: 9 },
      { kind: "list" },
      { kind: "stats", dev_id: "sb-2" },
      { kind: "shutdown" },
    ];
    for (const g of good) expect(parseRequest(g) as unknown).toEqual(g);
    expect(new Set(good.map((g) => g.kind))).toEqual(new Set(REQUEST_KINDS));
  });

  test("bad requests are refused with disk.bad_request naming the field", () => {
    const cases: [Record<string, unknown>, string][] = [
      [{}, "kind"],
      [{ kind: "format_disk" }, "kind"],
      [{ kind: "list", seq: -1 }, "seq"],
      [{ kind: "list", seq: 1.5 }, "seq"],
      [{ kind: "delete" }, "dev_id"],
      [{ kind: "delete", dev_id: "../x" }, "dev_id"],
      [{ kind: "delete", dev_id: "a".repeat(129) }, "dev_id"],
      [{ kind: "create_runtime_device", dev_id: "a", target: raw, engine: "nbd" }, "engine"],
      [{ kind: "create_runtime_device", dev_id: "a" }, "target"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { kind: "qcow2" } }, "target.kind"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { ...raw, path: "rel/b.raw" } }, "target.path"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { ...raw, path: "/a/../etc/passwd" } }, "target.path"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { ...raw, read_only: "yes" } }, "target.read_only"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { ...stack, lowers: [] } }, "target.lowers"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { ...stack, lowers: ["l0"] } }, "target.lowers"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { ...stack, upper: { data: "/d" } } }, "target.upper.index"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { ...stack, create_upper_size: 1000 } }, "target.create_upper_size"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { kind: "overlaybd", lowers: ["/l"], create_upper_size: 0 } }, "target.create_upper_size"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { kind: "overlaybd", lowers: ["/l"], upper_read_only: true } }, "target.upper_read_only"],
      [{ kind: "create_runtime_device", dev_id: "a", target: { ...stack, upper_read_only: "yes" } }, "target.upper_read_only"],
      [{ kind: "create_runtime_device", dev_id: "a", target: raw, fuse: { file_name: "a/b" } }, "fuse.file_name"],
      [{ kind: "create_runtime_device", dev_id: "a", target: raw, fuse: { mount_point: "mnt" } }, "fuse.mount_point"],
      [{ kind: "create_runtime_device", dev_id: "a", target: raw, fuse: { direct_io: 1 } }, "fuse.direct_io"],
      [{ kind: "restack_snapshot", dev_id: "a", output_layer_path: "x", next_upper: { data: "/d", index: "/i" } }, "output_layer_path"],
      [{ kind: "restack_snapshot", dev_id: "a", output_layer_path: null }, "next_upper"],
      [{ kind: "acquire", access_mode: "mine", dev_id: "a", target: raw }, "access_mode"],
      [{ kind: "acquire", access_mode: "exclusive", target: raw }, "dev_id"],
      [{ kind: "acquire", access_mode: "shared", target: { ...raw, read_only: true } }, "share_key"],
      [{ kind: "acquire", access_mode: "shared", share_key: "k", target: raw }, "target"],
      [{ kind: "acquire", access_mode: "shared", share_key: "k", target: stack }, "target"],
      [{ kind: "update_size", dev_id: "a", new_size: 1000 }, "new_size"],
      [{ kind: "update_size", dev_id: "a", new_size: 0 }, "new_size"],
      [{ kind: "hold", dev_id: "a", holder_pid: 0, holder_fd: 3 }, "holder_pid"],
      [{ kind: "hold", dev_id: "a", holder_pid: 5, holder_fd: -1 }, "holder_fd"],
    ];
    for (const [req, field] of cases) expect({ req, ...refused(req) }).toEqual({ req, code: "disk.bad_request", field });
  });

  test("failures become invalid_request / error responses carrying code, message, details and seq", () => {
    const inv = errorResponse(new DiskError("disk.bad_request", "bad request: dev_id x", { field: "dev_id" }), 4, true);
    expect(inv).toEqual({ kind: "invalid_request", seq: 4, code: "disk.bad_request", message: "bad request: dev_id x", details: { field: "dev_id" } });
    expect(errorResponse(new DiskError("disk.not_found", "no device a", { devId: "a" }), undefined, false)).toEqual({
      kind: "error", code: "disk.not_found", message: "no device a", details: { devId: "a" },
    });
    expect(errorResponse(new TypeError("boom"), 1, false)).toEqual({ kind: "error", seq: 1, code: "disk.internal", message: "boom", details: {} });
    expect(errorResponse("thrown string", 2, false)).toEqual({ kind: "error", seq: 2, code: "disk.internal", message: "thrown string", details: {} });
  });

  test("another subsystem's error goes on the wire as disk.backend_failed naming its own code", () => {
    expect(errorResponse(new UblkError("ublk.not_found", "no ublk device 3", { devId: 3 }), 5, false)).toEqual({
      kind: "error", seq: 5, code: "disk.backend_failed", message: "ublk.not_found: no ublk device 3", details: { devId: 3, cause: "ublk.not_found" },
    });
    expect(errorResponse(new SyscallError("pidfd_getfd", 9), 6, false)).toMatchObject({ code: "disk.backend_failed", details: { call: "pidfd_getfd", errno: 9, cause: "syscall.failed" } });
    // a Node system error (its message already starts with the code)
    let enoent: unknown;
    try {
      readFileSync("/nonexistent/aenv-file");
    } catch (e) {
      enoent = e;
    }
    expect(errorResponse(enoent, 7, false)).toEqual({
      kind: "error", seq: 7, code: "disk.backend_failed", message: (enoent as Error).message, details: { syscall: "open", path: "/nonexistent/aenv-file", cause: "ENOENT" },
    });
    expect((enoent as Error).message).toStartWith("ENOENT");
  });
});

describe("the client's view of error answers", () => {
  /** A daemon stand-in on a Unix socket that answers every request with `answer` (plus its seq). */
  async function answering(answer: Record<string, unknown>, run: (c: DaemonClient) => Promise<void>): Promise<void> {
    const dir = mkdtempSync(join(tmpdir(), "aenv-disk-client-"));
    const socket = join(dir, "daemon.sock");
    const server = Bun.listen<{ reader: FrameReader }>({
      unix: socket,
      socket: {
        open(s) {
          s.data = { reader: new FrameReader(1 << 20) };
        },
        data(s, chunk) {
          for (const f of s.data.reader.push(chunk)) if (f.ok) s.write(encodeFrame({ ...answer, seq: f.value.seq }));
        },
      },
    });
    const c = await DaemonClient.connect(socket, { timeoutMs: 10_000, maxFrameBytes: 1 << 20 });
    try {
      await run(c);
    } finally {
      c.close();
      server.stop(true);
      rmSync(dir, { recursive: true, force: true });
    }
  }
  const failure = async (c: DaemonClient): Promise<DiskError> => {
    const e = await c.request({ kind: "list" }).then(() => null, (x: unknown) => x);
    expect(e).toBeInstanceOf(DiskError);
    return e as DiskError;
  };

  test("every DiskError code comes through as itself", async () => {
    for (const code of Object.keys(DISK_ERRORS)) {
      await answering({ kind: "error", code, message: `m ${code}`, details: { x: 1 } }, async (c) => {
        const e = await failure(c);
        expect([e.code, e.message, e.details]).toEqual([code, `m ${code}`, { x: 1, kind: "list" }]);
      });
    }
  });

  test("a code outside DISK_ERRORS (another subsystem's, an errno, none) is disk.internal naming it", async () => {
    for (const code of ["ublk.not_found", "overlaybd.bad_magic", "ENOENT", 42, undefined]) {
      await answering({ kind: "error", code, message: "gone" }, async (c) => {
        const e = await failure(c);
        expect(e.code).toBe("disk.internal");
        expect(e.details).toEqual({ kind: "list", cause: code ?? null });
        expect(e.message).toBe(`the disk daemon answered list with the unknown code ${JSON.stringify(code)}: gone`);
      });
    }
  });
});
