/**
 * Another process's memory through procfs: which pages of a file mapping it holds as private
 * (copy-on-write) copies, and their contents.
 *
 * Facts (Documentation/admin-guide/mm/pagemap.rst, fs/proc/task_mmu.c, proc(5)):
 * - `/proc/<pid>/maps`: one VMA per line, `start-end perms offset dev inode path`, addresses and
 *   offset in hex; a deleted file's path ends with " (deleted)".
 * - `/proc/<pid>/pagemap`: one little-endian u64 per virtual page at file offset (vaddr / page) * 8.
 *   Bit 63 present, bit 62 swapped, bit 61 "file-page or shared-anon". In a MAP_PRIVATE file
 *   mapping, a page the process wrote is an anonymous copy: present with bit 61 clear, or swapped
 *   (file pages are never swapped, only dropped). Pages only read map the page cache (bit 61 set).
 * - `/proc/<pid>/mem`: pread at a virtual address reads the process's memory (needs ptrace
 *   access: the same user with ptrace allowed, or CAP_SYS_PTRACE).
 */
import { closeSync, openSync, readFileSync, readSync } from "node:fs";
import { AgentEnvError } from "../errors.ts";
import type { FfiCodes } from "./errors.ts";
import { errorMessage } from "../util/error.ts";

/** Page size of x86-64 and arm64 (4 KiB) assumed by the pagemap walk. */
export const PAGE_SIZE = 4096;

/** pagemap entry bits, in the high 32-bit word of each little-endian u64. */
const PM_PRESENT_HI = 1 << 31; // bit 63
const PM_SWAPPED_HI = 1 << 30; // bit 62
const PM_FILE_HI = 1 << 29; // bit 61

/** One VMA mapping a file: virtual [start, end) backed by file bytes from `fileOffset`. */
export interface FileMapping {
  start: number;
  end: number;
  fileOffset: number;
}

/** A failure reading another process's memory; `pid` and `what` (maps, pagemap, mem) name the file at fault. */
export class ProcMemError extends AgentEnvError<FfiCodes<"procmem">> {
  constructor(
    message: string,
    readonly pid: number,
    readonly what: string,
  ) {
    super("procmem.failed", message, { pid, what });
  }
}

/**
 * The VMAs of process `pid` that map the file at `path`, sorted by address.
 * @throws ProcMemError when /proc/<pid>/maps cannot be read (process gone, no access)
 */
