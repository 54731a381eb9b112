/**
 * `GET /files` and `POST /files` (docs/e2b-contract.md §3.3, §3.4): download a file, upload one
 * or more files as multipart or octet-stream. Bodies are streamed to and from disk.
 */
import { chmodSync, closeSync, fsyncSync, lstatSync, openSync, realpathSync, renameSync, rmSync, statSync, writeSync, type Stats } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { tokensEqual } from "../auth.ts";
import { freeBuffer } from "../buffers.ts";
import { fileSignature, SIGNATURE_EXPIRED } from "../signature.ts";
import { EnvdError, fromFsError } from "../errors.ts";
import { metadataFromHeaders, replaceMetadata } from "../metadata.ts";
import { uploadTempName } from "../upload-names.ts";
import { resolvePath } from "../paths.ts";
import { checkedAs, chownTo, ensureDirs, requireAccess, requireParentWritable, R_OK, W_OK } from "../permissions.ts";
import type { EnvdState } from "../state.ts";
import { lookupUser, type UserInfo } from "../users.ts";
import { boundaryOf, readMultipart } from "./multipart.ts";
import { errorCode } from "../../util/error.ts";

/** One uploaded file in the POST /files answer. */
export interface UploadedEntry {
  path: string;
  name: string;
  type: "file";
  /** Stored metadata (X-Metadata-* headers), present when non-empty. */
  metadata?: Record<string, string>;
}

export { fileSignature } from "../signature.ts";

/**
 * Authorise a /files request: the access token if one is sent, else a signature when a token
 * is set. Returns the acting user.
 * @throws EnvdError `unauthenticated` for a bad token, signature, expiry or user.
 */
export function authorizeFiles(state: EnvdState, req: Request, url: URL, op: "read" | "write"): UserInfo {
  const username = url.searchParams.get("username") ?? "";
  const token = req.headers.get("x-access-token") || null; // empty = absent, as in E2B's envd
  if (state.accessToken) {
    if (token !== null) {
      if (!tokensEqual(token, state.accessToken)) throw new EnvdError("unauthenticated", "invalid access token", {});
    } else {
      const sig = url.searchParams.get("signature");
      if (!sig) throw new EnvdError("unauthenticated", "missing access token or signature", {});
      const expRaw = url.searchParams.get("signature_expiration");
      const exp = expRaw === null ? undefined : Number(expRaw);
      if (exp !== undefined && !Number.isInteger(exp)) throw new EnvdError("unauthenticated", "invalid signature expiration", { expRaw });
      const want = fileSignature(url.searchParams.get("path") ?? "", op, username, state.accessToken, exp);
      if (!tokensEqual(sig, want)) throw new EnvdError("unauthenticated", "invalid signature", {});
      if (exp !== undefined && exp < Date.now() / 1000) throw new EnvdError("unauthenticated", SIGNATURE_EXPIRED, { exp });
    }
  }
  return lookupUser(username || state.defaultUser);
}

/**
 * An upload's destination file. Each chunk of the body is written as it arrives, so no more than
 * the chunk being written is held. A regular file is written with write(2) on the event loop's
 * thread: what Bun's FileSink does for one as well (strace of Bun 1.4.4: one blocking write per
 * 64 KiB chunk on the main thread, `highWaterMark` batching nothing), without the sink's own
 * bookkeeping. Anything else (a FIFO, a tty, a character device) may block for as long as its
 * reader waits, and that reader may be a process whose output this envd drains: it is written
 * from the thread pool (`FileHandle.write`) so the event loop runs on. A chunk that the body
 * stream handed over whole (`release`) is freed right after its write (`freeBuffer`) instead of
 * waiting for the collector: the next chunks reuse that memory rather than fault in fresh pages.
 */
class UploadFile {
  private constructor(
    private readonly fh: FileHandle,
    readonly path: string,
    /** A regular file: written synchronously (see the class doc). */
    private readonly regular: boolean,
    /**
     * Where the bytes go until the upload is complete: a new file beside the target, renamed over
     * it by `close` (after a datasync) and removed by `abort`; null when the target is written in
     * place (not a regular file, or one with other hard links, which must see the new content).
     */
    private readonly tmp: { path: string; target: string } | null,
  ) {}

