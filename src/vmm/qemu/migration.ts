/**
 * A filter for QEMU's precopy migration stream: copies it record by record and drops the page
 * records of chosen RAM blocks, so the output holds the device state (and the pages of every
 * other RAM block) without the guest RAM, which the snapshot keeps in its memory layers.
 *
 * Stream layout (QEMU 7.2, migration/savevm.c and migration/ram.c; the loader is ram_load_precopy
 * and qemu_loadvm_state_main):
 *   be32 magic "QEVM" 0x5145564d, be32 version 3
 *   [0x07 CONFIGURATION: be32 len, machine name; subsections 0x05 (u8 len, name, be32 version, fields)]
 *   sections, each a type byte:
 *     0x01 START  be32 section id, u8 len + idstr, be32 instance id, be32 version id, payload
 *     0x02 PART / 0x03 END  be32 section id, payload
 *     0x04 FULL   (device state, non-iterable: vmstate fields without a length)
 *     0x08 COMMAND be16 command, be16 length, data
 *     0x1f EOF, then 0x06 VMDESCRIPTION (be32 length + JSON) may follow
 *   after START/PART/END/FULL payloads: footer 0x7e + be32 section id (machine types >= 2.5)
 * The payload of the "ram" iterable is a list of be64 records `offset | flags` (flags in the low
 * 12 bits, TARGET_PAGE_BITS on x86): 0x04 MEM_SIZE (offset = total bytes; then per block u8 len,
 * idstr, be64 used length, and be64 guest address when x-ignore-shared is on), 0x08 PAGE
 * (idstr unless 0x20 CONTINUE, then 4096 bytes), 0x02 ZERO (idstr unless CONTINUE, then 1 fill
 * byte), 0x10 EOS ends the payload. XBZRLE, compressed pages and RDMA hooks are refused.
 * Every FULL section comes after the iterables ended, so from the first FULL (or EOF) on the
 * rest of the stream is copied verbatim.
 */
import { VmmError } from "../errors.ts";

const MAGIC = 0x5145564d;
const VERSION = 3;
const TARGET_PAGE_SIZE = 4096;
const FLAG_BITS = 0xfff;

const SEC = { START: 0x01, PART: 0x02, END: 0x03, FULL: 0x04, SUBSECTION: 0x05, CONFIGURATION: 0x07, COMMAND: 0x08, EOF: 0x1f, FOOTER: 0x7e } as const;
const RAM = { ZERO: 0x02, MEM_SIZE: 0x04, PAGE: 0x08, EOS: 0x10, CONTINUE: 0x20, XBZRLE: 0x40, HOOK: 0x80, COMPRESS_PAGE: 0x100 } as const;

/** What the filter saw and wrote. Sizes in bytes. */
export interface MigrationFilterStats {
  bytesIn: number;
  bytesOut: number;
  /** Page records dropped (data pages, zero pages). */
  pagesDropped: number;
  zeroPagesDropped: number;
  /** Page records kept (other RAM blocks). */
  pagesKept: number;
  /** RAM blocks announced by the stream: idstr and used length (bytes). */
  blocks: Array<{ id: string; length: number }>;
  /** Whether the stream carries x-ignore-shared block addresses. */
  ignoreShared: boolean;
}

/**
 * Pull reader over an async byte source. `ensure` pulls chunks until enough bytes are buffered;
 * the synchronous readers then parse from the buffer (a record needs no await once its bytes are
 * in), and throw `vmm.stream_truncated` when the source ended short.
 */
class Reader {
  private buf = new Uint8Array(0);
  private pos = 0;
  private done = false;
  bytesIn = 0;
  private readonly it: AsyncIterator<Uint8Array>;

  constructor(src: AsyncIterable<Uint8Array>) {
    this.it = src[Symbol.asyncIterator]();
  }

  /** True when `n` bytes are buffered, or the source ended (no await needed either way). */
  ready(n: number): boolean {
    return this.done || this.buf.length - this.pos >= n;
  }

  /** Buffer at least `n` bytes if the source has them; false when it ended first. */
  async ensure(n: number): Promise<boolean> {
    if (this.buf.length - this.pos >= n) return true;
    const parts: Uint8Array[] = [this.buf.subarray(this.pos)];
    let have = parts[0]!.length;
    while (have < n && !this.done) {
      const r = await this.it.next();
      if (r.done) {
        this.done = true;
        break;
      }
      const c = r.value instanceof Uint8Array ? r.value : new Uint8Array(r.value as ArrayBuffer);
      this.bytesIn += c.length;
      parts.push(c);
      have += c.length;
    }
    if (parts.length > 1) {
      const next = new Uint8Array(have);
      let o = 0;
      for (const p of parts) {
        next.set(p, o);
        o += p.length;
      }
      this.buf = next;
      this.pos = 0;
    }
    return have >= n;
  }

