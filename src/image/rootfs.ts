/**
 * Confined edits of an unpacked image root: a tree on the host whose content belongs to the
 * guest. Every guest path is resolved as the guest would see it with this tree as `/`: symlinks
 * (absolute or relative) and `..` are followed INSIDE the tree and can never leave it (the
 * semantics of Linux's RESOLVE_IN_ROOT and of filepath-securejoin, which umoci's own unpacking
 * uses); only regular files are read or replaced and only directories created, so an image's
 * links or device nodes (umoci, run as root, makes them) cannot make the node read or write a
 * host file. Resolving component by component with lstat is sound here because nothing else
 * changes the tree while it is edited (a pull's private work directory, no guest running).
 */
import { randomBytes } from "node:crypto";
import { chmodSync, closeSync, fchmodSync, fchownSync, lchownSync, lstatSync, mkdirSync, openSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeSync, type Stats } from "node:fs";
import { dirname, join, relative } from "node:path";
import { ImageError } from "./errors.ts";
import { renameDurable } from "../util/durable.ts";

/** Most symlinks one resolution follows (Linux's MAXSYMLINKS). */
const MAX_LINKS = 40;

/** Owner and permission bits of something created in the tree. */
export interface TreeOwner {
  uid: number;
  gid: number;
  /** Permission bits, e.g. 0o755. */
  mode: number;
}

/** What is at a guest path (the entry itself, not what a final link names). */
export type TreeKind = "file" | "dir" | "link" | "other" | "none";

function lstatOrNull(p: string): Stats | null {
  try {
    return lstatSync(p);
  } catch {
    return null; // ENOENT, or ENOTDIR under a file: nothing there
  }
}

/** An unpacked root filesystem, edited only inside itself. */
export class RootTree {
  /** @param root host directory that is the guest's `/` (ours, never a link). */
  constructor(readonly root: string) {}

  /**
   * Host path of guest path `p` (absolute or relative to `/`): every component but the last is
   * a real directory of the tree or absent; links are followed inside the tree, `..` stops at
   * its top. With `followLast` a final link is followed too.
   * @throws ImageError `image.bad_rootfs` after more than 40 links (a loop).
   */
  resolve(p: string, followLast = true): string {
    const rest = p.split("/").filter((c) => c !== "" && c !== ".");
    const done: string[] = [];
    let links = 0;
    while (rest.length > 0) {
      const c = rest.shift()!;
      if (c === "..") {
        done.pop();
        continue;
      }
      const st = lstatOrNull(join(this.root, ...done, c));
      if (st?.isSymbolicLink() && (rest.length > 0 || followLast)) {
        if (++links > MAX_LINKS) throw new ImageError("image.bad_rootfs", `too many symbolic links resolving ${p} in the image`, { path: p });
        const target = readlinkSync(join(this.root, ...done, c));
        if (target.startsWith("/")) done.length = 0;
        rest.unshift(...target.split("/").filter((x) => x !== "" && x !== "."));
        continue;
      }
      done.push(c);
    }
    return join(this.root, ...done);
  }

  /** What is at `p` (a final link is reported as `link`, not followed). */
  kind(p: string): TreeKind {
    const st = lstatOrNull(this.resolve(p, false));
    if (!st) return "none";
    if (st.isSymbolicLink()) return "link";
    if (st.isFile()) return "file";
    if (st.isDirectory()) return "dir";
    return "other";
  }

  /**
   * Text of the regular file at `p` (links followed inside the tree), or undefined when nothing
   * is there. @throws ImageError `image.bad_rootfs` when it is not a regular file (a device or a
   * FIFO would block or touch the host) or larger than `maxBytes`.
   */
  readText(p: string, maxBytes = 16 * 1048576): string | undefined {
    const host = this.resolve(p);
    const st = lstatOrNull(host);
    if (!st) return undefined;
    if (!st.isFile()) throw this.refuse(p, "is not a regular file");
    if (st.size > maxBytes) throw this.refuse(p, `is larger than ${maxBytes} bytes`);
    return readFileSync(host, "utf8");
  }

  /**
   * Make `p` a regular file holding `text`: written to a new file beside the one the guest would
   * find at `p` (a final link followed inside the tree) and renamed over it, so a hard link is
   * replaced, never written through. An existing file keeps its
   * owner and mode; a new one gets `owner` (default root, 0644). Missing parent directories are
   * made (root, 0755).
   * @throws ImageError `image.bad_rootfs` when `p` is a directory or a special file.
   */
  writeText(p: string, text: string, owner: TreeOwner = { uid: 0, gid: 0, mode: 0o644 }): void {
    this.mkdirs(posixDir(p));
    const host = this.resolve(p);
    const st = lstatOrNull(host);
    if (st && !st.isFile()) throw this.refuse(p, "is not a regular file");
    // a link at p names where the guest finds the file: that directory must exist in the tree
    if (!lstatOrNull(dirname(host))?.isDirectory()) throw this.refuse(p, "is a link into a directory the image lacks");
    const tmp = join(dirname(host), `.aenv-${randomBytes(6).toString("hex")}.tmp`);
    const fd = openSync(tmp, "wx", 0o600); // O_EXCL: never opens an existing entry
    try {
      const buf = Buffer.from(text);
      for (let off = 0; off < buf.length; ) off += writeSync(fd, buf, off);
      fchownSync(fd, st?.uid ?? owner.uid, st?.gid ?? owner.gid);
      fchmodSync(fd, st ? st.mode & 0o7777 : owner.mode);
    } catch (e) {
      closeSync(fd);
      rmSync(tmp, { force: true });
      throw e;
    }
    closeSync(fd);
    try {
      renameDurable(tmp, host);
    } catch (e) {
      rmSync(tmp, { force: true });
      throw e;
    }
  }

  /**
   * Make directory `p` and its missing parents (parents root 0755, `p` itself `owner`); existing
   * directories are left as they are.
   * @throws ImageError `image.bad_rootfs` when a component is a file or a special file.
   */
  mkdirs(p: string, owner: TreeOwner = { uid: 0, gid: 0, mode: 0o755 }): void {
    // the resolved path has no link in it: create its missing components one by one
    const parts = relative(this.root, this.resolve(p)).split("/").filter((c) => c !== "");
    for (let i = 1; i <= parts.length; i++) {
      const host = join(this.root, ...parts.slice(0, i));
      const st = lstatOrNull(host);
      if (st?.isDirectory()) continue;
      if (st) throw this.refuse(p, "is not a directory");
      mkdirSync(host);
      const o = i === parts.length ? owner : { uid: 0, gid: 0, mode: 0o755 };
      lchownSync(host, o.uid, o.gid);
      // mkdir's mode is masked by the umask: set the bits explicitly (the new entry is ours)
      chmodSync(host, o.mode);
    }
  }

  /** Make `p` a symbolic link to `target` (a guest path), its parents made as by `mkdirs`. @throws ImageError `image.bad_rootfs` when something is at `p`. */
  symlink(p: string, target: string): void {
    this.mkdirs(posixDir(p));
    const host = this.resolve(p, false);
    if (lstatOrNull(host)) throw this.refuse(p, "already exists");
    symlinkSync(target, host);
  }

  private refuse(p: string, why: string): ImageError {
    return new ImageError("image.bad_rootfs", `the image's ${p} ${why}`, { path: p });
  }
}

const posixDir = (p: string) => dirname(`/${p}`);
