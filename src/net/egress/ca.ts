/**
 * The node's egress CA: a P-256 ECDSA certificate authority made once per node (kept in
 * `[network.egress] ca_dir`: ca.crt, and ca.key with mode 0600) whose certificate envd puts into
 * every guest's trust store (/init `caBundle`), and the leaf certificates it signs on demand for
 * the hosts a sandbox's rules intercept (one per host name, cached; one key pair per node process
 * for all leaves). X.509 by @peculiar/x509 over WebCrypto (it needs the Reflect metadata polyfill).
 */
import "reflect-metadata";
import type * as X509 from "@peculiar/x509";
import { webcrypto } from "node:crypto";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, statSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { errorMessage } from "../../util/error.ts";
import { NetError } from "../errors.ts";
import { LruMap } from "../../util/lru.ts";

/**
 * @peculiar/x509, loaded after the polyfill above (tsyringe, which it loads, throws at load time
 * without `Reflect.getMetadata`). Required in the module body, not imported: `bun build` evaluates
 * a lazily wrapped module's ES imports before its CommonJS ones (reflect-metadata is CommonJS), so
 * with two imports the compiled binary loaded x509 first and any role loading this module died at
 * start; an ES module of its own for the polyfill instead fixes the bundle but not `bun run`,
 * where CommonJS imports are then evaluated ahead of it some of the time.
 */
const x509: typeof X509 = require("@peculiar/x509");

const ALG = { name: "ECDSA", namedCurve: "P-256", hash: "SHA-256" } as const;
const HOUR = 3_600_000;
const DAY = 24 * HOUR;
/** CA lifetime: ten years. */
const CA_DAYS = 3650;
/** Leaf lifetime; leaves are re-minted when less than a day is left. */
const LEAF_DAYS = 7;

x509.cryptoProvider.set(webcrypto as unknown as Crypto);

/** A leaf certificate and its key, as PEM, for a TLS server context. */
export interface LeafCert {
  cert: string;
  key: string;
  notAfter: number;
}

function pemKey(der: ArrayBuffer): string {
  const b64 = Buffer.from(der).toString("base64");
  return `-----BEGIN PRIVATE KEY-----\n${b64.match(/.{1,64}/g)!.join("\n")}\n-----END PRIVATE KEY-----\n`;
}

function derOfPemKey(pem: string): Buffer {
  const m = /-----BEGIN PRIVATE KEY-----([A-Za-z0-9+/=\s]+)-----END PRIVATE KEY-----/.exec(pem);
  if (!m) throw new Error("not a PKCS#8 PEM private key");
  return Buffer.from(m[1]!.replace(/\s+/g, ""), "base64");
}

const serial = () => `01${Buffer.from(webcrypto.getRandomValues(new Uint8Array(15))).toString("hex")}`;

/** The CA of one node. Create with `EgressCa.open(dir, label)`. */
export class EgressCa {
  /** Minted leaves by host, oldest minted first: past `maxLeaves` the oldest goes. */
  private readonly leaves: LruMap<string, Promise<LeafCert>>;
  private leafKeys: Promise<CryptoKeyPair> | undefined;

  private constructor(
    /** The CA certificate (PEM): what guests trust. */
    readonly certPem: string,
    private readonly cert: X509.X509Certificate,
    private readonly key: CryptoKey,
    /** Most leaves kept in memory. */
    maxLeaves: number,
  ) {
    this.leaves = new LruMap(maxLeaves);
  }

