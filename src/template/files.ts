/**
 * Files the SDK uploads for COPY steps: one tar (gzip or plain) per files hash, stored as
 * `$home/catalog/files/<hash>.tar`. The SDK asks `GET /templates/{id}/files/{hash}` and PUTs
 * the archive to the URL it gets, without the API key (../shared/docs/template-build.md §2-3),
 * so the URL carries its own authorisation: the template it was given for, an expiry and an
 * HMAC-SHA256 over template + hash + expiry with a per-node secret (`$home/catalog/upload-secret`,
 * made on first use). An archive, once stored, is never replaced: builds of other templates may
 * use the same files (the hash is the SDK's over the step and the source files, not over the
 * archive, so the node cannot check an upload against it: the first complete upload stays).
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { existsSync, linkSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { dirname, join } from "node:path";
import { TemplateError } from "./errors.ts";
import { fsyncDir } from "../util/durable.ts";
import { errorCode, errorMessage } from "../util/error.ts";

const HASH_RE = /^[0-9a-f]{64}$/;

/** Where upload URLs point: `{origin}/upload/template-files/{hash}?expires=..&token=..`. */
export const UPLOAD_PATH_RE = /^\/upload\/template-files\/([0-9a-f]{64})$/;

/** The store of uploaded build files. */
export class BuildFiles {
  readonly dir: string;
  private readonly secret: Buffer;

  constructor(catalogDir: string) {
    this.dir = join(catalogDir, "files");
    mkdirSync(this.dir, { recursive: true });
    const secretPath = join(catalogDir, "upload-secret");
    if (!existsSync(secretPath)) writeFileSync(secretPath, randomBytes(32).toString("hex") + "\n", { mode: 0o600 });
    this.secret = Buffer.from(readFileSync(secretPath, "utf8").trim(), "hex");
  }

  /** Path of the archive of `hash` (it may not exist). @throws TemplateError `template.bad_request` for a malformed hash. */
  path(hash: string): string {
    if (!HASH_RE.test(hash)) throw new TemplateError("template.bad_request", `files hash must be 64 lowercase hex digits, got ${JSON.stringify(hash)}`, { hash });
    return join(this.dir, `${hash}.tar`);
  }

  /** Whether the archive of `hash` was uploaded completely. */
  has(hash: string): boolean {
    return existsSync(this.path(hash));
  }

  /** A self-authorising upload URL on `origin` for files of template `templateID`, valid for `ttlSecs`. */
  uploadUrl(origin: string, templateID: string, hash: string, ttlSecs: number, now = Date.now()): string {
    this.path(hash);
    const expires = Math.floor(now / 1000) + ttlSecs;
    return `${origin}/upload/template-files/${hash}?template=${encodeURIComponent(templateID)}&expires=${expires}&token=${this.sign(templateID, hash, expires)}`;
  }

  /**
   * Check an upload URL's template, expiry and token.
   * @throws TemplateError `template.upload_denied` (bad or expired token).
   */
  checkToken(templateID: string | null, hash: string, expires: string | null, token: string | null, now = Date.now()): void {
    const exp = Number(expires);
    if (!templateID || !Number.isInteger(exp) || !token) throw new TemplateError("template.upload_denied", "upload URL lacks template/expires/token", { hash });
    if (exp * 1000 < now) throw new TemplateError("template.upload_denied", "upload URL expired", { hash, expires: exp });
    const want = Buffer.from(this.sign(templateID, hash, exp));
    const got = Buffer.from(token);
    if (want.length !== got.length || !timingSafeEqual(want, got)) throw new TemplateError("template.upload_denied", "upload URL token does not match", { hash });
  }

  /**
   * Store an upload: streamed to a temporary file, synced, linked into place only if no archive
   * of `hash` is there (a second upload of the same hash is read and dropped: the stored one is
   * never replaced). A cut upload leaves nothing. At most `maxBytes`.
   * @returns bytes received.
   * @throws TemplateError `template.upload_too_large`, `template.upload_failed`.
   */
  async store(hash: string, body: ReadableStream<Uint8Array> | null, maxBytes: number): Promise<number> {
    const final = this.path(hash);
    const tmp = `${final}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
    const fh = await open(tmp, "w", 0o600);
    let n = 0;
    try {
      if (body) {
        for await (const chunk of body) {
          n += chunk.length;
          if (n > maxBytes) throw new TemplateError("template.upload_too_large", `upload exceeds ${maxBytes} bytes`, { hash, maxBytes });
          for (let off = 0; off < chunk.length; ) off += (await fh.write(chunk, off, chunk.length - off)).bytesWritten;
        }
      }
      await fh.sync();
      await fh.close();
      try {
        linkSync(tmp, final);
        fsyncDir(dirname(final));
      } catch (e) {
        if (errorCode(e) !== "EEXIST") throw e;
      }
      return n;
    } catch (e) {
      await fh.close().catch(() => {});
      if (e instanceof TemplateError) throw e;
      throw new TemplateError("template.upload_failed", `upload of ${hash} failed: ${errorMessage(e)}`, { hash });
    } finally {
      rmSync(tmp, { force: true });
    }
  }

  private sign(templateID: string, hash: string, expires: number): string {
    return createHmac("sha256", this.secret).update(`${templateID}\n${hash}\n${expires}`).digest("hex");
  }
}
