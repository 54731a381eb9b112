/**
 * The device list of a QEMU device-state file (what `captureSnapshot` writes): QEMU ends its
 * migration stream with a VMDESCRIPTION record after the EOF marker, `0x00 0x06 be32 length JSON`
 * (migration/savevm.c, qemu_savevm_state_complete_precopy_non_iterable), whose `devices` array
 * names every device section (`vmsd_name`: "virtio-blk", "virtio-balloon", ...). A restore must
 * give QEMU the same devices, so the driver reads them from the state itself: a snapshot records
 * its machine whatever code made it.
 */
import { closeSync, fstatSync, openSync, readSync } from "node:fs";
import { VmmError } from "../errors.ts";

const EOF = 0x00;
const VMDESCRIPTION = 0x06;
/** The description is the stream's tail; it has never been near this size (about 60 KiB here). */
const MAX_TAIL_BYTES = 4 << 20;

/** One device of the description. */
export interface StateDevice {
  /** Section name, e.g. "virtio-mmio@00000000feb02800/virtio-net". */
  name: string;
  /** The device's state layout name, e.g. "virtio-net". */
  vmsdName: string;
}

/**
 * The devices a device-state file holds, from its trailing VMDESCRIPTION record; null when the
 * file has none (a stream from a QEMU told to leave it out).
 * @throws VmmError `vmm.stream_bad` when the description is there but not the JSON QEMU writes.
 */
export function stateDevices(statePath: string): StateDevice[] | null {
  const fd = openSync(statePath, "r");
  let tail: Buffer;
  try {
    const size = fstatSync(fd).size;
    const n = Math.min(size, MAX_TAIL_BYTES);
    tail = Buffer.alloc(n);
    readSync(fd, tail, 0, n, size - n);
  } finally {
    closeSync(fd);
  }
  // the record whose length reaches exactly the end of the file, right after the EOF marker
  for (let p = tail.length - 5; p >= 1; p--) {
    if (tail[p] !== VMDESCRIPTION || tail[p - 1] !== EOF || tail.readUInt32BE(p + 1) !== tail.length - p - 5) continue;
    let doc: { devices?: unknown };
    try {
      doc = JSON.parse(tail.subarray(p + 5).toString("utf8")) as { devices?: unknown };
    } catch (e) {
      throw new VmmError("vmm.stream_bad", `device state ${statePath}: its description is not JSON`, { statePath }, { cause: e });
    }
    if (!Array.isArray(doc.devices)) throw new VmmError("vmm.stream_bad", `device state ${statePath}: its description lists no devices`, { statePath });
    return doc.devices.map((d: { name?: unknown; vmsd_name?: unknown }) => ({ name: String(d.name ?? ""), vmsdName: String(d.vmsd_name ?? "") }));
  }
  return null;
}
