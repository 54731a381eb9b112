/**
 * `agentenv image ...`: inspect and build overlaybd layers (info, cat, create, commit, zfile,
 * import-raw, import-sparse, stack). Every command exits non-zero with one line on stderr
 * (`agentenv image <cmd>: <reason>`) when its input is bad.
 */
import { defineCommand } from "citty";
import { existsSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import {
  compressLayer, createUpper, importRaw, importSparse, LayeredImage, LocalFile, openImageConfig, openStack, OverlaybdError,
  remoteOpener, unwrapBlob, type ZAlgoName,
} from "../storage/overlaybd/index.ts";
import { decodeHeaderTrailer, HT_SIZE, HTFlag } from "../storage/overlaybd/format.ts";
import { openRoLayer } from "../storage/overlaybd/layer.ts";
import { loadConfigOrExit } from "../node/load-config.ts";
import { registryAccess, registrySettings } from "../image/index.ts";
import { logger } from "../observability/log.ts";
import { errorCode, errorMessage } from "../util/error.ts";

class UsageError extends Error {}

/** Parse `123`, `4096`, `64GiB`, `1M`, `2k` into bytes. */
export function parseBytes(s: string | undefined, what: string): number {
  if (s === undefined || s === "") throw new UsageError(`${what} is required`);
  const m = /^(\d+)\s*([kmgt]?)(i?b?)$/i.exec(String(s).trim());
  if (!m) throw new UsageError(`${what}: not a size: ${JSON.stringify(s)}`);
  const mult = { "": 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3, t: 1024 ** 4 }[m[2]!.toLowerCase() as "" | "k" | "m" | "g" | "t"];
  const v = Number(m[1]) * mult;
  if (!Number.isSafeInteger(v)) throw new UsageError(`${what}: too large: ${s}`);
  return v;
}

function need(v: string | undefined, what: string): string {
  if (!v) throw new UsageError(`missing ${what}`);
  return v;
}

function algoArg(v: string | undefined, fallback: string): ZAlgoName {
  const a = (v ?? fallback).toLowerCase();
  if (a !== "zstd" && a !== "lz4") throw new UsageError(`--algo must be zstd or lz4, got ${JSON.stringify(v)}`);
  return a;
}

/** Run a command body; print one line and exit 1 (bad input) on failure. */
function guarded(name: string, body: (args: Record<string, any>) => Promise<void>) {
  return async ({ args }: { args: Record<string, any> }) => {
    try {
      await body(args);
    } catch (e) {
      // the reader went away (`image cat ... | head`): like cat(1), stop without a complaint
      if (errorCode(e) === "EPIPE") process.exit(0);
      const msg = e instanceof OverlaybdError || e instanceof UsageError ? e.message : errorMessage(e);
      process.stderr.write(`agentenv image ${name}: ${msg.split("\n")[0]}\n`);
      process.exit(e instanceof UsageError ? 2 : 1);
    }
  };
}

async function openForRead(target: string): Promise<LayeredImage> {
  if (!existsSync(target)) throw new UsageError(`no such file: ${target}`);
  if (!target.endsWith(".json")) return openStack({ lowers: [target] });
  // remote lowers: the node's [image] settings (mirrors, proxy, CAs; credentials from
  // $AENV_REGISTRY_AUTH_FILE, else [image] auth_file)
  const cfg = loadConfigOrExit();
  const registries = registrySettings(cfg, (m) => logger("image").warn(m));
  return openImageConfig(target, { remote: remoteOpener(cfg, process.env.AENV_REGISTRY_AUTH_FILE || registries.authFile || undefined, registryAccess(registries)) });
}

const info = defineCommand({
  meta: { name: "info", description: "print a layer's wrapping, ZFile header, LSMT header/trailer and index facts as JSON" },
  args: { file: { type: "positional", required: false, description: "layer blob (committed, sealed, ZFile, tar) or writable data file" } },
  run: guarded("info", async (a) => {
    const file = need(a.file, "FILE");
    if (!existsSync(file)) throw new UsageError(`no such file: ${file}`);
    const f = LocalFile.open(file);
    try {
      const { lsmt, wrapping } = await unwrapBlob(f);
      const out: Record<string, unknown> = { file, size: f.size, tar: wrapping.tar, zfile: wrapping.zfile ? { source: wrapping.zfile.source, ...wrapping.zfile.header } : null };
      const hb = new Uint8Array(HT_SIZE);
      await lsmt.pread(hb, 0);
      const header = decodeHeaderTrailer(hb, file, 0);
      out.header = header;
      if (header.flags & HTFlag.SEALED || lsmt.size >= 2 * HT_SIZE) {
        try {
          const layer = await openRoLayer(lsmt);
          let data = 0, zeroed = 0;
          for (const s of layer.segments) s.zeroed ? (zeroed += s.length) : (data += s.length);
          out.trailer = layer.trailer;
          out.index = { entries: layer.segments.length, dataSectors: data, zeroedSectors: zeroed };
        } catch (e) {
          if (header.flags & HTFlag.SEALED) throw e;
          out.trailer = null; // a writable data file has no trailer
        }
      }
      console.log(JSON.stringify(out, null, 2));
    } finally {
      await f.close();
    }
  }),
});

const cat = defineCommand({
  meta: { name: "cat", description: "write raw virtual bytes of a layer or a config.v1.json image to stdout" },
  args: {
    file: { type: "positional", required: false, description: "layer blob or config.v1.json (remote lowers: [image] mirrors, proxy, ca_path; credentials from $AENV_REGISTRY_AUTH_FILE or [image] auth_file, an auths JSON)" },
    offset: { type: "string", description: "start, bytes (default 0)" },
    length: { type: "string", description: "bytes to write (default: to the end)" },
  },
  run: guarded("cat", async (a) => {
    const img = await openForRead(need(a.file, "FILE|CONFIG"));
    try {
      const offset = a.offset === undefined ? 0 : parseBytes(a.offset, "--offset");
      if (offset >= img.size) throw new UsageError(`offset ${offset} is past the virtual size ${img.size}`);
      const length = a.length === undefined ? img.size - offset : parseBytes(a.length, "--length");
      if (offset + length > img.size) throw new UsageError(`range ${offset}+${length} is past the virtual size ${img.size}`);
      const buf = new Uint8Array(1 << 20);
      const w = Bun.stdout.writer();
      for (let done = 0; done < length;) {
        const n = Math.min(buf.length, length - done);
        await img.pread(buf.subarray(0, n), offset + done);
        w.write(buf.slice(0, n));
        await w.flush();
        done += n;
      }
      await w.end();
    } finally {
      await img.close();
    }
  }),
});

const create = defineCommand({
  meta: { name: "create", description: "create an empty writable layer (data + index files)" },
  args: {
    data: { type: "positional", required: false, description: "data file to create" },
    index: { type: "positional", required: false, description: "index file to create" },
    size: { type: "string", description: "virtual size (bytes or 64GiB-style); 0 = take the lower stack's", default: "0" },
    uuid: { type: "string", description: "layer UUID (default random)" },
    "parent-uuid": { type: "string", description: "parent layer UUID" },
    sparse: { type: "boolean", description: "sparse layout (overlaybd-create -s): data at 4096+offset, index from holes" },
  },
  run: guarded("create", async (a) => {
    await createUpper({ data: need(a.data, "DATA"), index: need(a.index, "INDEX") }, parseBytes(a.size, "--size"), { uuid: a.uuid, parentUuid: a["parent-uuid"], sparse: !!a.sparse });
  }),
});

const commit = defineCommand({
  meta: { name: "commit", description: "commit a writable layer into a committed (compacted) layer" },
  args: {
    data: { type: "positional", required: false, description: "writable data file" },
    index: { type: "positional", required: false, description: "writable index file" },
    out: { type: "positional", required: false, description: "output layer (must not exist)" },
    uuid: { type: "string", description: "UUID of the new layer (default: the writable layer's)" },
    "parent-uuid": { type: "string", description: "parent UUID (default: the writable layer's)" },
    message: { type: "string", alias: "m", description: "commit message (user tag, <= 256 bytes)" },
    zfile: { type: "string", description: "also compress: zstd or lz4 (writes OUT compressed)" },
    seal: { type: "boolean", description: "seal in place instead (DATA becomes a read-only layer; no OUT)" },
  },
  run: guarded("commit", async (a) => {
    if (a.seal) {
      if (a.out) throw new UsageError("--seal takes no OUT");
      const { RwLayer } = await import("../storage/overlaybd/rw.ts");
      const l = await RwLayer.open(need(a.data, "DATA"), need(a.index, "INDEX"));
      await l.seal();
      return;
    }
    const out = need(a.out, "OUT");
    const img = await openStack({ lowers: [], upper: { data: need(a.data, "DATA"), index: need(a.index, "INDEX") } });
    try {
      const target = a.zfile ? `${out}.tmp-commit` : out;
      const algo = a.zfile ? algoArg(a.zfile, loadConfigOrExit().overlaybd.zfile_algo) : undefined;
      await img.commit(target, { meta: { uuid: a.uuid, parentUuid: a["parent-uuid"], userTag: a.message } });
      if (algo) {
        try {
          await compressLayer(target, out, { algo });
        } finally {
          rmSync(target, { force: true });
        }
      }
    } finally {
      await img.close();
    }
  }),
});

const zfile = defineCommand({
  meta: { name: "zfile", description: "compress a committed layer into ZFile form" },
  args: {
    src: { type: "positional", required: false, description: "committed layer" },
    dst: { type: "positional", required: false, description: "output (must not exist)" },
    algo: { type: "string", description: "zstd (default) or lz4" },
    "block-size": { type: "string", description: "ZFile block size in bytes (default 4096)" },
    tar: { type: "boolean", description: "wrap in overlaybd's tar wrapper" },
  },
  run: guarded("zfile", async (a) => {
    const cfg = loadConfigOrExit();
    const algo = algoArg(a.algo, cfg.overlaybd.zfile_algo);
    const bs = a["block-size"] ? parseBytes(a["block-size"], "--block-size") : cfg.overlaybd.zfile_block_size;
    await compressLayer(need(a.src, "SRC"), need(a.dst, "DST"), { algo, blockSize: bs, tar: !!a.tar });
  }),
});

const importArgs = {
  src: { type: "positional", required: false, description: "source image" },
  out: { type: "positional", required: false, description: "output layer (must not exist)" },
  parent: { type: "string", description: "comma-separated parent layers (bottom first): store only differences" },
  uuid: { type: "string", description: "UUID of the new layer" },
  size: { type: "string", description: "virtual size (default: source size rounded up to 512)" },
} as const;

function importCommand(name: string, description: string, fn: typeof importRaw) {
  return defineCommand({
    meta: { name, description },
    args: importArgs,
    run: guarded(name, async (a) => {
      const src = need(a.src, "SRC"), out = need(a.out, "OUT");
      if (!existsSync(src)) throw new UsageError(`no such file: ${src}`);
      const parent = a.parent ? await openStack({ lowers: String(a.parent).split(",") }) : undefined;
      try {
        const meta = { uuid: a.uuid, parentUuid: parent?.lowers.at(-1)?.trailer.uuid, ...(a.size ? { virtualSize: parseBytes(a.size, "--size") } : {}) };
        const r = await fn(src, out, { parent, meta });
        console.log(JSON.stringify({ out, entries: r.segments.length, size: r.size }));
      } finally {
        await parent?.close();
      }
    }),
  });
}

const stack = defineCommand({
  meta: { name: "stack", description: "write a config.v1.json for layers (bottom first) and an optional writable upper, after checking it opens" },
  args: {
    config: { type: "positional", required: false, description: "config.v1.json to write" },
    lowers: { type: "string", description: "comma-separated layer files, bottom first" },
    "upper-data": { type: "string", description: "writable data file" },
    "upper-index": { type: "string", description: "writable index file" },
    "create-upper": { type: "boolean", description: "create the writable pair (size of the lowers)" },
  },
  run: guarded("stack", async (a) => {
    const config = need(a.config, "CONFIG");
    const lowers = a.lowers ? String(a.lowers).split(",").filter(Boolean).map((p) => resolve(p)) : [];
    const ud = a["upper-data"], ui = a["upper-index"];
    if (!!ud !== !!ui) throw new UsageError("--upper-data and --upper-index go together");
    if (a["create-upper"] && !ud) throw new UsageError("--create-upper needs --upper-data and --upper-index");
    if (a["create-upper"]) await createUpper({ data: ud, index: ui }, 0);
    const doc = { lowers: lowers.map((file) => ({ file })), ...(ud ? { upper: { data: resolve(ud), index: resolve(ui) } } : {}) };
    const img = await openStack({ lowers, upper: doc.upper });
    const size = img.size;
    await img.close();
    writeFileSync(config, JSON.stringify(doc, null, 2) + "\n");
    console.log(JSON.stringify({ config, layers: lowers.length, size }));
  }),
});

export default defineCommand({
  meta: { name: "image", description: "overlaybd layered block images" },
  subCommands: {
    info,
    cat,
    create,
    commit,
    zfile,
    "import-raw": importCommand("import-raw", "turn a raw disk image into a committed layer (zero 4 KiB blocks not stored)", importRaw),
    "import-sparse": importCommand("import-sparse", "turn a sparse file into a committed layer via SEEK_DATA/SEEK_HOLE", importSparse),
    stack,
  },
});
