/**
 * Read-only LSMT layers: open a blob (optionally tar-wrapped and/or ZFile-compressed) through
 * its trailer and load its index (overlaybd-format.md 2.3, 2.6; lsmt/file.cpp do_load_index).
 */
import { type Backend, LocalFile, readExact } from "./backend.ts";
import { fail } from "./errors.ts";
import {
  decodeHeaderTrailer, decodeSegment, ENTRY_SIZE, type HeaderTrailer, HT_SIZE, HTFlag, INVALID_OFFSET,
  MAX_RO_INDEX_ENTRIES, SECTOR, type Segment,
} from "./format.ts";
import { validateRoIndex } from "./segments.ts";
import { openTarMember } from "./tar.ts";
import { isZFile, ZFileReader } from "./zfile.ts";

/** How a layer blob was wrapped, outside in. */
export interface LayerWrapping {
  tar: boolean;
  zfile: ZFileReader | null;
}

/** An opened read-only LSMT layer: its raw LSMT bytes, header, trailer and sorted index. */
export interface RoLayer {
  /** The path or URL the layer came from. */
  readonly name: string;
  /** The uncompressed LSMT file (after tar and ZFile are peeled off). */
  readonly lsmt: Backend;
  readonly header: HeaderTrailer;
  readonly trailer: HeaderTrailer;
  /** Sorted, validated, tags zeroed, padding dropped. Sectors. */
  readonly segments: Segment[];
  readonly wrapping: LayerWrapping;
}

/**
 * Peel the tar wrapper and the ZFile container off `blob` when present.
 * @returns the LSMT bytes and what was removed
 */
export async function unwrapBlob(blob: Backend): Promise<{ lsmt: Backend; wrapping: LayerWrapping }> {
  let b = blob;
  const tarred = await openTarMember(b);
  if (tarred) b = tarred;
  let zfile: ZFileReader | null = null;
  if (await isZFile(b)) {
    zfile = await ZFileReader.open(b);
    b = zfile;
  }
  return { lsmt: b, wrapping: { tar: tarred !== null, zfile } };
}

/**
 * Open a committed or sealed layer blob.
 * @throws OverlaybdError `truncated`, `bad_magic`, `bad_flags`, `bad_index` naming file and offset
 */
export async function openRoLayer(blob: Backend): Promise<RoLayer> {
  const { lsmt, wrapping } = await unwrapBlob(blob);
  const file = blob.name;
  const size = lsmt.size;
  if (size < 2 * HT_SIZE) fail("truncated", `LSMT layer of ${size} bytes is shorter than header + trailer`, { file, offset: size });
  const hb = new Uint8Array(HT_SIZE);
  await readExact(lsmt, hb, 0);
  const header = decodeHeaderTrailer(hb, file, 0);
  if (!(header.flags & HTFlag.HEADER) || !(header.flags & HTFlag.DATA)) {
    fail("bad_flags", `LSMT header flags 0x${header.flags.toString(16)} are not header|data`, { file, offset: 0, flags: header.flags });
  }
  const trailerOffset = size - HT_SIZE;
  const tb = new Uint8Array(HT_SIZE);
  await readExact(lsmt, tb, trailerOffset);
  const trailer = decodeHeaderTrailer(tb, file, trailerOffset);
  const f = trailer.flags;
  if (f & HTFlag.HEADER || !(f & HTFlag.DATA) || !(f & HTFlag.SEALED)) {
    fail("bad_flags", `LSMT trailer flags 0x${f.toString(16)} are not trailer|data|sealed (is this a writable data file?)`, { file, offset: trailerOffset, flags: f });
  }
  if (trailer.indexSize > MAX_RO_INDEX_ENTRIES) fail("bad_index", `trailer claims ${trailer.indexSize} index entries (max ${MAX_RO_INDEX_ENTRIES})`, { file, offset: trailerOffset + 40 });
  if (trailer.indexOffset % SECTOR !== 0 || trailer.indexOffset < HT_SIZE || trailer.indexOffset + trailer.indexSize * ENTRY_SIZE > trailerOffset) {
    fail("bad_index", `index of ${trailer.indexSize} entries at ${trailer.indexOffset} does not fit before the trailer at ${trailerOffset}`, { file, offset: trailerOffset + 32, indexOffset: trailer.indexOffset });
  }
  const raw = new Uint8Array(trailer.indexSize * ENTRY_SIZE);
  await readExact(lsmt, raw, trailer.indexOffset);
  const dv = new DataView(raw.buffer);
  const segments: Segment[] = [];
  for (let i = 0; i < trailer.indexSize; i++) {
    const s = decodeSegment(dv, i);
    if (s.offset === INVALID_OFFSET) continue;
    s.tag = 0;
    segments.push(s);
  }
  validateRoIndex(segments, trailer.indexOffset / SECTOR, file, trailer.indexOffset);
  return { name: file, lsmt, header, trailer, segments, wrapping };
}

/** Open a layer from a local path (tar/ZFile detected). */
export async function openRoLayerFile(path: string): Promise<RoLayer> {
  const f = LocalFile.open(path);
  try {
    return await openRoLayer(f);
  } catch (e) {
    await f.close();
    throw e;
  }
}
