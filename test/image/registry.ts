/**
 * Test fixtures for image pulls: Debian's `docker-registry` on 127.0.0.1 (optionally behind
 * htpasswd basic auth), and images the test makes itself: layers written as tar files (gzip or
 * zstd, whiteouts and opaque-directory markers included as given), assembled as skopeo's `dir:`
 * layout and pushed with `skopeo copy`; an image index (manifest list) pushed from an OCI layout.
 */
import { createHash, createPrivateKey, randomUUID, sign } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { waitFor } from "../helpers/wait.ts";

/** A running registry. */
export interface TestRegistry {
  /** `127.0.0.1:<port>` */
  host: string;
  root: string;
  proc: Subprocess;
  /** Token requests served (token auth only). */
  tokenRequests: number;
  stop(): Promise<void>;
}

/**
 * A token server for the registry's token auth (distribution's `auth: token`): RS256 JWTs signed
 * by a throw-away openssl certificate, granting the scopes asked for when Basic credentials match.
 */
function tokenServer(root: string, creds: { username: string; password: string }, counter: { n: number }, identityToken?: string) {
  const key = join(root, "token-key.pem");
  const cert = join(root, "token-cert.pem");
  run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=agentenv-test-token"]);
  const pk = createPrivateKey(readFileSync(key));
  const der = readFileSync(cert, "utf8").replace(/-----[^-]+-----|\s/g, "");
  const b64url = (b: Buffer | string) => Buffer.from(b).toString("base64url");
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    async fetch(req) {
      counter.n++;
      const u = new URL(req.url);
      // GET with Basic credentials (docker's token flow), or POST grant_type=refresh_token with an
      // identity token (the OAuth2 flow Docker's identitytoken uses)
      let params = u.searchParams;
      let sub = creds.username;
      if (req.method === "POST") {
        params = new URLSearchParams(await req.text());
        if (!identityToken || params.get("grant_type") !== "refresh_token" || params.get("refresh_token") !== identityToken) return new Response("denied", { status: 401 });
        sub = "identity-token-user";
      } else if (req.headers.get("authorization") !== "Basic " + Buffer.from(`${creds.username}:${creds.password}`).toString("base64")) return new Response("denied", { status: 401 });
      const access = params.getAll("scope").flatMap((x) => x.split(" ")).filter(Boolean).map((x) => {
        const [type, name, actions] = x.split(":");
        return { type, name, actions: actions!.split(",") };
      });
      const now = Math.floor(Date.now() / 1000);
      const header = b64url(JSON.stringify({ alg: "RS256", typ: "JWT", x5c: [der] }));
      const claims = b64url(JSON.stringify({ iss: "agentenv-test", sub, aud: "agentenv-registry", exp: now + 300, nbf: now - 10, iat: now, jti: randomUUID(), access }));
      const sig = b64url(sign("sha256", Buffer.from(`${header}.${claims}`), pk));
      const token = `${header}.${claims}.${sig}`;
      return Response.json(req.method === "POST" ? { access_token: token, expires_in: 300 } : { token, expires_in: 300 });
    },
  });
  return { server, cert };
}

/** Run a command to its end without blocking the event loop (the token server lives in this process). */
async function runAsync(cmd: string[]): Promise<void> {
  const p = Bun.spawn(cmd, { stdout: "ignore", stderr: "pipe" });
  const [err, code] = await Promise.all([new Response(p.stderr).text(), p.exited]);
  if (code !== 0) throw new Error(`${cmd.join(" ")} failed (${code}): ${err}`);
}

function run(cmd: string[], opts: { cwd?: string; stdin?: Uint8Array } = {}): string {
  const r = Bun.spawnSync(cmd, { cwd: opts.cwd, stdout: "pipe", stderr: "pipe", ...(opts.stdin ? { stdin: opts.stdin } : {}) });
  if (r.exitCode !== 0) throw new Error(`${cmd.join(" ")} failed (${r.exitCode}): ${r.stderr.toString()}`);
  return r.stdout.toString();
}

