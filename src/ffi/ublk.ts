/**
 * The ublk kernel interface (x86_64, little endian): control and I/O command opcodes, feature
 * flags, and encoders/decoders of the structs exchanged with the driver. Source of every offset:
 * include/uapi/linux/ublk_cmd.h (linux-source-6.1 for the 6.1 layout our guest kernel runs, and
 * mainline for the later additions), as tabulated in ../shared/docs/ublk-iouring-firecracker.md
 * §1.2–1.7. Sizes and sectors: `*_sectors` and `start_sector` are always 512-byte units.
 */

/** Control command numbers (`_IOC_NR`); the legacy opcode is the number itself. */
export const UBLK_CMD = {
  GET_QUEUE_AFFINITY: 0x01,
  GET_DEV_INFO: 0x02,
  ADD_DEV: 0x04,
  DEL_DEV: 0x05,
  START_DEV: 0x06,
  STOP_DEV: 0x07,
  SET_PARAMS: 0x08,
  GET_PARAMS: 0x09,
  START_USER_RECOVERY: 0x10,
  END_USER_RECOVERY: 0x11,
  GET_DEV_INFO2: 0x12,
  /** Encoded form only (Linux 6.5+). */
  GET_FEATURES: 0x13,
} as const;

/** Commands the driver defines as `_IOR` (data from kernel); the rest are `_IOWR`. */
const CTRL_READ_ONLY: ReadonlySet<number> = new Set([UBLK_CMD.GET_QUEUE_AFFINITY, UBLK_CMD.GET_DEV_INFO, UBLK_CMD.GET_PARAMS, UBLK_CMD.GET_DEV_INFO2, UBLK_CMD.GET_FEATURES]);

/** I/O command numbers, sent on /dev/ublkcN. */
export const UBLK_IO = { FETCH_REQ: 0x20, COMMIT_AND_FETCH_REQ: 0x21, NEED_GET_DATA: 0x22 } as const;

/** CQE `res` of a parked I/O command. ABORT = -ENODEV: the queue is going away, do not re-issue. */
export const UBLK_IO_RES = { OK: 0, NEED_GET_DATA: 1, ABORT: -19 } as const;

/** Request operations in `ublksrv_io_desc.op_flags` bits 0–7. */
export const UBLK_IO_OP = { READ: 0, WRITE: 1, FLUSH: 2, DISCARD: 3, WRITE_SAME: 4, WRITE_ZEROES: 5 } as const;
/** Request flags in `op_flags` bits 8–31. */
export const UBLK_IO_F = { FAILFAST_DEV: 1 << 8, FAILFAST_TRANSPORT: 1 << 9, FAILFAST_DRIVER: 1 << 10, META: 1 << 11, FUA: 1 << 13, NOUNMAP: 1 << 15, SWAP: 1 << 16 } as const;

/** Device feature flags (`ublksrv_ctrl_dev_info.flags`, GET_FEATURES mask), as bigint bits. */
export const UBLK_F = {
  SUPPORT_ZERO_COPY: 1n << 0n,
  URING_CMD_COMP_IN_TASK: 1n << 1n,
  NEED_GET_DATA: 1n << 2n,
  USER_RECOVERY: 1n << 3n,
  USER_RECOVERY_REISSUE: 1n << 4n,
  UNPRIVILEGED_DEV: 1n << 5n,
  CMD_IOCTL_ENCODE: 1n << 6n,
  USER_COPY: 1n << 7n,
  ZONED: 1n << 8n,
  USER_RECOVERY_FAIL_IO: 1n << 9n,
  UPDATE_SIZE: 1n << 10n,
} as const;

/**
 * Features of a kernel without GET_FEATURES (6.0–6.4): the flags 6.1's `UBLK_F_ALL` holds
 * (ublk_drv.c), all a 6.1 driver can accept.
 */
