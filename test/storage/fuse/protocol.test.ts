// Unit tests of the FUSE wire codec (src/ffi/fuse.ts) against layouts from
// ../shared/docs/fuse-nbd.md §1.2–§1.5, and of FuseConnection / FuseReaderPool option validation.
import { describe, expect, test } from "bun:test";
import * as F from "../../../src/ffi/fuse.ts";
import { FuseConnection, FuseError, FuseReaderPool } from "../../../src/storage/fuse/index.ts";
import type { BlockImage } from "../../../src/storage/block.ts";

describe("fuse codec", () => {
  test("in header decodes at documented offsets", () => {
    const b = new Uint8Array(48);
    const v = new DataView(b.buffer);
    v.setUint32(0, 48, true);
    v.setUint32(4, F.Op.READ, true);
    v.setBigUint64(8, 0x8000000000000005n, true); // resend bit set: must survive
    v.setBigUint64(16, 2n, true);
    v.setUint32(24, 1000, true);
    v.setUint32(28, 1001, true);
    v.setUint32(32, 4242, true);
    expect(F.decodeInHeader(b)).toEqual({ len: 48, opcode: 15, unique: 0x8000000000000005n, nodeid: 2n, uid: 1000, gid: 1001, pid: 4242 });
  });

  test("error reply is a bare 16-byte header with negative errno", () => {
    const r = F.encodeReply(77n, F.Errno.EROFS, new Uint8Array(8));
    expect(r.byteLength).toBe(16);
    const v = new DataView(r.buffer);
    expect(v.getUint32(0, true)).toBe(16);
    expect(v.getInt32(4, true)).toBe(-30);
    expect(v.getBigUint64(8, true)).toBe(77n);
  });

  test("success reply carries header + body with len covering both", () => {
    const r = F.encodeReply(9n, 0, Uint8Array.of(1, 2, 3));
    expect(Array.from(r)).toEqual([19, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]);
  });

  test("NOTIFY_RESEND is a bare header: len 16, positive code 7, unique 0", () => {
    const n = F.encodeNotify(F.NOTIFY_RESEND);
    expect(Array.from(n)).toEqual([16, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
  });

  test("a separately written body is counted in the header length", () => {
    const h = F.encodeReply(3n, 0, undefined, 4096);
    expect(h.byteLength).toBe(16);
    expect(new DataView(h.buffer).getUint32(0, true)).toBe(16 + 4096);
  });

  test("init_out is 64 bytes with fields at documented offsets", () => {
    const o = F.encodeInitOut({
      major: 7, minor: 45, maxReadahead: 131072, flags: 0x40648021, flags2: 0x400, maxBackground: 64,
      congestionThreshold: 48, maxWrite: 1 << 20, maxPages: 256, requestTimeout: 60,
    });
    expect(o.byteLength).toBe(64);
    const v = new DataView(o.buffer);
    expect([v.getUint32(0, true), v.getUint32(4, true), v.getUint32(8, true), v.getUint32(12, true)]).toEqual([7, 45, 131072, 0x40648021]);
    expect([v.getUint16(16, true), v.getUint16(18, true), v.getUint32(20, true), v.getUint32(24, true)]).toEqual([64, 48, 1 << 20, 1]);
    expect([v.getUint16(28, true), v.getUint32(32, true), v.getUint16(40, true)]).toEqual([256, 0x400, 60]);
    // the flags we want are exactly the documented reply 0x40648021
    const want = F.InitFlag.ASYNC_READ | F.InitFlag.BIG_WRITES | F.InitFlag.ASYNC_DIO | F.InitFlag.PARALLEL_DIROPS |
      F.InitFlag.ABORT_ERROR | F.InitFlag.MAX_PAGES | F.InitFlag.INIT_EXT;
    expect(want >>> 0).toBe(0x40648021);
  });

  test("init_in decodes flags2", () => {
    const b = new Uint8Array(64);
    const v = new DataView(b.buffer);
    v.setUint32(0, 7, true);
    v.setUint32(4, 45, true);
    v.setUint32(8, 131072, true);
    v.setUint32(12, 0x73fffffb, true);
    v.setUint32(16, 0x5fd, true);
    expect(F.decodeInitIn(b)).toEqual({ major: 7, minor: 45, maxReadahead: 131072, flags: 0x73fffffb, flags2: 0x5fd });
  });

  test("attr_out (104) and entry_out (128) place fuse_attr at 16 and 40", () => {
    const a: F.Attr = { ino: 2n, size: 1 << 20, mode: F.S_IFREG | 0o644, nlink: 1, uid: 0, gid: 0, time: 1700000000 };
    const ao = F.encodeAttrOut(a, 3600);
    expect(ao.byteLength).toBe(104);
    const v = new DataView(ao.buffer);
    expect(v.getBigUint64(0, true)).toBe(3600n);
    expect(v.getBigUint64(16, true)).toBe(2n);
    expect(v.getBigUint64(24, true)).toBe(1048576n);
    expect(v.getBigUint64(32, true)).toBe(2048n); // 512-byte blocks
    expect(v.getUint32(16 + 60, true)).toBe(0o100644);
    expect(v.getUint32(16 + 80, true)).toBe(4096);
    const eo = F.encodeEntryOut(a, 3600);
    expect(eo.byteLength).toBe(128);
    const e = new DataView(eo.buffer);
    expect(e.getBigUint64(0, true)).toBe(2n);
    expect(e.getBigUint64(16, true)).toBe(3600n);
    expect(e.getBigUint64(40 + 8, true)).toBe(1048576n);
  });

  test("read/write/fallocate/setattr inputs decode", () => {
    const rw = new Uint8Array(40);
    const v = new DataView(rw.buffer);
    v.setBigUint64(0, 5n, true);
    v.setBigUint64(8, 123456789n, true);
    v.setUint32(16, 4096, true);
    expect(F.decodeRwIn(rw)).toEqual({ fh: 5n, offset: 123456789, size: 4096, flags: 0 });
    const fa = new Uint8Array(32);
    const w = new DataView(fa.buffer);
    w.setBigUint64(8, 4096n, true);
    w.setBigUint64(16, 8192n, true);
    w.setUint32(24, F.FALLOC_FL_PUNCH_HOLE | F.FALLOC_FL_KEEP_SIZE, true);
    expect(F.decodeFallocateIn(fa)).toEqual({ fh: 0n, offset: 4096, length: 8192, mode: 3 });
    const sa = new Uint8Array(88);
    const s = new DataView(sa.buffer);
    s.setUint32(0, F.FATTR_SIZE, true);
    s.setBigUint64(16, 0n, true);
    expect(F.decodeSetattrIn(sa)).toEqual({ valid: 8, size: 0 });
  });

  test("dirents are 8-byte aligned, off = next cookie, and stop at the buffer size", () => {
    const ents: F.Dirent[] = [
      { ino: 1n, name: ".", type: F.DT_DIR },
      { ino: 1n, name: "..", type: F.DT_DIR },
      { ino: 2n, name: "root.img", type: F.DT_REG },
    ];
    const all = F.encodeDirents(ents, 0, 4096);
    expect(all.byteLength).toBe(32 + 32 + 32);
    const v = new DataView(all.buffer);
    expect(v.getBigUint64(64 + 8, true)).toBe(3n);
    expect(v.getUint32(64 + 16, true)).toBe(8);
    expect(v.getUint32(64 + 20, true)).toBe(F.DT_REG);
    expect(Buffer.from(all.subarray(64 + 24, 64 + 32)).toString()).toBe("root.img");
    expect(F.encodeDirents(ents, 0, 70).byteLength).toBe(64); // third record does not fit
    expect(F.encodeDirents(ents, 3, 4096).byteLength).toBe(0); // past the end
  });

  test("lookup name stops at NUL", () => {
    expect(F.decodeName(Buffer.from("disk.img\0junk"))).toBe("disk.img");
  });
});

describe("FuseConnection and reader pool options", () => {
  const img: BlockImage = {
    size: 4096, readOnly: true,
    pread: async () => 0, pwrite: async () => 0, discard: async () => {}, sync: async () => {}, close: async () => {},
  };
  // validation happens before the pool is touched: a stand-in that fails if it is used
  const pool = { threads: 1, register: () => { throw new Error("pool used"); } } as unknown as FuseReaderPool;
  const base = { fd: 0, mountPoint: "/tmp/aenv-never-mounted", maxWrite: 4096, requestTimeoutSec: 0, resume: false };
  const serve = { fileName: "d.img", image: img, directIo: false };
  const cases: [string, Record<string, unknown>][] = [
    ["relative mount point", { mountPoint: "rel/mnt" }],
    ["file name with slash", { serve: { ...serve, fileName: "a/b" } }],
    ["file name ..", { serve: { ...serve, fileName: ".." } }],
    ["maxWrite not a page multiple", { maxWrite: 5000 }],
    ["maxWrite above 1 MiB", { maxWrite: 2 << 20 }],
    ["negative timeout", { requestTimeoutSec: -1 }],
    ["image size not sector aligned", { serve: { ...serve, image: { ...img, size: 1000 } } }],
    ["negative fd", { fd: -1 }],
  ];
  for (const [name, patch] of cases) {
    test(`rejects ${name}`, () => {
      let err: any;
      try {
        new FuseConnection(pool, { ...base, serve, ...patch } as any);
      } catch (e) {
        err = e;
      }
      expect(err?.code).toBe("fuse.bad_options");
    });
  }
  test("a reader pool needs 1..16 threads", () => {
    for (const threads of [0, 17, 1.5]) expect(() => new FuseReaderPool({ threads, bufSize: 8192 })).toThrow(FuseError);
  });
});