async function freePort(): Promise<number> {
  const s = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("") });
  const p = s.port!;
  s.stop(true);
  return p;
}

/**
 * Start `docker-registry serve` on 127.0.0.1 with storage in a temp dir. `auth` puts it behind
 * htpasswd (bcrypt) basic auth, or with `token` behind token auth served by this process (not
 * with `netns`). `netns` runs it inside that network namespace (the node's).
 */
export async function startRegistry(
  opts: {
    auth?: { username: string; password: string };
    token?: boolean;
    /** With `token`: the identity token the token server also accepts (OAuth2 refresh_token grant). */
    identityToken?: string;
    netns?: string;
    port?: number;
    /** Address to listen on (default 127.0.0.1). */
    addr?: string;
    /** Serve TLS with this certificate and key (PEM files; `makeTestCa`). */
    tls?: { cert: string; key: string };
  } = {},
): Promise<TestRegistry> {
  const root = mkdtempSync(join(tmpdir(), "aenv-registry-"));
  const port = opts.port ?? (await freePort());
  const addr = opts.addr ?? "127.0.0.1";
  let auth = "";
  const counter = { n: 0 };
  let tokens: ReturnType<typeof tokenServer> | null = null;
  if (opts.auth && opts.token) {
    tokens = tokenServer(root, opts.auth, counter, opts.identityToken);
    auth = `auth:\n  token:\n    realm: http://127.0.0.1:${tokens.server.port}/token\n    service: agentenv-registry\n    issuer: agentenv-test\n    rootcertbundle: ${tokens.cert}\n`;
  } else if (opts.auth) {
    const hash = await Bun.password.hash(opts.auth.password, { algorithm: "bcrypt", cost: 4 });
    writeFileSync(join(root, "htpasswd"), `${opts.auth.username}:${hash}\n`);
    auth = `auth:\n  htpasswd:\n    realm: test\n    path: ${join(root, "htpasswd")}\n`;
  }
  writeFileSync(
    join(root, "config.yml"),
    `version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: ${join(root, "data")}\n  delete:\n    enabled: true\nhttp:\n  addr: ${addr}:${port}\n${opts.tls ? `  tls:\n    certificate: ${opts.tls.cert}\n    key: ${opts.tls.key}\n` : ""}${auth}`,
  );
  const cmd = ["docker-registry", "serve", join(root, "config.yml")];
  const proc = Bun.spawn(opts.netns ? ["ip", "netns", "exec", opts.netns, ...cmd] : cmd, { stdout: "ignore", stderr: "pipe" });
  const host = `${addr}:${port}`;
  const scheme = opts.tls ? "https" : "http";
  const probe = opts.netns ? ["ip", "netns", "exec", opts.netns, "curl", "-k", "-s", "-o", "/dev/null", "-w", "%{http_code}", `${scheme}://${host}/v2/`] : null;
  await waitFor("docker-registry to answer", async () => {
    if (proc.exitCode !== null) throw new Error(`docker-registry exited: ${await new Response(proc.stderr).text()}`);
    if (probe) return Bun.spawnSync(probe, { stdout: "pipe" }).stdout.toString() !== "000";
    return fetch(`${scheme}://${host}/v2/`, { tls: { rejectUnauthorized: false } } as RequestInit).then(() => true, () => false);
  });
  return {
    host,
    root,
    proc,
    get tokenRequests() {
      return counter.n;
    },
    async stop() {
      proc.kill("SIGKILL");
      await proc.exited;
      tokens?.server.stop(true);
      rmSync(root, { recursive: true, force: true });
    },
  };
}

/** One image layer: a tar of `dir` (paths relative to it), compressed. */
export interface LayerSpec {
  dir: string;
  paths?: string[];
  compression: "gzip" | "zstd" | "none";
}

const sha = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");
const MEDIA = { gzip: "application/vnd.oci.image.layer.v1.tar+gzip", zstd: "application/vnd.oci.image.layer.v1.tar+zstd", none: "application/vnd.oci.image.layer.v1.tar" };

