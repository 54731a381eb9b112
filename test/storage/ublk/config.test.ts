/** `[ublk]` config: the defaults load and pass the range checks; out-of-range values are typed errors naming the key. */
import { expect, test } from "bun:test";
import { loadConfig } from "../../../src/config/index.ts";
import { checkUblkConfig, ublkConfig } from "../../../src/storage/ublk/config.ts";

test("defaults and range checks of [ublk]", () => {
  const c = ublkConfig(loadConfig({ env: {} }));
  expect(c).toEqual({ queues: 1, queueDepth: 64, maxIoBytes: 524288, logicalBlockShift: 9, physicalBlockShift: 12, userRecovery: true, controlTimeoutMs: 30000, recoveryWaitMs: 30000, cowChunkBytes: 65536 });
  const bad = (patch: Partial<typeof c>) => {
    try {
      checkUblkConfig({ ...c, ...patch });
      return "accepted";
    } catch (e) {
      return `${(e as { code: string }).code} ${(e as { details: { field: string } }).details.field}`;
    }
  };
  expect(bad({ queues: 0 })).toBe("ublk.bad_config queues");
  expect(bad({ queueDepth: 4097 })).toBe("ublk.bad_config queue_depth");
  expect(bad({ maxIoBytes: 4095 })).toBe("ublk.bad_config max_io_bytes");
  expect(bad({ maxIoBytes: 6000 })).toBe("ublk.bad_config max_io_bytes");
  expect(bad({ logicalBlockShift: 8 })).toBe("ublk.bad_config logical_block_shift");
  expect(bad({ physicalBlockShift: 9, logicalBlockShift: 12 })).toBe("ublk.bad_config physical_block_shift");
  expect(bad({ cowChunkBytes: 65536 + 4096 })).toBe("ublk.bad_config cow_chunk_bytes");
  expect(bad({ controlTimeoutMs: 0 })).toBe("ublk.bad_config control_timeout_ms");
  expect(bad({ queueDepth: 4096, queues: 16, maxIoBytes: 16 << 20 })).toBe("accepted");
  // the schema refuses out-of-range values at load time, naming the key
  expect(() => loadConfig({ env: { AENV__ublk__queue_depth: "0" } })).toThrow(/ublk.queue_depth/);
  expect(() => loadConfig({ env: { AENV__ublk__cow_chunk_bytes: "3000" } })).toThrow(/ublk.cow_chunk_bytes/);
  expect(() => ublkConfig(loadConfig({ env: { AENV__ublk__logical_block_shift: "12", AENV__ublk__physical_block_shift: "9" } }))).toThrow(/physical_block_shift/);
});
