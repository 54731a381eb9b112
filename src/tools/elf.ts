/**
 * The program interpreter (PT_INTERP) of an ELF executable, read and rewritten in place. The
 * tools drive carries its own glibc loader at a path of its own, and a `bun build --compile`
 * binary keeps its payload in an ELF section that tools which re-lay a file out must not move,
 * so the path is overwritten within the bytes the header already reserves (NUL-padded; the
 * kernel reads the p_filesz bytes and needs only a NUL at the end).
 * Offsets: ELF-64 object file format (System V gABI, `Elf64_Ehdr` / `Elf64_Phdr`).
 */
import { closeSync, openSync, readSync, writeSync } from "node:fs";
import { ToolsError } from "./errors.ts";

const EI_CLASS = 4; // 2 = ELFCLASS64
const EI_DATA = 5; // 1 = little-endian
const E_PHOFF = 0x20; // u64
const E_PHENTSIZE = 0x36; // u16
const E_PHNUM = 0x38; // u16
const P_TYPE = 0; // u32
const P_OFFSET = 8; // u64
const P_FILESZ = 32; // u64
const PT_INTERP = 3;
const PHDR_BYTES = 56;

/** Where the interpreter path lives in the file: byte offset and reserved length (NUL included). */
interface InterpSlot {
  offset: number;
  length: number;
}

function findInterp(fd: number, path: string): InterpSlot {
  const eh = Buffer.alloc(64);
  readSync(fd, eh, 0, 64, 0);
  if (eh.readUInt32BE(0) !== 0x7f454c46 || eh[EI_CLASS] !== 2 || eh[EI_DATA] !== 1) {
    throw new ToolsError("tools.bad_elf", `${path} is not a 64-bit little-endian ELF file`, { path });
  }
  const phoff = Number(eh.readBigUInt64LE(E_PHOFF));
  const phentsize = eh.readUInt16LE(E_PHENTSIZE);
  const phnum = eh.readUInt16LE(E_PHNUM);
  if (phentsize < PHDR_BYTES) throw new ToolsError("tools.bad_elf", `${path}: program header entries of ${phentsize} bytes`, { path, phentsize });
  const ph = Buffer.alloc(phentsize * phnum);
  readSync(fd, ph, 0, ph.length, phoff);
  for (let i = 0; i < phnum; i++) {
    const e = i * phentsize;
    if (ph.readUInt32LE(e + P_TYPE) !== PT_INTERP) continue;
    return { offset: Number(ph.readBigUInt64LE(e + P_OFFSET)), length: Number(ph.readBigUInt64LE(e + P_FILESZ)) };
  }
  throw new ToolsError("tools.bad_elf", `${path} has no PT_INTERP (a static executable)`, { path });
}

/** The interpreter path an ELF executable names. @throws ToolsError `tools.bad_elf`. */
export function readInterpreter(path: string): string {
  const fd = openSync(path, "r");
  try {
    const slot = findInterp(fd, path);
    const b = Buffer.alloc(slot.length);
    readSync(fd, b, 0, slot.length, slot.offset);
    const nul = b.indexOf(0);
    return b.subarray(0, nul < 0 ? b.length : nul).toString("latin1");
  } finally {
    closeSync(fd);
  }
}

/**
 * Point the executable at `path` to the interpreter `interp`, in place.
 * @throws ToolsError `tools.bad_elf` when it is not an ELF-64 LE executable with a PT_INTERP
 *   whose reserved bytes hold `interp` plus its NUL.
 */
export function setInterpreter(path: string, interp: string): void {
  const fd = openSync(path, "r+");
  try {
    const slot = findInterp(fd, path);
    const bytes = Buffer.from(interp, "latin1");
    if (bytes.length + 1 > slot.length) {
      throw new ToolsError("tools.bad_elf", `${path}: interpreter path ${interp} needs ${bytes.length + 1} bytes, the header has ${slot.length}`, { path, interp });
    }
    const out = Buffer.alloc(slot.length); // NUL padded
    bytes.copy(out);
    writeSync(fd, out, 0, out.length, slot.offset);
  } finally {
    closeSync(fd);
  }
}
