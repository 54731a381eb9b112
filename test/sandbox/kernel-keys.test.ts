// Guest kernel keys (src/sandbox/capture.ts): the sha256 prefix snapshots record, cached per
// owner (a VmRuntime holds one KernelKeys) and hashed again when the file changes.
import { expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { kernelKey, KernelKeys } from "../../src/sandbox/capture.ts";

test("a kernel's key is the sha256 prefix of the file; each owner's cache follows the file's changes", () => {
  const dir = mkdtempSync(join(tmpdir(), "aenv-kkey-"));
  try {
    const p = join(dir, "vmlinux");
    const sha16 = (s: string) => createHash("sha256").update(s).digest("hex").slice(0, 16);
    writeFileSync(p, "kernel one");
    expect(kernelKey(p)).toBe(sha16("kernel one"));
    const a = new KernelKeys();
    expect(a.of(p)).toBe(sha16("kernel one"));
    // rewritten with other bytes (another size and mtime): hashed again
    const mtime = new Date(Math.floor(Date.now() / 1000) * 1000 + 5000);
    writeFileSync(p, "kernel number two");
    utimesSync(p, mtime, mtime);
    expect(a.of(p)).toBe(sha16("kernel number two"));
    // the cache is keyed by inode, size and mtime: same-size bytes with the mtime put back are
    // not read again (what a cache hit looks like), while a fresh hash sees them
    writeFileSync(p, "kernel number TWO");
    utimesSync(p, mtime, mtime);
    expect(a.of(p)).toBe(sha16("kernel number two"));
    expect(kernelKey(p)).toBe(sha16("kernel number TWO"));
    // a second owner has its own cache, filled from the file as it is
    expect(new KernelKeys().of(p)).toBe(sha16("kernel number TWO"));
    expect(() => a.of(join(dir, "absent"))).toThrow(expect.objectContaining({ code: "ENOENT" }));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
