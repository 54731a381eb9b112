/**
 * EntryInfo (filesystem.proto) for a path, from lstat. `mode` holds the permission bits and
 * `permissions` the string E2B's envd prints, i.e. Go's `fs.FileMode.String()` (`-rw-r--r--`,
 * `drwxr-xr-x`, `Lrwxrwxrwx` for a symlink).
 */
import { lstatSync, realpathSync, type Stats } from "node:fs";
import { basename } from "node:path";
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { fromFsError } from "../errors.ts";
import { EntryInfoSchema, FileType, type EntryInfo } from "../gen/filesystem_pb.ts";
import { readMetadata } from "../metadata.ts";
import type { AccountNames } from "../users.ts";

/** Go's FileMode.String() for stats from lstat. */
export function goModeString(st: Stats): string {
  let prefix = "";
  if (st.isDirectory()) prefix += "d";
  if (st.isSymbolicLink()) prefix += "L";
  if (st.isBlockDevice()) prefix += "D";
  if (st.isCharacterDevice()) prefix += "Dc";
  if (st.isFIFO()) prefix += "p";
  if (st.isSocket()) prefix += "S";
  if (st.mode & 0o4000) prefix += "u";
  if (st.mode & 0o2000) prefix += "g";
  if (st.mode & 0o1000) prefix += "t";
  const rwx = "rwxrwxrwx";
  let perm = "";
  for (let i = 0; i < 9; i++) perm += st.mode & (1 << (8 - i)) ? rwx[i] : "-";
  return (prefix || "-") + perm;
}

/** FileType for stats from lstat; sockets, fifos and devices are UNSPECIFIED (SDK drops them). */
export function fileType(st: Stats): FileType {
  if (st.isSymbolicLink()) return FileType.SYMLINK;
  if (st.isDirectory()) return FileType.DIRECTORY;
  if (st.isFile()) return FileType.FILE;
  return FileType.UNSPECIFIED;
}

/** EntryInfo from already-read stats. */
export function entryFromStats(path: string, st: Stats, names: AccountNames): EntryInfo {
  const entry = create(EntryInfoSchema, {
    name: basename(path) || path,
    type: fileType(st),
    path,
    size: BigInt(st.size),
    mode: st.mode & 0o777,
    permissions: goModeString(st),
    owner: names.userName(st.uid),
    group: names.groupName(st.gid),
    modifiedTime: timestampFromMs(Math.floor(st.mtimeMs)),
  });
  if (st.isFile() || st.isDirectory()) entry.metadata = readMetadata(path);
  if (st.isSymbolicLink()) {
    try {
      entry.symlinkTarget = realpathSync(path);
    } catch {
      entry.symlinkTarget = undefined;
    }
  }
  return entry;
}

/**
 * lstat `path` and describe it.
 * @throws EnvdError `not_found` for a missing path, `permission_denied`, ...
 */
export function entryInfo(path: string, names: AccountNames, op = "stat"): EntryInfo {
  let st: Stats;
  try {
    st = lstatSync(path);
  } catch (err) {
    throw fromFsError(err, path, op);
  }
  return entryFromStats(path, st, names);
}
