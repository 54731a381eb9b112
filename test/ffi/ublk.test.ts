/**
 * src/ffi/ublk.ts: struct sizes, member offsets and opcodes against the values in
 * ../shared/docs/ublk-iouring-firecracker.md §1.2–1.5 (re-derived there with gcc from
 * include/uapi/linux/ublk_cmd.h), checked byte by byte.
 */
import { describe, expect, test } from "bun:test";
import {
  CTRL_CMD, ctrlOpcode, decodeDevInfo, decodeIoDesc, DEV_INFO, encodeCtrlCmd, encodeDevInfo, encodeIoCmd, encodeParams, IO_CMD, IO_DESC,
  ioDescMapping, ioOpcode, PARAMS, UBLK_ATTR, UBLK_CMD, UBLK_F, UBLK_F_LEGACY, UBLK_IO, UBLK_IO_OP, UBLK_IO_RES, UBLK_S_DEV,
} from "../../src/ffi/ublk.ts";

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

describe("ublk opcodes", () => {
  test("encoded control opcodes are _IOR/_IOWR('u', nr, 32 bytes); legacy ones the plain number", () => {
    expect(ctrlOpcode(UBLK_CMD.GET_DEV_INFO, true)).toBe(0x80207502);
    expect(ctrlOpcode(UBLK_CMD.ADD_DEV, true)).toBe(0xc0207504);
    expect(ctrlOpcode(UBLK_CMD.DEL_DEV, true)).toBe(0xc0207505);
    expect(ctrlOpcode(UBLK_CMD.START_DEV, true)).toBe(0xc0207506);
    expect(ctrlOpcode(UBLK_CMD.STOP_DEV, true)).toBe(0xc0207507);
    expect(ctrlOpcode(UBLK_CMD.SET_PARAMS, true)).toBe(0xc0207508);
    expect(ctrlOpcode(UBLK_CMD.GET_PARAMS, true)).toBe(0x80207509);
    expect(ctrlOpcode(UBLK_CMD.START_USER_RECOVERY, true)).toBe(0xc0207510);
    expect(ctrlOpcode(UBLK_CMD.END_USER_RECOVERY, true)).toBe(0xc0207511);
    expect(ctrlOpcode(UBLK_CMD.GET_FEATURES, true)).toBe(0x80207513);
    expect(ctrlOpcode(UBLK_CMD.GET_QUEUE_AFFINITY, true)).toBe(0x80207501);
    expect(ctrlOpcode(UBLK_CMD.ADD_DEV, false)).toBe(0x04);
    expect(ctrlOpcode(UBLK_CMD.END_USER_RECOVERY, false)).toBe(0x11);
  });

  test("I/O opcodes are _IOWR('u', nr, 16 bytes) or the legacy number", () => {
    expect(ioOpcode(UBLK_IO.FETCH_REQ, true)).toBe(0xc0107520);
    expect(ioOpcode(UBLK_IO.COMMIT_AND_FETCH_REQ, true)).toBe(0xc0107521);
    expect(ioOpcode(UBLK_IO.NEED_GET_DATA, true)).toBe(0xc0107522);
    expect(ioOpcode(UBLK_IO.FETCH_REQ, false)).toBe(0x20);
    expect(ioOpcode(UBLK_IO.COMMIT_AND_FETCH_REQ, false)).toBe(0x21);
  });

  test("flags, ops, results and states have the header's values", () => {
    expect([UBLK_F.NEED_GET_DATA, UBLK_F.USER_RECOVERY, UBLK_F.USER_RECOVERY_REISSUE, UBLK_F.CMD_IOCTL_ENCODE, UBLK_F.USER_COPY]).toEqual([0x4n, 0x8n, 0x10n, 0x40n, 0x80n]);
    expect(UBLK_F_LEGACY).toBe(0x1fn);
    expect([UBLK_IO_OP.READ, UBLK_IO_OP.WRITE, UBLK_IO_OP.FLUSH, UBLK_IO_OP.DISCARD, UBLK_IO_OP.WRITE_ZEROES]).toEqual([0, 1, 2, 3, 5]);
    expect(UBLK_IO_RES.ABORT).toBe(-19);
    expect([UBLK_S_DEV.DEAD, UBLK_S_DEV.LIVE, UBLK_S_DEV.QUIESCED, UBLK_S_DEV.FAIL_IO]).toEqual([0, 1, 2, 3]);
    expect([UBLK_ATTR.READ_ONLY, UBLK_ATTR.ROTATIONAL, UBLK_ATTR.VOLATILE_CACHE, UBLK_ATTR.FUA]).toEqual([1, 2, 4, 8]);
  });
});