export function fileMappings(pid: number, path: string): FileMapping[] {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/maps`, "utf8");
  } catch (e) {
    throw new ProcMemError(`cannot read /proc/${pid}/maps: ${errorMessage(e)}`, pid, "maps");
  }
  const out: FileMapping[] = [];
  for (const line of text.split("\n")) {
    const m = /^([0-9a-f]+)-([0-9a-f]+) \S+ ([0-9a-f]+) \S+ \d+\s+(.*)$/.exec(line);
    if (!m) continue;
    const p = m[4]!.endsWith(" (deleted)") ? m[4]!.slice(0, -10) : m[4]!;
    if (p !== path) continue;
    out.push({ start: parseInt(m[1]!, 16), end: parseInt(m[2]!, 16), fileOffset: parseInt(m[3]!, 16) });
  }
  return out.sort((a, b) => a.start - b.start);
}

/**
 * File byte ranges whose pages process `pid` holds as private copies in `mappings` (present
 * anonymous pages and swapped pages), merged into sorted [start, end) runs of whole pages.
 * The process should be stopped (no writes while the walk runs) for an exact answer.
 * @throws ProcMemError when pagemap cannot be read
 */
export function privatePages(pid: number, mappings: readonly FileMapping[]): Array<[number, number]> {
  let fd: number;
  try {
    fd = openSync(`/proc/${pid}/pagemap`, "r");
  } catch (e) {
    throw new ProcMemError(`cannot open /proc/${pid}/pagemap: ${errorMessage(e)}`, pid, "pagemap");
  }
  const runs: Array<[number, number]> = [];
  const CHUNK_PAGES = 65536; // 512 KiB of entries per read
  const buf = new Uint32Array(CHUNK_PAGES * 2);
  const bytes = new Uint8Array(buf.buffer);
  try {
    for (const m of mappings) {
      const pages = (m.end - m.start) / PAGE_SIZE;
      for (let first = 0; first < pages; first += CHUNK_PAGES) {
        const n = Math.min(CHUNK_PAGES, pages - first);
        const want = n * 8;
        const pos = (m.start / PAGE_SIZE + first) * 8;
        let got = 0;
        while (got < want) {
          const r = readSync(fd, bytes, got, want - got, pos + got);
          if (r <= 0) throw new ProcMemError(`short read of /proc/${pid}/pagemap at ${pos + got}`, pid, "pagemap");
          got += r;
        }
        for (let i = 0; i < n; i++) {
          const hi = buf[i * 2 + 1]!;
          const priv = (hi & PM_SWAPPED_HI) !== 0 || ((hi & PM_PRESENT_HI) !== 0 && (hi & PM_FILE_HI) === 0);
          if (!priv) continue;
          const off = m.fileOffset + (first + i) * PAGE_SIZE;
          const last = runs[runs.length - 1];
          if (last && last[1] === off) last[1] = off + PAGE_SIZE;
          else runs.push([off, off + PAGE_SIZE]);
        }
      }
    }
  } catch (e) {
    if (e instanceof ProcMemError) throw e;
    throw new ProcMemError(`reading /proc/${pid}/pagemap failed: ${errorMessage(e)}`, pid, "pagemap");
  } finally {
    closeSync(fd);
  }
  runs.sort((a, b) => a[0] - b[0]);
  return runs;
}

/** Reads another process's memory through /proc/<pid>/mem. Close it with `close()`. */
export class ProcessMemory {
  private fd: number;

  /** @throws ProcMemError when /proc/<pid>/mem cannot be opened (no such process, no ptrace access) */
  constructor(readonly pid: number) {
    try {
      this.fd = openSync(`/proc/${pid}/mem`, "r");
    } catch (e) {
      throw new ProcMemError(`cannot open /proc/${pid}/mem: ${errorMessage(e)}`, pid, "mem");
    }
  }

  /**
   * Fill `buf` from virtual address `addr` of the process.
   * @throws ProcMemError on a short read (unmapped address) or any read error
   */
  read(buf: Uint8Array, addr: number): void {
    let got = 0;
    try {
      while (got < buf.length) {
        const r = readSync(this.fd, buf, got, buf.length - got, addr + got);
        if (r <= 0) break;
        got += r;
      }
    } catch (e) {
      throw new ProcMemError(`reading ${buf.length} bytes at 0x${addr.toString(16)} of pid ${this.pid} failed: ${errorMessage(e)}`, this.pid, "mem");
    }
    if (got < buf.length) throw new ProcMemError(`short read at 0x${addr.toString(16)} of pid ${this.pid}: ${got} of ${buf.length} bytes`, this.pid, "mem");
  }

  /** Close the descriptor (idempotent). */
  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
  }
}

/**
 * Read file bytes [offset, offset + buf.length) as process `mem` sees them through `mappings`
 * (the range must lie inside one mapping).
 * @throws ProcMemError when no mapping covers the range, or the read fails
 */
export function readMapped(mem: ProcessMemory, mappings: readonly FileMapping[], buf: Uint8Array, offset: number): void {
  const m = mappings.find((x) => offset >= x.fileOffset && offset + buf.length <= x.fileOffset + (x.end - x.start));
  if (!m) throw new ProcMemError(`file range ${offset}+${buf.length} is not mapped by pid ${mem.pid}`, mem.pid, "mem");
  mem.read(buf, m.start + (offset - m.fileOffset));
}