  private need(n: number): void {
    if (this.buf.length - this.pos < n) {
      throw new VmmError("vmm.stream_truncated", `migration stream ended early (wanted ${n} more bytes at offset ${this.bytesIn - (this.buf.length - this.pos)})`, { offset: this.bytesIn });
    }
  }

  /** The next `n` bytes (a view; the underlying buffer is never modified). */
  take(n: number): Uint8Array {
    this.need(n);
    const v = this.buf.subarray(this.pos, this.pos + n);
    this.pos += n;
    return v;
  }

  /** The next byte without consuming it, or -1 when nothing is buffered. */
  peek(): number {
    return this.pos < this.buf.length ? this.buf[this.pos]! : -1;
  }

  u8(): number {
    this.need(1);
    return this.buf[this.pos++]!;
  }

  be32(): number {
    this.need(4);
    const b = this.buf, p = this.pos;
    this.pos += 4;
    return ((b[p]! << 24) | (b[p + 1]! << 16) | (b[p + 2]! << 8) | b[p + 3]!) >>> 0;
  }

  /** A be64 as a number (stream values stay far below 2^53). */
  be64(): number {
    const hi = this.be32();
    return hi * 2 ** 32 + this.be32();
  }

  /** u8 length + string. */
  id(): string {
    return dec.decode(this.take(this.u8()));
  }

  /** Hand every remaining byte (buffered first) to `sink`. */
  async drain(sink: (b: Uint8Array) => void): Promise<void> {
    if (this.pos < this.buf.length) sink(this.buf.subarray(this.pos));
    this.pos = this.buf.length;
    while (!this.done) {
      const r = await this.it.next();
      if (r.done) break;
      this.bytesIn += r.value.length;
      sink(r.value);
    }
    this.done = true;
  }
}

function be32(n: number): Uint8Array {
  return new Uint8Array([(n >>> 24) & 255, (n >>> 16) & 255, (n >>> 8) & 255, n & 255]);
}

function be64(n: number): Uint8Array {
  const out = new Uint8Array(8);
  out.set(be32(Math.floor(n / 2 ** 32)), 0);
  out.set(be32(n >>> 0), 4);
  return out;
}

function idBytes(id: string): Uint8Array {
  const s = new TextEncoder().encode(id);
  const out = new Uint8Array(1 + s.length);
  out[0] = s.length;
  out.set(s, 1);
  return out;
}

const dec = new TextDecoder();

/**
 * Copy the migration stream `input` to `write`, leaving out the page records of every RAM block
 * for which `drop(idstr)` is true. Everything else is copied byte for byte; a kept page record
 * that followed dropped ones gets its block name back (CONTINUE cleared) so the loader still
 * knows its block.
 * @returns counts of what was seen, kept and dropped
 * @throws VmmError `vmm.stream_bad` (bad magic/version, unknown section or record kind,
 *   unsupported capability such as XBZRLE), `vmm.stream_truncated` (input ended mid-record)
 */
