/**
 * The migration-stream filter on streams built here byte by byte in QEMU 7.2's layout
 * (src/vmm/qemu/migration.ts names the sources): guest-RAM page records dropped, everything else
 * kept byte for byte, a kept record following dropped ones named again, chunking irrelevant;
 * bad and truncated streams are typed errors. (The real-QEMU check is test/vmm/qemu/snapshot.test.ts:
 * a restore from a filtered state continues the guest.)
 */
import { describe, expect, test } from "bun:test";
import { filterMigrationStream } from "../../../src/vmm/qemu/migration.ts";

/** Byte writer for test streams. */
class W {
  parts: number[] = [];
  u8(n: number) {
    this.parts.push(n & 255);
    return this;
  }
  be32(n: number) {
    for (const s of [24, 16, 8, 0]) this.u8(n >>> s);
    return this;
  }
  be64(n: number) {
    this.be32(Math.floor(n / 2 ** 32));
    return this.be32(n >>> 0);
  }
  id(s: string) {
    this.u8(s.length);
    for (const c of s) this.u8(c.charCodeAt(0));
    return this;
  }
  bytes(b: Uint8Array | number[]) {
    for (const x of b) this.u8(x);
    return this;
  }
  get buf(): Uint8Array<ArrayBuffer> {
    return new Uint8Array(this.parts);
  }
}

const PAGE = 0x08, ZERO = 0x02, MEM_SIZE = 0x04, EOS = 0x10, CONT = 0x20;
const page = (fill: number) => new Uint8Array(4096).fill(fill);

function header(w: W, caps = ["x-ignore-shared"]): W {
  w.be32(0x5145564d).be32(3);
  w.u8(0x07).be32(7).bytes([..."microvm"].map((c) => c.charCodeAt(0)));
  w.u8(0x05).id("configuration/capabilities").be32(1).be32(caps.length);
  for (const c of caps) w.id(c);
  return w;
}

function setup(w: W): W {
  w.u8(0x01).be32(1).id("ram").be32(0).be32(4);
  w.be64((8192 + 4096) + MEM_SIZE).id("mem").be64(8192).be64(0).id("pc.bios").be64(4096).be64(0xfffff000);
  return w.be64(EOS).u8(0x7e).be32(1);
}

function tail(w: W): W {
  w.u8(0x04).be32(2).id("cpu").be32(0).be32(1).bytes([1, 2, 3, 4, 5]).u8(0x7e).be32(2);
  w.u8(0x1f).u8(0x06).be32(2).bytes([0x7b, 0x7d]);
  return w;
}

/** The full stream a restored VM's QEMU sends, and what the filter must make of it. */
function streams(): { input: Uint8Array<ArrayBuffer>; expected: Uint8Array<ArrayBuffer> } {
  const i = setup(header(new W()));
  i.u8(0x02).be32(1);
  i.be64(0 + PAGE).id("mem").bytes(page(0xaa)); // dropped
  i.be64(4096 + ZERO + CONT).u8(0); // dropped (continues mem)
  i.be64(0 + PAGE).id("pc.bios").bytes(page(0xbb)); // kept
  i.be64(EOS).u8(0x7e).be32(1);
  i.u8(0x03).be32(1);
  i.be64(4096 + PAGE).id("mem").bytes(page(0xcc)); // dropped
  i.be64(0 + PAGE).id("pc.bios").bytes(page(0xdd)); // kept: now continues the previous kept block
  i.be64(EOS).u8(0x7e).be32(1);
  tail(i);

  const e = setup(header(new W()));
  e.u8(0x02).be32(1);
  e.be64(0 + PAGE).id("pc.bios").bytes(page(0xbb));
  e.be64(EOS).u8(0x7e).be32(1);
  e.u8(0x03).be32(1);
  e.be64(0 + PAGE + CONT).bytes(page(0xdd));
  e.be64(EOS).u8(0x7e).be32(1);
  tail(e);
  return { input: i.buf, expected: e.buf };
}