describe("ublk structs", () => {
  test("ublksrv_ctrl_cmd: 32 bytes, dev_id @0 queue_id @4 len @6 addr @8 data[0] @16", () => {
    expect(CTRL_CMD.SIZE).toBe(32);
    const b = new Uint8Array(32);
    encodeCtrlCmd(new DataView(b.buffer), 0, { devId: 0x11223344, len: 64, addr: 0x7f0012345678, data0: 4242 });
    expect(hex(b)).toBe("44332211" + "ffff" + "4000" + "78563412007f0000" + "9210000000000000" + "00".repeat(8));
    // dev_id -1 (let the kernel pick) is written as 0xffffffff
    encodeCtrlCmd(new DataView(b.buffer), 0, { devId: -1, queueId: 3 });
    expect(hex(b.subarray(0, 8))).toBe("ffffffff03000000");
  });

  test("ublksrv_ctrl_dev_info: 64 bytes at the documented offsets, decoded back", () => {
    expect(DEV_INFO.SIZE).toBe(64);
    const b = new Uint8Array(64).fill(0xee);
    const dv = new DataView(b.buffer);
    const info = { nrHwQueues: 2, queueDepth: 128, state: 1, maxIoBufBytes: 524288, devId: 7, ublksrvPid: -1, flags: UBLK_F.USER_RECOVERY | UBLK_F.USER_RECOVERY_REISSUE, ublksrvFlags: 0xabn, ownerUid: 5, ownerGid: 6 };
    encodeDevInfo(dv, 0, info);
    expect(hex(b)).toBe(
      "0200" + "8000" + "0100" + "0000" + "00000800" + "07000000" + "ffffffff" + "00000000" + "1800000000000000" + "ab00000000000000" + "05000000" + "06000000" + "00".repeat(16),
    );
    expect(decodeDevInfo(dv, 0)).toEqual(info);
  });

  test("ublk_params: header + basic + discard = 60 bytes (the 6.1 struct)", () => {
    expect(PARAMS.SIZE).toBe(60);
    const b = encodeParams({
      attrs: UBLK_ATTR.VOLATILE_CACHE,
      logicalBsShift: 9,
      physicalBsShift: 12,
      ioOptShift: 12,
      ioMinShift: 9,
      maxSectors: 1024,
      devSectors: 2 ** 33 + 1,
      discard: { granularity: 4096, maxDiscardSectors: 0xffffffff, maxWriteZeroesSectors: 2048 },
    });
    expect(b.length).toBe(60);
    expect(hex(b)).toBe(
      "3c000000" + "03000000" + // len 60, types BASIC|DISCARD
        "04000000" + "090c0c09" + "00040000" + "00000000" + "0100000002000000" + "0000000000000000" + // basic
        "00000000" + "00100000" + "ffffffff" + "00080000" + "0100" + "0000", // discard
    );
    const ro = encodeParams({ attrs: UBLK_ATTR.READ_ONLY, logicalBsShift: 9, physicalBsShift: 12, ioOptShift: 12, ioMinShift: 9, maxSectors: 256, devSectors: 8 });
    expect(new DataView(ro.buffer).getUint32(4, true)).toBe(1); // BASIC only
    expect(hex(ro.subarray(40))).toBe("00".repeat(20));
  });

  test("ublksrv_io_desc: 24 bytes per tag, op in bits 0-7, 64-bit start sector", () => {
    expect(IO_DESC.SIZE).toBe(24);
    const b = new Uint8Array(24 * 3);
    const dv = new DataView(b.buffer);
    dv.setUint32(48, UBLK_IO_OP.WRITE | (1 << 13), true); // tag 2: WRITE|FUA
    dv.setUint32(52, 8, true);
    dv.setBigUint64(56, 0x1_0000_0010n, true);
    dv.setBigUint64(64, 0x7f00_0000_1000n, true);
    expect(decodeIoDesc(dv, 2)).toEqual({ op: 1, flags: 1 << 13, nrSectors: 8, startSector: 0x1_0000_0010, addr: 0x7f00_0000_1000 });
  });

  test("ublksrv_io_cmd: 16 bytes, q_id @0 tag @2 result @4 addr @8", () => {
    expect(IO_CMD.SIZE).toBe(16);
    const w = new Uint32Array(4);
    encodeIoCmd(w, 0, 1, 0x123, -5, 0x7f00_1234_5000);
    expect(hex(new Uint8Array(w.buffer))).toBe("0100" + "2301" + "fbffffff" + "0050341200" + "7f0000");
  });

  test("descriptor mapping: queue stride is the 4096-deep array, length the real depth, page-rounded", () => {
    expect(ioDescMapping(0, 128)).toEqual({ offset: 0, length: 4096 });
    expect(ioDescMapping(1, 256)).toEqual({ offset: 98304, length: 8192 });
    expect(ioDescMapping(3, 4096)).toEqual({ offset: 3 * 98304, length: 98304 });
    expect(ioDescMapping(0, 1)).toEqual({ offset: 0, length: 4096 });
  });
});