export const UBLK_F_LEGACY = UBLK_F.SUPPORT_ZERO_COPY | UBLK_F.URING_CMD_COMP_IN_TASK | UBLK_F.NEED_GET_DATA | UBLK_F.USER_RECOVERY | UBLK_F.USER_RECOVERY_REISSUE;

/** Device states (`ublksrv_ctrl_dev_info.state`). */
export const UBLK_S_DEV = { DEAD: 0, LIVE: 1, QUIESCED: 2, FAIL_IO: 3 } as const;

/** Largest queue depth (tags are 12 bits in 6.1; UBLK_MAX_QUEUE_DEPTH). */
export const UBLK_MAX_QUEUE_DEPTH = 4096;
/** ADD_DEV / control commands: `queue_id` for device-wide commands. */
export const UBLK_QUEUE_ID_NONE = 0xffff;
/** ADD_DEV `dev_id` asking the kernel to pick the id. */
export const UBLK_DEV_ID_ANY = 0xffffffff;

const IOC_READ = 2, IOC_WRITE = 1;
const UBLK_IOC_TYPE = 0x75; // 'u'

/** `_IOC(dir, 'u', nr, size)` as the unsigned 32-bit cmd_op value. */
function ioc(dir: number, nr: number, size: number): number {
  return ((dir << 30) | (size << 16) | (UBLK_IOC_TYPE << 8) | nr) >>> 0;
}

/**
 * The `cmd_op` of control command `nr`: `_IOR`/`_IOWR('u', nr, struct ublksrv_ctrl_cmd)` when
 * `encoded` (Linux 6.4+), else the legacy plain number (the only form 6.1 accepts).
 */
export function ctrlOpcode(nr: number, encoded: boolean): number {
  if (!encoded) return nr;
  return ioc(CTRL_READ_ONLY.has(nr) ? IOC_READ : IOC_READ | IOC_WRITE, nr, CTRL_CMD.SIZE);
}

/** The `cmd_op` of I/O command `nr`: `_IOWR('u', nr, struct ublksrv_io_cmd)` when `encoded`, else `nr`. */
export function ioOpcode(nr: number, encoded: boolean): number {
  return encoded ? ioc(IOC_READ | IOC_WRITE, nr, IO_CMD.SIZE) : nr;
}

/** struct ublksrv_ctrl_cmd (32 bytes, placed at SQE byte 48 of a 128-byte SQE). */
export const CTRL_CMD = { SIZE: 32, DEV_ID: 0, QUEUE_ID: 4, LEN: 6, ADDR: 8, DATA0: 16, DEV_PATH_LEN: 24 } as const;

/** Fields of a control command. */
export interface CtrlCmd {
  devId: number;
  /** 0xFFFF for device-wide commands. */
  queueId?: number;
  /** Length of the buffer at `addr`, bytes (u16). */
  len?: number;
  /** Address of the command's buffer (dev_info, params, u64), or 0. */
  addr?: number;
  /** Inline argument: server pid (START_DEV, END_USER_RECOVERY), queue id (GET_QUEUE_AFFINITY). */
  data0?: number;
}

/** Write a ublksrv_ctrl_cmd at byte `at` of `dv` (the rest of its 32 bytes must already be zero). */
export function encodeCtrlCmd(dv: DataView, at: number, c: CtrlCmd): void {
  dv.setUint32(at + CTRL_CMD.DEV_ID, c.devId >>> 0, true);
  dv.setUint16(at + CTRL_CMD.QUEUE_ID, c.queueId ?? UBLK_QUEUE_ID_NONE, true);
  dv.setUint16(at + CTRL_CMD.LEN, c.len ?? 0, true);
  dv.setBigUint64(at + CTRL_CMD.ADDR, BigInt(c.addr ?? 0), true);
  dv.setBigUint64(at + CTRL_CMD.DATA0, BigInt(c.data0 ?? 0), true);
}