/**
 * Build an image as skopeo's `dir:` layout from `layers` (bottom first) and push it to
 * `docker://host/ref` (plain HTTP; from inside `netns` when given). `config` sets Env/WorkingDir/Cmd
 * and the config's architecture (default amd64).
 * @returns the pushed manifest's digest and the compressed size of its layers.
 */
export async function pushImage(
  host: string,
  ref: string,
  layers: LayerSpec[],
  config: { Env?: string[]; WorkingDir?: string; Cmd?: string[]; architecture?: string } = {},
  creds?: { username: string; password: string },
  netns?: string,
): Promise<{ digest: string; compressedBytes: number; dir: string }> {
  const dir = mkdtempSync(join(tmpdir(), "aenv-image-"));
  const descs = layers.map((l, i) => {
    const tarPath = join(dir, `layer${i}.tar`);
    run(["tar", "--numeric-owner", "--xattrs", "-cf", tarPath, "-C", l.dir, ...(l.paths ?? ["."])]);
    const diffId = sha(readFileSync(tarPath));
    let blobPath = tarPath;
    if (l.compression === "gzip") run(["gzip", "-1", "-n", tarPath]), (blobPath = `${tarPath}.gz`);
    if (l.compression === "zstd") run(["zstd", "-q", "-T0", "-3", "--rm", tarPath]), (blobPath = `${tarPath}.zst`);
    const blob = readFileSync(blobPath);
    const digest = sha(blob);
    writeFileSync(join(dir, digest), blob);
    rmSync(blobPath);
    return { mediaType: MEDIA[l.compression], digest: `sha256:${digest}`, size: blob.length, diffId: `sha256:${diffId}` };
  });
  const cfg = JSON.stringify({
    architecture: config.architecture ?? "amd64",
    os: "linux",
    config: { Env: config.Env ?? ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], WorkingDir: config.WorkingDir ?? "", Cmd: config.Cmd ?? ["/bin/sh"] },
    rootfs: { type: "layers", diff_ids: descs.map((d) => d.diffId) },
  });
  writeFileSync(join(dir, sha(cfg)), cfg);
  const manifest = JSON.stringify({
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: { mediaType: "application/vnd.oci.image.config.v1+json", digest: `sha256:${sha(cfg)}`, size: Buffer.byteLength(cfg) },
    layers: descs.map(({ mediaType, digest, size }) => ({ mediaType, digest, size })),
  });
  writeFileSync(join(dir, "manifest.json"), manifest);
  writeFileSync(join(dir, "version"), "Directory Transport Version: 1.1\n");
  const push = ["skopeo", "copy", "--dest-tls-verify=false", ...(creds ? ["--dest-creds", `${creds.username}:${creds.password}`] : []), `dir:${dir}`, `docker://${host}/${ref}`];
  await runAsync(netns ? ["ip", "netns", "exec", netns, ...push] : push);
  return { digest: `sha256:${sha(manifest)}`, compressedBytes: descs.reduce((a, d) => a + d.size, 0), dir };
}

/**
 * Push an image index (manifest list) whose linux/arm64 entry comes first and names `arm64Dir`'s
 * image (default: the amd64 one's manifest again), then a linux/amd64 entry naming `amd64Dir`'s
 * image (both `pushImage` layouts), via an OCI layout and `skopeo copy --all`.
 */
