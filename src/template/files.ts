/**
 * Files the SDK uploads for COPY steps: one tar (gzip or plain) per files hash, stored as
 * `$home/catalog/files/<hash>.tar`. The SDK asks `GET /templates/{id}/files/{hash}` and PUTs
 * the archive to the URL it gets, without the API key (../shared/docs/template-build.md §2-3),
 * so the URL carries its own authorisation: an expiry and an HMAC-SHA256 over hash + expiry
 * with a per-node secret (`$home/catalog/upload-secret`, made on first use).
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { TemplateError } from "./errors.ts";

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

  /** A self-authorising upload URL on `origin`, valid for `ttlSecs`. */
  uploadUrl(origin: string, hash: string, ttlSecs: number, now = Date.now()): string {
    this.path(hash);
    const expires = Math.floor(now / 1000) + ttlSecs;
    return `${origin}/upload/template-files/${hash}?expires=${expires}&token=${this.sign(hash, expires)}`;
  }

  /**
   * Check an upload URL's expiry and token.
   * @throws TemplateError `template.upload_denied` (bad or expired token).
   */
  checkToken(hash: string, expires: string | null, token: string | null, now = Date.now()): void {
    const exp = Number(expires);
    if (!Number.isInteger(exp) || !token) throw new TemplateError("template.upload_denied", "upload URL lacks expires/token", { hash });
    if (exp * 1000 < now) throw new TemplateError("template.upload_denied", "upload URL expired", { hash, expires: exp });
    const want = Buffer.from(this.sign(hash, exp));
    const got = Buffer.from(token);
    if (want.length !== got.length || !timingSafeEqual(want, got)) throw new TemplateError("template.upload_denied", "upload URL token does not match", { hash });
  }

  /**
   * Store an upload: streamed to a temporary file, fsynced, renamed into place (a cut upload
   * leaves nothing). At most `maxBytes`.
   * @returns bytes written.
   * @throws TemplateError `template.upload_too_large`, `template.upload_failed`.
   */
  async store(hash: string, body: ReadableStream<Uint8Array> | null, maxBytes: number): Promise<number> {
    const final = this.path(hash);
    const tmp = `${final}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
    const fd = openSync(tmp, "w", 0o600);
    let n = 0;
    try {
      if (body) {
        for await (const chunk of body) {
          n += chunk.length;
          if (n > maxBytes) throw new TemplateError("template.upload_too_large", `upload exceeds ${maxBytes} bytes`, { hash, maxBytes });
          let off = 0;
          while (off < chunk.length) off += writeSync(fd, chunk, off);
        }
      }
      fsyncSync(fd);
    } catch (e) {
      closeSync(fd);
      rmSync(tmp, { force: true });
      if (e instanceof TemplateError) throw e;
      throw new TemplateError("template.upload_failed", `upload of ${hash} failed: ${(e as Error).message}`, { hash });
    }
    closeSync(fd);
    renameSync(tmp, final);
    return n;
  }

  private sign(hash: string, expires: number): string {
    return createHmac("sha256", this.secret).update(`${hash}\n${expires}`).digest("hex");
  }
}