  /**
   * Open `path` for writing for `user`: parents created and owned by the user. A regular file is
   * written as a new file beside it and renamed over it at the end, so that an upload cut short
   * (the client, the node between it and the sandbox, or the sandbox dies) leaves the file as it
   * was, never torn under its name; it keeps the old file's mode (a symlink is followed: its
   * target is replaced). Rights are checked for `checker` (see `checkedAs`).
   * @throws EnvdError from the checks, or the open mapped by `fromFsError`.
   */
  static async open(path: string, user: UserInfo, checker: UserInfo): Promise<UploadFile> {
    try {
      if (lstatSync(path).isDirectory()) throw new EnvdError("invalid_argument", `path '${path}' is a directory`, { path });
      requireAccess(checker, path, W_OK, "upload");
    } catch (err) {
      if (err instanceof EnvdError && err.kind !== "not_found") throw err;
      if (!(err instanceof EnvdError) && errorCode(err) !== "ENOENT") throw fromFsError(err, path, "upload");
      requireParentWritable(checker, path, "upload");
    }
    ensureDirs(dirname(path), user, "upload");
    let old: Stats | undefined;
    try {
      old = statSync(path);
    } catch {
      // a new file (or a dangling link: the link is replaced)
    }
    const inPlace = old !== undefined && (!old.isFile() || old.nlink > 1);
    const target = old ? realpathSync(path) : path;
    const tmp = inPlace ? null : { path: join(dirname(target), uploadTempName(basename(target))), target };
    const opened = tmp?.path ?? path;
    let fh: FileHandle;
    try {
      fh = await open(opened, tmp ? "wx" : "w", 0o644);
    } catch (err) {
      throw fromFsError(err, path, "upload");
    }
    try {
      if (tmp && old) chmodSync(tmp.path, old.mode & 0o7777);
      chownTo(opened, user);
      return new UploadFile(fh, path, (await fh.stat()).isFile(), tmp);
    } catch (err) {
      await fh.close().catch(() => {});
      if (tmp) rmSync(tmp.path, { force: true });
      throw err instanceof EnvdError ? err : fromFsError(err, path, "upload");
    }
  }

  /**
   * Append `chunk` (all of it: short writes are continued). With `release`, `chunk` is the body
   * stream's own and freed once written, when it is a whole ArrayBuffer that can be detached (a
   * view into a buffer still in use, such as the multipart parser's, must not be).
   * @throws EnvdError (ENOSPC: insufficient_storage; a write that takes no byte: internal)
   */
  async write(chunk: Uint8Array, release: boolean): Promise<void> {
    try {
      for (let off = 0; off < chunk.byteLength; ) {
        const n = this.regular ? writeSync(this.fh.fd, chunk, off) : (await this.fh.write(chunk, off)).bytesWritten;
        if (n <= 0) throw Object.assign(new Error(`write took no byte at offset ${off} of a ${chunk.byteLength}-byte chunk`), { code: "EIO" });
        off += n;
      }
    } catch (err) {
      throw fromFsError(err, this.path, "upload");
    }
    if (release) freeBuffer(chunk);
  }

  /**
   * Close the file; a new file is synced, renamed over the target and the rename synced (the
   * directory), so an upload the client saw answered is on the sandbox's disk: a VM that dies
   * right after (its disk kept as it left it) has it.
   * @throws EnvdError when the sync, close or rename fails (the target is then as it was).
   */
  async close(): Promise<void> {
    try {
      if (this.tmp) await this.fh.datasync();
      await this.fh.close();
      if (this.tmp) {
        renameSync(this.tmp.path, this.tmp.target);
        syncDir(dirname(this.tmp.target));
      }
    } catch (err) {
      if (this.tmp) rmSync(this.tmp.path, { force: true });
      throw fromFsError(err, this.path, "upload");
    }
  }

  /** Close after a failure, the target left as it was; never throws. */
  async abort(): Promise<void> {
    await this.fh.close().catch(() => {});
    if (this.tmp) rmSync(this.tmp.path, { force: true });
  }
}

