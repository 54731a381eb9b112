/**
 * Uploads through envd's `POST /files` are never torn under the file's name (issue 27 item 4):
 * a real envd child is sent an upload over a raw socket that stops halfway and disconnects (what
 * the node's death between the SDK and the sandbox does): while the body streams in and after it
 * was cut, the file reads as it was, and nothing of the cut upload is left beside it; a complete
 * upload replaces it (its mode kept, owned by the user), through a symlink its target; a file
 * with other hard links is written in place (they all see the new content).
 */
import { afterAll, beforeAll, expect, test } from "bun:test";
import { chmodSync, linkSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ensureUserAccount, initEnvd, startEnvdChild, type EnvdChild } from "./harness.ts";
import { waitFor } from "../helpers/wait.ts";

const dir = "/home/user/upload-test";
let envd: EnvdChild;
let uid = 0;

beforeAll(async () => {
  uid = ensureUserAccount().uid;
  envd = await startEnvdChild();
  expect((await initEnvd(envd.url, { defaultUser: "user" })).status).toBe(204);
  mkdirSync(dir, { recursive: true });
  chmodSync(dir, 0o777);
});

afterAll(async () => {
  await envd?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const upload = (path: string, body: string) => fetch(`${envd.url}/files?path=${encodeURIComponent(path)}`, { method: "POST", headers: { "content-type": "application/octet-stream" }, body });

/** Files of `dir` besides the ones named. */
const strays = (...names: string[]) => readdirSync(dir).filter((f) => !names.includes(f));

test("an upload cut halfway leaves the file as it was, with nothing beside it", async () => {
  const file = join(dir, "data.bin");
  writeFileSync(file, "the old content\n");
  const total = 4 << 20;
  const head = `POST /files?path=${encodeURIComponent(file)} HTTP/1.1\r\nHost: envd\r\nContent-Type: application/octet-stream\r\nContent-Length: ${total}\r\n\r\n`;
  let closed!: () => void;
  const gone = new Promise<void>((r) => (closed = r));
  const sock = await Bun.connect({ hostname: "127.0.0.1", port: envd.port, socket: { data() {}, close: () => closed(), error: () => closed() } });
  sock.write(head);
  // half of the body, then the sender dies
  const chunk = new Uint8Array(256 << 10).fill(0x61);
  for (let sent = 0; sent < total / 2; sent += chunk.length) {
    while (sock.write(chunk) === 0) await Bun.sleep(1);
  }
  sock.flush();
  const [tmp] = await waitFor("the upload's bytes arriving beside the file", () => strays("data.bin").length === 1 && statSync(join(dir, strays("data.bin")[0]!)).size > 0 && strays("data.bin"));
  expect(tmp).toMatch(/^\.data\.bin\.upload-/);
  // while it streams in, the file reads as it was
  expect(readFileSync(file, "utf8")).toBe("the old content\n");
  sock.end();
  await gone;
  await waitFor("the cut upload's file removed", () => strays("data.bin").length === 0);
  expect(readFileSync(file, "utf8")).toBe("the old content\n");
  // a new file cut halfway is not there at all
  const fresh = join(dir, "fresh.bin");
  const s2 = await Bun.connect({ hostname: "127.0.0.1", port: envd.port, socket: { data() {} } });
  s2.write(`POST /files?path=${encodeURIComponent(fresh)} HTTP/1.1\r\nHost: envd\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n${"b".repeat(500)}`);
  await waitFor("the fresh upload's bytes arriving", () => strays("data.bin").some((f) => f.startsWith(".fresh.bin.upload-")));
  s2.end();
  await waitFor("the cut fresh upload removed", () => strays("data.bin").length === 0);
  expect(readdirSync(dir)).toEqual(["data.bin"]);
});

test("a complete upload replaces the file: its mode kept, owned by the user; through a symlink, its target; a hard-linked file in place", async () => {
  const file = join(dir, "script.sh");
  writeFileSync(file, "#!/bin/sh\necho old\n");
  chmodSync(file, 0o750);
  const r = await upload(file, "#!/bin/sh\necho new\n");
  expect(r.status).toBe(200);
  expect(readFileSync(file, "utf8")).toBe("#!/bin/sh\necho new\n");
  expect(statSync(file).mode & 0o7777).toBe(0o750);
  expect(statSync(file).uid).toBe(uid);
  // a symlink: its target gets the content, the link stays a link
  const target = join(dir, "real.txt");
  writeFileSync(target, "old");
  symlinkSync(target, join(dir, "link.txt"));
  expect((await upload(join(dir, "link.txt"), "via the link")).status).toBe(200);
  expect(readFileSync(target, "utf8")).toBe("via the link");
  expect(statSync(join(dir, "link.txt")).ino).toBe(statSync(target).ino);
  // hard links: written in place, so every name sees the new content
  const a = join(dir, "a.txt");
  writeFileSync(a, "old");
  linkSync(a, join(dir, "b.txt"));
  expect((await upload(a, "both")).status).toBe(200);
  expect(readFileSync(join(dir, "b.txt"), "utf8")).toBe("both");
  // nothing of the uploads is left beside them
  expect(readdirSync(dir).filter((f) => f.includes(".upload-"))).toEqual([]);
});