export async function filterMigrationStream(input: AsyncIterable<Uint8Array>, write: (b: Uint8Array) => void, drop: (blockId: string) => boolean): Promise<MigrationFilterStats> {
  const r = new Reader(input);
  const st: MigrationFilterStats = { bytesIn: 0, bytesOut: 0, pagesDropped: 0, zeroPagesDropped: 0, pagesKept: 0, blocks: [], ignoreShared: false };
  const out = (b: Uint8Array) => {
    if (b.length === 0) return;
    st.bytesOut += b.length;
    write(b);
  };
  const bad = (msg: string, extra: Record<string, unknown> = {}) => new VmmError("vmm.stream_bad", `migration stream: ${msg}`, { offset: r.bytesIn, ...extra });
  const sections = new Map<number, string>();
  let lastStreamBlock = ""; // block of the previous page record in the input (CONTINUE refers to it)
  let lastKeptBlock = ""; // ... and in the output

  /** Largest fixed-size piece read at once: a PAGE record (header, name, data) or a block entry. */
  const RECORD_MAX = 8 + 256 + TARGET_PAGE_SIZE + 16;

  const configuration = async () => {
    await r.ensure(4);
    const len = r.be32();
    await r.ensure(len + 1);
    out(be32(len));
    out(r.take(len));
    while ((await r.ensure(1)) && r.peek() === SEC.SUBSECTION) {
      await r.ensure(RECORD_MAX);
      out(r.take(1));
      const name = r.id();
      out(idBytes(name));
      out(r.take(4)); // version id
      if (name === "configuration/capabilities") {
        const n = r.be32();
        out(be32(n));
        for (let i = 0; i < n; i++) {
          await r.ensure(256);
          const cap = r.id();
          out(idBytes(cap));
          if (cap === "x-ignore-shared") st.ignoreShared = true;
        }
      } else if (name === "configuration/target-page-bits") {
        const bits = r.be32();
        if (bits !== 12) throw bad(`target page bits ${bits} (only 4 KiB pages are supported)`, { bits });
        out(be32(bits));
      } else if (name === "configuration/uuid") {
        out(r.take(16));
      } else {
        throw bad(`unknown configuration subsection ${JSON.stringify(name)}`, { subsection: name });
      }
    }
  };

  const ramPayload = async () => {
    for (;;) {
      if (!r.ready(RECORD_MAX)) await r.ensure(RECORD_MAX);
      const v = r.be64();
      const flags = (v % 4096) & FLAG_BITS;
      const addr = v - flags;
      const kind = flags & ~RAM.CONTINUE;
      if (kind === RAM.MEM_SIZE) {
        out(be64(v));
        let left = addr;
        while (left > 0) {
          await r.ensure(RECORD_MAX);
          const id = r.id();
          const used = r.be64();
          out(idBytes(id));
          out(be64(used));
          if (st.ignoreShared) out(r.take(8));
          st.blocks.push({ id, length: used });
          left -= used;
        }
        if (left !== 0) throw bad(`RAM block lengths overrun the announced total by ${-left} bytes`);
      } else if (kind === RAM.PAGE || kind === RAM.ZERO) {
        const block = flags & RAM.CONTINUE ? lastStreamBlock : r.id();
        if (!block) throw bad("page record continues an unknown block");
        lastStreamBlock = block;
        const data = r.take(kind === RAM.PAGE ? TARGET_PAGE_SIZE : 1);
        if (drop(block)) {
          st.pagesDropped++;
          if (kind === RAM.ZERO) st.zeroPagesDropped++;
          continue;
        }
        st.pagesKept++;
        if (block === lastKeptBlock) out(be64(addr + kind + RAM.CONTINUE));
        else {
          out(be64(addr + kind));
          out(idBytes(block));
        }
        lastKeptBlock = block;
        out(data);
      } else if (kind === RAM.EOS) {
        out(be64(v));
        return;
      } else {
        throw bad(`unsupported RAM record flags 0x${flags.toString(16)} (XBZRLE, compression and RDMA must stay off)`, { flags });
      }
    }
  };

  const footer = async () => {
    if ((await r.ensure(1)) && r.peek() === SEC.FOOTER) {
      await r.ensure(5);
      out(r.take(5));
    }
  };

  const payload = async (sid: number) => {
    const id = sections.get(sid);
    if (id === undefined) throw bad(`section ${sid} was never started`, { sectionId: sid });
    if (id !== "ram") throw bad(`iterable section ${JSON.stringify(id)} is not supported (only "ram")`, { section: id });
    await ramPayload();
    await footer();
  };

  await r.ensure(8);
  if (r.be32() !== MAGIC) throw bad("bad magic (not a QEMU migration stream)");
  const version = r.be32();
  if (version !== VERSION) throw bad(`version ${version}, expected ${VERSION}`, { version });
  out(be32(MAGIC));
  out(be32(VERSION));
  for (;;) {
    if (!(await r.ensure(1))) throw new VmmError("vmm.stream_truncated", "migration stream ended before its EOF marker", { offset: r.bytesIn });
    const t = r.peek();
    if (t === SEC.FULL || t === SEC.EOF) {
      // device state and the end: no RAM pages past this point
      await r.drain(out);
      break;
    }
    await r.ensure(RECORD_MAX);
    out(r.take(1));
    if (t === SEC.CONFIGURATION) await configuration();
    else if (t === SEC.START) {
      const sid = r.be32();
      const id = r.id();
      out(be32(sid));
      out(idBytes(id));
      out(r.take(8)); // instance id, version id
      sections.set(sid, id);
      await payload(sid);
    } else if (t === SEC.PART || t === SEC.END) {
      const sid = r.be32();
      out(be32(sid));
      await payload(sid);
    } else if (t === SEC.COMMAND) {
      const head = r.take(4);
      out(head);
      const len = (head[2]! << 8) | head[3]!;
      await r.ensure(len);
      out(r.take(len));
    } else {
      throw bad(`unknown section type 0x${t.toString(16)}`, { type: t });
    }
  }
  st.bytesIn = r.bytesIn;
  return st;
}