/** fsync directory `dir` (a rename in it reaches the disk). */
function syncDir(dir: string): void {
  const fd = openSync(dir, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * The request's body, gunzipped when `Content-Encoding: gzip`. `owned`: its chunks are the
 * request body's own buffers, handed over whole, which the reader may free once written (true of
 * a request Bun.serve read from the network; a Request made in-process from a ReadableStream
 * would hand over its caller's buffers); the decompressor's are not freed (it may hand out views
 * into a buffer of its own).
 * @throws EnvdError invalid_argument for another content encoding
 */
function bodyStream(req: Request): { stream: ReadableStream<Uint8Array>; owned: boolean } {
  const body = req.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
  const enc = (req.headers.get("content-encoding") ?? "").toLowerCase();
  if (enc === "gzip") return { stream: body.pipeThrough(new DecompressionStream("gzip")) as ReadableStream<Uint8Array>, owned: false };
  if (enc && enc !== "identity") throw new EnvdError("invalid_argument", `unsupported content encoding '${enc}'`, { enc });
  return { stream: body, owned: true };
}

/**
 * Handle POST /files: multipart (each `file` part to its filename, or to `path`) or octet-stream
 * (to `path`), written as the body arrives (see `UploadFile`).
 * @throws EnvdError on bad input (400), auth (401), rights (403), space (507).
 */
export async function uploadFiles(state: EnvdState, req: Request, url: URL): Promise<UploadedEntry[]> {
  const user = authorizeFiles(state, req, url, "write");
  const checker = checkedAs(user, state.enforcePermissions);
  const queryPath = url.searchParams.get("path") || undefined;
  const ctype = (req.headers.get("content-type") ?? "").toLowerCase();
  const meta = metadataFromHeaders(req.headers);
  const hasMeta = Object.keys(meta).length > 0;
  const finish = (path: string): UploadedEntry => {
    replaceMetadata(path, meta);
    return { path, name: basename(path), type: "file", ...(hasMeta ? { metadata: { ...meta } } : {}) };
  };
  const done: UploadedEntry[] = [];
  const open_: UploadFile[] = [];
  try {
    if (ctype.startsWith("multipart/form-data")) {
      const seen = new Set<string>();
      await readMultipart(bodyStream(req).stream, boundaryOf(req.headers.get("content-type")!), async (info) => {
        if (info.name !== "file") return null;
        const raw = queryPath ?? info.filename;
        if (!raw) throw new EnvdError("invalid_argument", "part has no filename and no path query is given", {});
        const path = resolvePath(raw, user, state.defaultWorkdir);
        if (seen.has(path)) throw new EnvdError("invalid_argument", `path '${path}' given more than once`, { path });
        seen.add(path);
        const file = await UploadFile.open(path, user, checker);
        open_.push(file);
        return {
          // the parser's chunks are views into its own buffer: written, never freed here
          write: (c) => file.write(c, false),
          end: async () => {
            open_.splice(open_.indexOf(file), 1);
            await file.close();
            done.push(finish(path));
          },
        };
      });
    } else if (ctype.startsWith("application/octet-stream") || ctype === "") {
      if (!queryPath) throw new EnvdError("invalid_argument", "path query is required for octet-stream uploads", {});
      const path = resolvePath(queryPath, user, state.defaultWorkdir);
      const { stream, owned } = bodyStream(req);
      const file = await UploadFile.open(path, user, checker);
      open_.push(file);
      for await (const chunk of stream) await file.write(chunk, owned);
      open_.pop();
      await file.close();
      done.push(finish(path));
    } else {
      throw new EnvdError("invalid_argument", `unsupported content type '${ctype}'`, { contentType: ctype });
    }
  } finally {
    for (const file of open_) await file.abort();
  }
  if (done.length === 0) throw new EnvdError("invalid_argument", "no file in the upload", {});
  return done;
}

/**
 * `Content-Disposition` for a download of `name`, ASCII only (HTTP header values are bytes; Bun
 * refuses anything else): `inline; filename="<name>"` when the name is printable ASCII, else an
 * ASCII fallback (`_` for every other character) plus `filename*=UTF-8''<percent-encoded UTF-8>`
 * (RFC 6266 §4.3, RFC 8187 / 5987 ext-value: only attr-chars stay unencoded).
 */
export function contentDisposition(name: string): string {
  const fallback = name.replace(/[^\x20-\x7e]|["\\]/gu, "_");
  if (fallback === name) return `inline; filename="${name}"`;
  const ext = encodeURIComponent(name).replace(/['()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
  return `inline; filename="${fallback}"; filename*=UTF-8''${ext}`;
}

/** Content codings GET /files can send (RFC 9110 §8.4.1). */
export type FileCoding = "gzip" | "identity";

/**
 * Weights of gzip and identity in an `Accept-Encoding` value (RFC 9110 §12.5.3): each coding's
 * `q` (default 1, clamped to 0..1; a repeated coding keeps its highest); `*` stands for codings
 * not listed; identity, when neither it nor `*` is listed, stays acceptable but below any coding
 * the client names. No header, or an empty one, accepts identity only.
 */
export function encodingWeights(header: string | null): Record<FileCoding, number> {
  if (header === null || header.trim() === "") return { gzip: 0, identity: 1 };
  const q = new Map<string, number>();
  for (const item of header.split(",")) {
    const [raw, ...params] = item.split(";").map((x) => x.trim().toLowerCase());
    if (!raw) continue;
    const coding = raw === "x-gzip" ? "gzip" : raw;
    let weight = 1;
    for (const p of params) {
      const m = /^q\s*=\s*([0-9.]+)$/.exec(p);
      if (m) weight = Math.min(1, Math.max(0, Number(m[1]) || 0));
    }
    q.set(coding, Math.max(weight, q.get(coding) ?? 0));
  }
  const star = q.get("*");
  return { gzip: q.get("gzip") ?? star ?? 0, identity: q.get("identity") ?? star ?? Number.MIN_VALUE };
}

/** The coding to send: the acceptable one with the higher weight, gzip on a tie; null when neither is acceptable (406). */
export function chooseEncoding(header: string | null): FileCoding | null {
  const w = encodingWeights(header);
  if (w.gzip > 0 && w.gzip >= w.identity) return "gzip";
  return w.identity > 0 ? "identity" : null;
}

/** Parse a single `bytes=a-b` range against `size`; undefined when absent or unsupported. */
export function parseRange(header: string | null, size: number): { start: number; end: number } | "unsatisfiable" | undefined {
  if (!header) return undefined;
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m || (m[1] === "" && m[2] === "")) return undefined;
  let start: number;
  let end: number;
  if (m[1] === "") {
    start = Math.max(0, size - Number(m[2]));
    end = size - 1;
  } else {
    start = Number(m[1]);
    end = m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1);
  }
  if (start > end || start >= size) return "unsatisfiable";
  return { start, end };
}

/**
 * Handle GET /files: the file's bytes (Range and gzip supported); a device, FIFO or socket
 * answers an empty body.
 * @throws EnvdError not_found (404), directory (400), rights (403), auth (401).
 */
export function downloadFile(state: EnvdState, req: Request, url: URL): Response {
  const user = authorizeFiles(state, req, url, "read");
  const raw = url.searchParams.get("path");
  if (!raw) throw new EnvdError("invalid_argument", "path query is required", {});
  const path = resolvePath(raw, user, state.defaultWorkdir);
  let st;
  try {
    st = statSync(path);
  } catch (err) {
    throw fromFsError(err, path, "download");
  }
  if (st.isDirectory()) throw new EnvdError("invalid_argument", `path '${path}' is a directory`, { path });
  requireAccess(checkedAs(user, state.enforcePermissions), path, R_OK, "download");
  const file = Bun.file(path);
  const headers = new Headers({
    "Content-Type": file.type || "application/octet-stream",
    "Content-Disposition": contentDisposition(basename(path)),
    "Accept-Ranges": "bytes",
    "Last-Modified": st.mtime.toUTCString(),
    Vary: "Accept-Encoding",
  });
  const coding = chooseEncoding(req.headers.get("accept-encoding"));
  const range = parseRange(req.headers.get("range"), st.size);
  // a range is sent as it is stored: identity must be acceptable for it
  if (coding === null || (range && encodingWeights(req.headers.get("accept-encoding")).identity === 0)) {
    throw new EnvdError("not_acceptable", `no acceptable content coding in Accept-Encoding '${req.headers.get("accept-encoding")}' (this envd sends gzip or identity)`, {
      acceptEncoding: req.headers.get("accept-encoding"),
    });
  }
  if (range === "unsatisfiable") {
    headers.set("Content-Range", `bytes */${st.size}`);
    return new Response(null, { status: 416, headers });
  }
  if (range) {
    headers.set("Content-Range", `bytes ${range.start}-${range.end}/${st.size}`);
    return new Response(file.slice(range.start, range.end + 1), { status: 206, headers });
  }
  // a device, FIFO or socket has no size: like E2B's envd (Go's ServeContent sizes a file by
  // seeking to its end, which is 0 for them), it answers empty instead of reading it forever
  const empty = st.size === 0 || !st.isFile();
  if (coding === "gzip") {
    headers.set("Content-Encoding", "gzip");
    if (empty) return new Response(Bun.gzipSync(new Uint8Array(0)), { status: 200, headers });
    return new Response(file.stream().pipeThrough(new CompressionStream("gzip")), { status: 200, headers });
  }
  if (empty) return new Response(new Uint8Array(0), { status: 200, headers });
  return new Response(file, { status: 200, headers });
}