/** struct ublksrv_ctrl_dev_info (64 bytes). */
export const DEV_INFO = {
  SIZE: 64,
  NR_HW_QUEUES: 0,
  QUEUE_DEPTH: 2,
  STATE: 4,
  MAX_IO_BUF_BYTES: 8,
  DEV_ID: 12,
  UBLKSRV_PID: 16,
  FLAGS: 24,
  UBLKSRV_FLAGS: 32,
  OWNER_UID: 40,
  OWNER_GID: 44,
} as const;

/** A device's info as ADD_DEV/GET_DEV_INFO exchange it. */
export interface DevInfo {
  nrHwQueues: number;
  queueDepth: number;
  /** UBLK_S_DEV_* (kernel-owned). */
  state: number;
  /** Largest request payload in bytes (the kernel rounds it down to pages). */
  maxIoBufBytes: number;
  devId: number;
  /** pid given to START_DEV/END_USER_RECOVERY, -1 when none. */
  ublksrvPid: number;
  /** UBLK_F_* requested (ADD_DEV in) or accepted (out). */
  flags: bigint;
  /** Opaque to the kernel; ours to use. */
  ublksrvFlags: bigint;
  /** Filled by kernels with unprivileged support (6.3+), else 0. */
  ownerUid: number;
  ownerGid: number;
}

/** Write `d` as a ublksrv_ctrl_dev_info at byte `at` (64 bytes; reserved bytes zeroed). */
export function encodeDevInfo(dv: DataView, at: number, d: DevInfo): void {
  for (let i = 0; i < DEV_INFO.SIZE; i++) dv.setUint8(at + i, 0);
  dv.setUint16(at + DEV_INFO.NR_HW_QUEUES, d.nrHwQueues, true);
  dv.setUint16(at + DEV_INFO.QUEUE_DEPTH, d.queueDepth, true);
  dv.setUint16(at + DEV_INFO.STATE, d.state, true);
  dv.setUint32(at + DEV_INFO.MAX_IO_BUF_BYTES, d.maxIoBufBytes, true);
  dv.setUint32(at + DEV_INFO.DEV_ID, d.devId >>> 0, true);
  dv.setInt32(at + DEV_INFO.UBLKSRV_PID, d.ublksrvPid, true);
  dv.setBigUint64(at + DEV_INFO.FLAGS, d.flags, true);
  dv.setBigUint64(at + DEV_INFO.UBLKSRV_FLAGS, d.ublksrvFlags, true);
  dv.setUint32(at + DEV_INFO.OWNER_UID, d.ownerUid, true);
  dv.setUint32(at + DEV_INFO.OWNER_GID, d.ownerGid, true);
}

/** Read a ublksrv_ctrl_dev_info at byte `at`. */
export function decodeDevInfo(dv: DataView, at: number): DevInfo {
  return {
    nrHwQueues: dv.getUint16(at + DEV_INFO.NR_HW_QUEUES, true),
    queueDepth: dv.getUint16(at + DEV_INFO.QUEUE_DEPTH, true),
    state: dv.getUint16(at + DEV_INFO.STATE, true),
    maxIoBufBytes: dv.getUint32(at + DEV_INFO.MAX_IO_BUF_BYTES, true),
    devId: dv.getUint32(at + DEV_INFO.DEV_ID, true),
    ublksrvPid: dv.getInt32(at + DEV_INFO.UBLKSRV_PID, true),
    flags: dv.getBigUint64(at + DEV_INFO.FLAGS, true),
    ublksrvFlags: dv.getBigUint64(at + DEV_INFO.UBLKSRV_FLAGS, true),
    ownerUid: dv.getUint32(at + DEV_INFO.OWNER_UID, true),
    ownerGid: dv.getUint32(at + DEV_INFO.OWNER_GID, true),
  };
}

