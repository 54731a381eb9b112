/**
 * A listening AF_UNIX socket made by src/ffi/unix-listen.ts: a client connects before anyone
 * accepts (the backlog queues it), a child that inherits the descriptor accepts on it, and bad
 * paths fail with the exact errno.
 */
import { afterAll, expect, test } from "bun:test";
import { spawn } from "node:child_process";
import { closeSync, existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SyscallError } from "../../src/ffi/errors.ts";
import { libc } from "../../src/ffi/libc.ts";
import { listenUnix, UNIX_PATH_MAX } from "../../src/ffi/unix-listen.ts";

const dir = mkdtempSync(join(tmpdir(), "unix-listen-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const F_GETFD = 1;
const FD_CLOEXEC = 1;

function connected(path: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    s.once("connect", () => resolve(s));
    s.once("error", reject);
  });
}

test("a client connects before the socket's owner accepts; a child given the descriptor as fd 3 accepts and answers", async () => {
  const path = join(dir, "a.sock");
  writeFileSync(path, "stale"); // a leftover file at the path is replaced
  const fd = listenUnix(path);
  expect(statSync(path).isSocket()).toBe(true);
  expect(libc().fcntl(fd, F_GETFD, 0n) & FD_CLOEXEC).toBe(FD_CLOEXEC);
  // nobody accepts yet: the connection waits in the backlog
  const early = await connected(path);
  const child = spawn("python3", ["-c", "import socket\ns = socket.socket(fileno=3)\nfor _ in range(2):\n    c, _ = s.accept()\n    c.sendall(b'hello\\n')\n    while c.recv(64): pass\n    c.close()\n"], { stdio: ["ignore", "ignore", "inherit", fd] });
  closeSync(fd);
  try {
    // the first line the child sends; then this side ends the connection (the child waits for
    // that, so the connect never races the child's close)
    const read = (s: Socket) =>
      new Promise<string>((resolve, reject) => {
        let text = "";
        s.on("data", (d) => {
          text += d;
          if (text.endsWith("\n")) s.end();
        });
        s.on("error", reject);
        s.on("close", () => resolve(text));
      });
    expect(await read(early)).toBe("hello\n");
    expect(await read(await connected(path))).toBe("hello\n");
    expect(await new Promise((r) => child.once("exit", r))).toBe(0);
  } finally {
    child.kill("SIGKILL");
  }
  // the child was the last holder: the socket no longer listens
  const refused = await connected(path).then(() => "connected", (e: NodeJS.ErrnoException) => e.code);
  expect(refused).toBe("ECONNREFUSED");
});

test("bad paths: too long for sun_path (ENAMETOOLONG, nothing created), a missing directory (bind ENOENT), a NUL byte (EINVAL)", () => {
  const long = join(dir, "x".repeat(UNIX_PATH_MAX));
  expect(() => listenUnix(long)).toThrow(SyscallError);
  expect(() => listenUnix(long)).toThrow(expect.objectContaining({ code: "syscall.failed", call: "unix_listen.path", errno: 36 }));
  expect(existsSync(long)).toBe(false);
  expect(() => listenUnix(join(dir, "no-such-dir", "b.sock"))).toThrow(expect.objectContaining({ code: "syscall.failed", call: "bind", errno: 2 }));
  expect(() => listenUnix(join(dir, "nul\0byte"))).toThrow(expect.objectContaining({ code: "syscall.failed", call: "unix_listen.path", errno: 22 }));
  // exactly UNIX_PATH_MAX bytes fits
  const exact = dir + "/" + "y".repeat(UNIX_PATH_MAX - dir.length - 1);
  expect(Buffer.byteLength(exact)).toBe(UNIX_PATH_MAX);
  closeSync(listenUnix(exact));
  expect(statSync(exact).isSocket()).toBe(true);
});