async function* chunked(b: Uint8Array, size: number): AsyncGenerator<Uint8Array> {
  for (let o = 0; o < b.length; o += size) yield b.slice(o, o + size);
}

async function run(input: Uint8Array, size = 1 << 20) {
  const out: number[] = [];
  const stats = await filterMigrationStream(chunked(input, size), (b) => out.push(...b), (id) => id === "mem");
  return { out: new Uint8Array(out) as Uint8Array<ArrayBuffer>, stats };
}

describe("migration stream filter", () => {
  test("drops the guest RAM block's pages, keeps every other byte, names a kept block again when needed", async () => {
    const { input, expected } = streams();
    const { out, stats } = await run(input);
    expect(out).toEqual(expected);
    expect(stats).toMatchObject({ bytesIn: input.length, bytesOut: expected.length, pagesDropped: 3, zeroPagesDropped: 1, pagesKept: 2, ignoreShared: true });
    expect(stats.blocks).toEqual([
      { id: "mem", length: 8192 },
      { id: "pc.bios", length: 4096 },
    ]);
  });

  test("the output does not depend on how the input is chunked", async () => {
    const { input, expected } = streams();
    for (const size of [1, 7, 4096, 4101]) expect((await run(input, size)).out).toEqual(expected);
  });

  test("without x-ignore-shared the block list has no addresses", async () => {
    const w = header(new W(), []);
    w.u8(0x01).be32(1).id("ram").be32(0).be32(4).be64(8192 + MEM_SIZE).id("mem").be64(8192).be64(EOS).u8(0x7e).be32(1);
    w.u8(0x03).be32(1).be64(PAGE).id("mem").bytes(page(1)).be64(EOS).u8(0x7e).be32(1);
    tail(w);
    const { stats, out } = await run(w.buf);
    expect(stats.ignoreShared).toBe(false);
    expect(stats.pagesDropped).toBe(1);
    expect(out.length).toBe(w.buf.length - (8 + 4 + 4096));
  });

  test("bad streams are typed errors naming the problem", async () => {
    const bad = async (b: Uint8Array) => run(b).then(() => null, (e) => e as { code: string; message: string });
    expect(await bad(new W().be32(0x12345678).be32(3).buf)).toMatchObject({ code: "vmm.stream_bad", message: expect.stringContaining("magic") });
    expect(await bad(new W().be32(0x5145564d).be32(2).buf)).toMatchObject({ code: "vmm.stream_bad", message: expect.stringContaining("version") });
    const { input } = streams();
    expect(await bad(input.slice(0, 300))).toMatchObject({ code: "vmm.stream_truncated" });
    expect(await bad(input.slice(0, 8))).toMatchObject({ code: "vmm.stream_truncated" });
    const unknown = setup(header(new W())).u8(0x09);
    expect(await bad(unknown.buf)).toMatchObject({ code: "vmm.stream_bad", message: expect.stringContaining("0x9") });
    const block = header(new W()).u8(0x01).be32(3).id("block").be32(0).be32(1);
    expect(await bad(block.buf)).toMatchObject({ code: "vmm.stream_bad", message: expect.stringContaining('"block"') });
    const xbzrle = setup(header(new W())).u8(0x02).be32(1).be64(0x40).id("mem");
    expect(await bad(xbzrle.buf)).toMatchObject({ code: "vmm.stream_bad", message: expect.stringContaining("XBZRLE") });
    const sub = header(new W()).u8(0x05).id("configuration/other").be32(1);
    expect(await bad(sub.buf)).toMatchObject({ code: "vmm.stream_bad", message: expect.stringContaining("configuration/other") });
    const part = header(new W()).u8(0x02).be32(9);
    expect(await bad(part.buf)).toMatchObject({ code: "vmm.stream_bad", message: expect.stringContaining("never started") });
  });
});
