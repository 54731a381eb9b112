/**
 * Encryption at rest of secret values: AES-256-GCM with a key kept outside the database (the file
 * `[secrets] key_path`, 32 random bytes as hex, made with mode 0600 on first start; a key file that
 * others may read is refused). Each sealed value is iv (12) | tag (16) | ciphertext, bound to its
 * secret's id (additional data), so a value moved to another row does not open.
 */
import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, statSync, writeSync } from "node:fs";
import { dirname } from "node:path";
import { errorMessage } from "../util/error.ts";
import { SecretsError } from "./errors.ts";

const KEY_BYTES = 32;
const IV_BYTES = 12;
const TAG_BYTES = 16;

/** Seals and opens values with one key. */
export class SecretCipher {
  private constructor(private readonly key: Buffer) {}

  /**
   * The key of `path`, made (32 random bytes, hex, mode 0600, parent directories 0700) when the
   * file does not exist and `create` is true. A store shared by several processes (Redis) passes
   * false: a key made here would be this process's alone.
   * @throws SecretsError `secrets.key_unusable` when the file cannot be made or read (or is
   *   missing and `create` is false), holds no 64-hex-digit key, or is readable or writable by
   *   group or others
   */
  static fromKeyFile(path: string, create = true): SecretCipher {
    if (!create && !existsSync(path)) throw new SecretsError("secrets.key_unusable", `the secrets key file ${path} does not exist: a shared store needs the one key of every process that uses it ([secrets] key_path)`, { path });
    try {
      if (!existsSync(path)) {
        mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
        // "wx": two nodes starting at once never both write a key
        const fd = openSync(path, "wx", 0o600);
        try {
          writeSync(fd, `${randomBytes(KEY_BYTES).toString("hex")}\n`);
        } finally {
          closeSync(fd);
        }
      }
    } catch (e) {
      if (!existsSync(path)) throw new SecretsError("secrets.key_unusable", `cannot create the secrets key file ${path}: ${errorMessage(e)}`, { path }, { cause: e });
    }
    let text: string;
    let mode: number;
    try {
      mode = statSync(path).mode & 0o777;
      text = readFileSync(path, "utf8").trim();
    } catch (e) {
      throw new SecretsError("secrets.key_unusable", `cannot read the secrets key file ${path}: ${errorMessage(e)}`, { path }, { cause: e });
    }
    if (mode & 0o077) throw new SecretsError("secrets.key_unusable", `the secrets key file ${path} has mode ${mode.toString(8)}: others may read it; chmod 600 it`, { path, mode: mode.toString(8) });
    if (!/^[0-9a-f]{64}$/i.test(text)) throw new SecretsError("secrets.key_unusable", `the secrets key file ${path} does not hold a key (64 hex digits)`, { path });
    return new SecretCipher(Buffer.from(text, "hex"));
  }

  /** A cipher over a given 32-byte key (tests). */
  static fromKey(key: Uint8Array): SecretCipher {
    if (key.length !== KEY_BYTES) throw new RangeError(`a secrets key is ${KEY_BYTES} bytes`);
    return new SecretCipher(Buffer.from(key));
  }

  /** Seal `value` for secret `id`. */
  seal(id: string, value: string): Buffer {
    const iv = randomBytes(IV_BYTES);
    const c = createCipheriv("aes-256-gcm", this.key, iv);
    c.setAAD(Buffer.from(id));
    const ct = Buffer.concat([c.update(value, "utf8"), c.final()]);
    return Buffer.concat([iv, c.getAuthTag(), ct]);
  }

  /**
   * Open a value sealed for secret `id`.
   * @throws SecretsError `secrets.sealed_corrupt` when it does not authenticate
   */
  open(id: string, sealed: Uint8Array): string {
    try {
      const b = Buffer.from(sealed);
      const d = createDecipheriv("aes-256-gcm", this.key, b.subarray(0, IV_BYTES));
      d.setAAD(Buffer.from(id));
      d.setAuthTag(b.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
      return Buffer.concat([d.update(b.subarray(IV_BYTES + TAG_BYTES)), d.final()]).toString("utf8");
    } catch (e) {
      throw new SecretsError("secrets.sealed_corrupt", `the stored value of secret ${id} does not decrypt with this node's key`, { secret: id }, { cause: e });
    }
  }
}
