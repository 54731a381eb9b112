/**
 * The device list of a QEMU device-state file (src/vmm/qemu/vmdesc.ts), which a restore follows
 * (a PIT, the free page reporting balloon): read from the trailing VMDESCRIPTION record of
 * streams laid out as QEMU 7.2 ends them.
 */
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { VmmError } from "../../../src/vmm/index.ts";
import { stateDevices } from "../../../src/vmm/qemu/vmdesc.ts";

const dir = mkdtempSync(join(tmpdir(), "vmdesc-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A state file: magic, some section bytes ending in a footer, EOF (0x00), then 0x06 + be32 length + `json`. */
function stateFile(name: string, json: string | null, body = Buffer.from([0x04, 0, 0, 0, 0x16, 0x7e, 0, 0, 0, 0x16])): string {
  const head = Buffer.from([0x51, 0x45, 0x56, 0x4d, 0, 0, 0, 3]);
  const parts = [head, body, Buffer.from([0x00])];
  if (json !== null) {
    const j = Buffer.from(json);
    const len = Buffer.alloc(4);
    len.writeUInt32BE(j.length);
    parts.push(Buffer.from([0x06]), len, j);
  }
  const p = join(dir, name);
  writeFileSync(p, Buffer.concat(parts));
  return p;
}

test("the devices of the description, by section name and state layout name", () => {
  const json = JSON.stringify({
    page_size: 4096,
    devices: [
      { name: "i8254", instance_id: 0, vmsd_name: "i8254", version: 3, fields: [] },
      { name: "virtio-mmio@00000000feb02800/virtio-net", instance_id: 0, vmsd_name: "virtio-net", version: 11 },
      { name: "virtio-mmio@00000000feb02600/virtio-balloon", instance_id: 0, vmsd_name: "virtio-balloon", version: 1 },
    ],
  });
  expect(stateDevices(stateFile("a", json))).toEqual([
    { name: "i8254", vmsdName: "i8254" },
    { name: "virtio-mmio@00000000feb02800/virtio-net", vmsdName: "virtio-net" },
    { name: "virtio-mmio@00000000feb02600/virtio-balloon", vmsdName: "virtio-balloon" },
  ]);
  // device state bytes that happen to hold 0x00 0x06 do not fool it: the record must end the file
  const tricky = Buffer.from([0x00, 0x06, 0, 0, 0, 2, 0x7b, 0x7d, 0x7e, 0, 0, 0, 1]);
  expect(stateDevices(stateFile("b", JSON.stringify({ devices: [{ name: "x", vmsd_name: "x" }] }), tricky))?.map((d) => d.vmsdName)).toEqual(["x"]);
});

test("no description: null; a description that is not QEMU's JSON: vmm.stream_bad", () => {
  expect(stateDevices(stateFile("none", null))).toBeNull();
  for (const [name, json] of [["notjson", "{devices: ["], ["nodevices", JSON.stringify({ page_size: 4096 })]]) {
    let err: unknown;
    try {
      stateDevices(stateFile(name!, json!));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(VmmError);
    expect((err as VmmError).code).toBe("vmm.stream_bad");
  }
  expect(() => stateDevices(join(dir, "missing"))).toThrow();
});