export async function pushIndex(host: string, ref: string, amd64Dir: string, arm64Dir = amd64Dir): Promise<void> {
  const layout = mkdtempSync(join(tmpdir(), "aenv-index-"));
  try {
    mkdirSync(join(layout, "blobs", "sha256"), { recursive: true });
    const add = (dir: string) => {
      const manifest = readFileSync(join(dir, "manifest.json"));
      const m = JSON.parse(manifest.toString()) as { config: { digest: string }; layers: { digest: string }[] };
      for (const d of [m.config.digest, ...m.layers.map((l) => l.digest)]) {
        const hex = d.slice(7);
        writeFileSync(join(layout, "blobs", "sha256", hex), readFileSync(join(dir, hex)));
      }
      const mhex = sha(manifest);
      writeFileSync(join(layout, "blobs", "sha256", mhex), manifest);
      return { digest: `sha256:${mhex}`, size: manifest.length };
    };
    const entry = (arch: string, dir: string) => ({ mediaType: "application/vnd.oci.image.manifest.v1+json", ...add(dir), platform: { os: "linux", architecture: arch } });
    const index = JSON.stringify({ schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: [entry("arm64", arm64Dir), entry("amd64", amd64Dir)] });
    const ihex = sha(index);
    writeFileSync(join(layout, "blobs", "sha256", ihex), index);
    writeFileSync(join(layout, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
    writeFileSync(join(layout, "index.json"), JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: "application/vnd.oci.image.index.v1+json", digest: `sha256:${ihex}`, size: index.length, annotations: { "org.opencontainers.image.ref.name": "idx" } }] }));
    await runAsync(["skopeo", "copy", "--all", "--dest-tls-verify=false", `oci:${layout}:idx`, `docker://${host}/${ref}`]);
  } finally {
    rmSync(layout, { recursive: true, force: true });
  }
}

/** Path of a blob's data file in the registry's filesystem storage. */
export function registryBlobPath(reg: TestRegistry, digest: string): string {
  const hex = digest.replace(/^sha256:/, "");
  return join(reg.root, "data", "docker", "registry", "v2", "blobs", "sha256", hex.slice(0, 2), hex, "data");
}

/**
 * The Debian tree `template build-base` cached in the test home (python3, coreutils, bash): a
 * real distribution rootfs for images, without docs, man pages and locales.
 * @throws Error when the base template was never built there.
 */
export function debianTree(testHome: string): { dir: string; paths: string[] } {
  const cache = join(testHome, "templates", ".cache");
  const tree = require("node:fs").readdirSync(cache).find((d: string) => d.startsWith("debian-") && require("node:fs").existsSync(join(cache, d, ".complete")));
  if (!tree) throw new Error(`no Debian tree in ${cache}: run 'agentenv template build-base' with AENV_HOME_PATH=${testHome}`);
  const dir = join(cache, tree);
  const skip = new Set(["usr", ".complete", "proc", "sys", "dev"]);
  const paths = (require("node:fs").readdirSync(dir) as string[]).filter((p) => !skip.has(p)).map((p) => `./${p}`);
  const usrSkip = new Set(["share"]);
  for (const p of require("node:fs").readdirSync(join(dir, "usr")) as string[]) if (!usrSkip.has(p)) paths.push(`./usr/${p}`);
  for (const p of require("node:fs").readdirSync(join(dir, "usr/share")) as string[]) if (!["doc", "man", "locale", "info", "i18n"].includes(p)) paths.push(`./usr/share/${p}`);
  return { dir, paths };
}

/**
 * A throw-away CA (openssl) and a server certificate it signs for `ips` (IP subject alternative
 * names), in `dir`: ca.pem, server.pem, server-key.pem.
 */
export function makeTestCa(dir: string, ips: string[]): { ca: string; cert: string; key: string } {
  const ca = join(dir, "ca.pem");
  const caKey = join(dir, "ca-key.pem");
  const cert = join(dir, "server.pem");
  const key = join(dir, "server-key.pem");
  const csr = join(dir, "server.csr");
  const ext = join(dir, "san.ext");
  run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", caKey, "-out", ca, "-days", "1", "-subj", "/CN=agentenv test registry CA"]);
  run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", `/CN=${ips[0]}`]);
  writeFileSync(ext, `subjectAltName=${ips.map((i) => `IP:${i}`).join(",")}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n`);
  run(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", caKey, "-CAcreateserial", "-out", cert, "-days", "1", "-extfile", ext]);
  return { ca, cert, key };
}