/** struct ublk_params: header (len u32 @0, types u32 @4), basic @8 (32 bytes), discard @40 (20 bytes). */
export const PARAMS = {
  LEN: 0,
  TYPES: 4,
  BASIC: 8,
  DISCARD: 40,
  /** Bytes of header + basic + discard: the 6.1 struct, accepted by every later kernel (it copies min(len, its size)). */
  SIZE: 60,
} as const;
/** ublk_param_basic member offsets (relative to PARAMS.BASIC). */
export const PARAM_BASIC = { ATTRS: 0, LOGICAL_BS_SHIFT: 4, PHYSICAL_BS_SHIFT: 5, IO_OPT_SHIFT: 6, IO_MIN_SHIFT: 7, MAX_SECTORS: 8, CHUNK_SECTORS: 12, DEV_SECTORS: 16, VIRT_BOUNDARY_MASK: 24 } as const;
/** ublk_param_discard member offsets (relative to PARAMS.DISCARD). */
export const PARAM_DISCARD = { ALIGNMENT: 0, GRANULARITY: 4, MAX_DISCARD_SECTORS: 8, MAX_WRITE_ZEROES_SECTORS: 12, MAX_DISCARD_SEGMENTS: 16 } as const;
/** ublk_params.types bits. */
export const UBLK_PARAM_TYPE = { BASIC: 1, DISCARD: 2 } as const;
/** ublk_param_basic.attrs bits. */
export const UBLK_ATTR = { READ_ONLY: 1, ROTATIONAL: 2, VOLATILE_CACHE: 4, FUA: 8 } as const;

/** What SET_PARAMS carries. */
export interface DeviceParams {
  /** UBLK_ATTR_* bits. */
  attrs: number;
  /** log2 of the logical block size in bytes (9 = 512). */
  logicalBsShift: number;
  /** log2 of the physical block size in bytes (12 = 4096); ≥ logical. */
  physicalBsShift: number;
  /** log2 of the optimal and minimal I/O size in bytes. */
  ioOptShift: number;
  ioMinShift: number;
  /** Largest request, 512-byte sectors (≤ max_io_buf_bytes / 512). */
  maxSectors: number;
  /** Capacity in 512-byte sectors, whatever the block size. */
  devSectors: number;
  /** Discard/write-zeroes limits; absent = the device takes neither. */
  discard?: {
    /** Granularity in bytes (non-zero). */
    granularity: number;
    /** Largest discard, 512-byte sectors. */
    maxDiscardSectors: number;
    /** Largest write-zeroes, 512-byte sectors. */
    maxWriteZeroesSectors: number;
  };
}

/** Encode `p` as a ublk_params of PARAMS.SIZE bytes (types BASIC, plus DISCARD when given). */
export function encodeParams(p: DeviceParams): Uint8Array {
  const out = new Uint8Array(PARAMS.SIZE);
  const dv = new DataView(out.buffer);
  dv.setUint32(PARAMS.LEN, PARAMS.SIZE, true);
  dv.setUint32(PARAMS.TYPES, UBLK_PARAM_TYPE.BASIC | (p.discard ? UBLK_PARAM_TYPE.DISCARD : 0), true);
  const b = PARAMS.BASIC;
  dv.setUint32(b + PARAM_BASIC.ATTRS, p.attrs, true);
  dv.setUint8(b + PARAM_BASIC.LOGICAL_BS_SHIFT, p.logicalBsShift);
  dv.setUint8(b + PARAM_BASIC.PHYSICAL_BS_SHIFT, p.physicalBsShift);
  dv.setUint8(b + PARAM_BASIC.IO_OPT_SHIFT, p.ioOptShift);
  dv.setUint8(b + PARAM_BASIC.IO_MIN_SHIFT, p.ioMinShift);
  dv.setUint32(b + PARAM_BASIC.MAX_SECTORS, p.maxSectors, true);
  dv.setBigUint64(b + PARAM_BASIC.DEV_SECTORS, BigInt(p.devSectors), true);
  if (p.discard) {
    const d = PARAMS.DISCARD;
    dv.setUint32(d + PARAM_DISCARD.GRANULARITY, p.discard.granularity, true);
    dv.setUint32(d + PARAM_DISCARD.MAX_DISCARD_SECTORS, p.discard.maxDiscardSectors, true);
    dv.setUint32(d + PARAM_DISCARD.MAX_WRITE_ZEROES_SECTORS, p.discard.maxWriteZeroesSectors, true);
    dv.setUint16(d + PARAM_DISCARD.MAX_DISCARD_SEGMENTS, 1, true);
  }
  return out;
}