  /**
   * The CA in `dir` (ca.crt + ca.key), made there when absent (key written with mode 0600,
   * directory 0700). `label` goes into the subject (e.g. the node id).
   * @throws NetError `net.bad_config` when the files cannot be made or read, do not belong
   *   together, or the key file is readable by others
   */
  static async open(dir: string, label: string, maxLeaves = 1024): Promise<EgressCa> {
    const certPath = join(dir, "ca.crt");
    const keyPath = join(dir, "ca.key");
    const fail = (why: string, e?: unknown) => new NetError("net.bad_config", `egress CA in ${dir}: ${why}${e ? `: ${errorMessage(e)}` : ""}`, { key: "network.egress.ca_dir", value: dir }, e ? { cause: e } : undefined);
    try {
      if (!existsSync(certPath) || !existsSync(keyPath)) {
        mkdirSync(dir, { recursive: true, mode: 0o700 });
        const keys = (await webcrypto.subtle.generateKey(ALG, true, ["sign", "verify"])) as CryptoKeyPair;
        const now = Date.now();
        const cert = await x509.X509CertificateGenerator.createSelfSigned({
          serialNumber: serial(),
          name: `CN=AgentENV egress CA ${label.replace(/[,=+<>#;"\\]/g, "_").slice(0, 40)}, O=AgentENV`,
          notBefore: new Date(now - DAY),
          notAfter: new Date(now + CA_DAYS * DAY),
          keys,
          signingAlgorithm: ALG,
          extensions: [
            new x509.BasicConstraintsExtension(true, 0, true),
            new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
            await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
          ],
        });
        const fd = openSync(keyPath, "w", 0o600);
        try {
          writeSync(fd, pemKey(await webcrypto.subtle.exportKey("pkcs8", keys.privateKey)));
        } finally {
          closeSync(fd);
        }
        writeFileSync(certPath, cert.toString("pem") + "\n", { mode: 0o644 });
      }
    } catch (e) {
      throw fail("cannot create the CA", e);
    }
    let certPem: string, cert: X509.X509Certificate, key: CryptoKey;
    try {
      if (statSync(keyPath).mode & 0o077) throw fail(`${keyPath} may be read by others: chmod 600 it`);
      certPem = readFileSync(certPath, "utf8");
      cert = new x509.X509Certificate(certPem);
      key = await webcrypto.subtle.importKey("pkcs8", new Uint8Array(derOfPemKey(readFileSync(keyPath, "utf8"))), ALG, false, ["sign"]);
    } catch (e) {
      if (e instanceof NetError) throw e;
      throw fail("cannot read the CA", e);
    }
    return new EgressCa(certPem.trim() + "\n", cert, key, maxLeaves);
  }

  /** A leaf certificate for `host` (a DNS name), minted on first use and cached until near its end. */
  leaf(host: string): Promise<LeafCert> {
    const h = host.toLowerCase();
    const have = this.leaves.peek(h);
    if (have) return have.then((l) => (l.notAfter - Date.now() > DAY ? l : this.mint(h)));
    return this.mint(h);
  }

  private mint(host: string): Promise<LeafCert> {
    const p = (async () => {
      this.leafKeys ??= webcrypto.subtle.generateKey(ALG, true, ["sign", "verify"]) as Promise<CryptoKeyPair>;
      const keys = await this.leafKeys;
      const now = Date.now();
      const notAfter = now + LEAF_DAYS * DAY;
      const cert = await x509.X509CertificateGenerator.create({
        serialNumber: serial(),
        subject: `CN=${host}`,
        issuer: this.cert.subject,
        notBefore: new Date(now - DAY),
        notAfter: new Date(notAfter),
        signingKey: this.key,
        publicKey: keys.publicKey,
        signingAlgorithm: ALG,
        extensions: [
          new x509.BasicConstraintsExtension(false, undefined, true),
          new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
          new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
          new x509.SubjectAlternativeNameExtension([{ type: "dns", value: host }]),
          await x509.AuthorityKeyIdentifierExtension.create(this.cert),
        ],
      });
      return { cert: `${cert.toString("pem")}\n${this.certPem}`, key: pemKey(await webcrypto.subtle.exportKey("pkcs8", keys.privateKey)), notAfter };
    })();
    this.leaves.set(host, p);
    p.catch(() => this.leaves.delete(host));
    return p;
  }
}