/** struct ublksrv_io_desc (24 bytes; tag `t` at byte 24*t of the queue's mapping). */
export const IO_DESC = { SIZE: 24, OP_FLAGS: 0, NR_SECTORS: 4, START_SECTOR: 8, ADDR: 16 } as const;

/** One request as the driver describes it. */
export interface IoDesc {
  /** UBLK_IO_OP_*. */
  op: number;
  /** UBLK_IO_F_* bits (already in place: bit 8 and up). */
  flags: number;
  /** Length in 512-byte sectors. */
  nrSectors: number;
  /** Start in 512-byte sectors. */
  startSector: number;
  /** Echo of the buffer address the server gave. */
  addr: number;
}

/** Read the descriptor of `tag` from a queue's mapping. */
export function decodeIoDesc(dv: DataView, tag: number): IoDesc {
  const at = tag * IO_DESC.SIZE;
  const opFlags = dv.getUint32(at + IO_DESC.OP_FLAGS, true);
  return {
    op: opFlags & 0xff,
    flags: opFlags & ~0xff,
    nrSectors: dv.getUint32(at + IO_DESC.NR_SECTORS, true),
    startSector: dv.getUint32(at + IO_DESC.START_SECTOR, true) + dv.getUint32(at + IO_DESC.START_SECTOR + 4, true) * 2 ** 32,
    addr: dv.getUint32(at + IO_DESC.ADDR, true) + dv.getUint32(at + IO_DESC.ADDR + 4, true) * 2 ** 32,
  };
}

/** struct ublksrv_io_cmd (16 bytes, placed at SQE byte 48; fits a 64-byte SQE). */
export const IO_CMD = { SIZE: 16, Q_ID: 0, TAG: 2, RESULT: 4, ADDR: 8 } as const;

/**
 * Write a ublksrv_io_cmd into 32-bit words at `word` (SQE.CMD / 4 of an SQE): queue id, tag,
 * result (COMMIT only: bytes done or -errno) and the tag's buffer address.
 */
export function encodeIoCmd(w: Uint32Array, word: number, qId: number, tag: number, result: number, addr: number): void {
  w[word] = (qId & 0xffff) | ((tag & 0xffff) << 16);
  w[word + 1] = result >>> 0;
  w[word + 2] = addr % 2 ** 32;
  w[word + 3] = Math.floor(addr / 2 ** 32);
}

/**
 * Per-queue descriptor mapping of /dev/ublkcN: queue `q` is at offset `q * round_up(4096 * 24,
 * page)` (UBLKSRV_CMD_BUF_OFFSET 0; the stride is the max-depth array), and its length must be
 * exactly `round_up(depth * 24, page)`.
 */
export function ioDescMapping(qId: number, depth: number, pageSize = 4096): { offset: number; length: number } {
  const round = (n: number) => Math.ceil(n / pageSize) * pageSize;
  return { offset: qId * round(UBLK_MAX_QUEUE_DEPTH * IO_DESC.SIZE), length: round(depth * IO_DESC.SIZE) };
}

/** /dev/ublk-control. */
export const UBLK_CONTROL_PATH = "/dev/ublk-control";
/** The char device ADD_DEV creates for device `id`. */
export function ublkCharPath(id: number): string {
  return `/dev/ublkc${id}`;
}
/** The block device START_DEV creates for device `id`. */
export function ublkBlockPath(id: number): string {
  return `/dev/ublkb${id}`;
}
