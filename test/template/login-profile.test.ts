/**
 * trimLoginProfiles (src/template/base.ts): Debian's /etc/profile asks `$(id -u)` and root's
 * ~/.profile runs `mesg n`; after the edit a bash login shell runs neither, dash still asks `id`,
 * and both still pick root's or a user's PATH as before.
 */
import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { trimLoginProfiles } from "../../src/template/index.ts";

// the lines of Debian 12's /etc/profile (base-files 12.4) and /root/.profile that matter here
const PROFILE = `if [ "$(id -u)" -eq 0 ]; then
  PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
else
  PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
fi
export PATH

if [ "\${PS1-}" ]; then
  if [ "\${BASH-}" ] && [ "$BASH" != "/bin/sh" ]; then
    :
  else
    if [ "$(id -u)" -eq 0 ]; then
      PS1='# '
    else
      PS1='$ '
    fi
  fi
fi
`;
const ROOT_PROFILE = `# ~/.profile: executed by Bourne-compatible login shells.

if [ "$BASH" ]; then
  if [ -f ~/.bashrc ]; then
    . ~/.bashrc
  fi
fi

mesg n 2> /dev/null || true
`;

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function tree(): string {
  const t = mkdtempSync(join(tmpdir(), "aenv-profile-"));
  dirs.push(t);
  mkdirSync(join(t, "etc"));
  mkdirSync(join(t, "root"));
  writeFileSync(join(t, "etc/profile"), PROFILE);
  writeFileSync(join(t, "root/.profile"), ROOT_PROFILE);
  Bun.spawnSync(["chmod", "-R", "a+rX", t]); // readable by the unprivileged user below
  return t;
}

/**
 * Source `profile` in a shell with a PATH whose `id` and `mesg` only log their calls; print
 * PATH after it. `uid` runs it as that user (setpriv).
 */
function source(shell: string, profile: string, uid: number): { path: string; calls: string[] } {
  const bin = mkdtempSync(join(tmpdir(), "aenv-profile-bin-"));
  dirs.push(bin);
  const log = join(bin, "calls");
  writeFileSync(log, "");
  Bun.spawnSync(["chmod", "a+rwx", bin, log]);
  for (const [name, body] of [["id", `echo id >> ${log}; /usr/bin/id "$@"`], ["mesg", `echo mesg >> ${log}`]] as const) {
    writeFileSync(join(bin, name), `#!/bin/sh\n${body}\n`, { mode: 0o755 });
  }
  const prefix = uid === 0 ? [] : ["setpriv", `--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", "--"];
  const r = Bun.spawnSync([...prefix, shell, "-c", `. ${profile}; echo "$PATH"`], { env: { PATH: `${bin}:/usr/bin:/bin`, HOME: bin }, stderr: "pipe" });
  if (r.exitCode !== 0 || r.stderr.length) throw new Error(`${shell}: ${r.stderr.toString()}`);
  return { path: r.stdout.toString().trim(), calls: readFileSync(log, "utf8").split("\n").filter(Boolean) };
}

describe("trimLoginProfiles", () => {
  test("edits /etc/profile and root's .profile once; a second run changes nothing", () => {
    const t = tree();
    expect(trimLoginProfiles(t)).toEqual(["etc/profile", "root/.profile"]);
    const p = readFileSync(join(t, "etc/profile"), "utf8");
    expect(p).not.toMatch(/"\$\(id -u\)"/);
    expect(p.split('"${EUID:-$(id -u)}"').length - 1).toBe(2);
    expect(readFileSync(join(t, "root/.profile"), "utf8")).toContain("case $- in *i*) mesg n 2> /dev/null || true ;; esac\n");
    expect(trimLoginProfiles(t)).toEqual([]);
  });

  test("a tree without the files (an image that is not Debian) is left alone", () => {
    const t = mkdtempSync(join(tmpdir(), "aenv-profile-empty-"));
    dirs.push(t);
    expect(trimLoginProfiles(t)).toEqual([]);
  });

  test("bash runs no `id`, dash still does, and the PATH each picks is unchanged (root and a user)", () => {
    const before = tree();
    const after = tree();
    trimLoginProfiles(after);
    const root = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    const user = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games";
    for (const [uid, want] of [[0, root], [65534, user]] as const) {
      const b0 = source("bash", join(before, "etc/profile"), uid);
      const b1 = source("bash", join(after, "etc/profile"), uid);
      expect([b0.path, b1.path]).toEqual([want, want]);
      expect(b0.calls).toEqual(["id"]);
      expect(b1.calls).toEqual([]);
      const d1 = source("dash", join(after, "etc/profile"), uid);
      expect(d1.path).toBe(want);
      expect(d1.calls).toEqual(["id"]);
    }
  });

  test("root's .profile runs `mesg` in an interactive shell only", () => {
    const t = tree();
    trimLoginProfiles(t);
    expect(source("bash", join(t, "root/.profile"), 0).calls).toEqual([]);
    const before = tree();
    expect(source("bash", join(before, "root/.profile"), 0).calls).toEqual(["mesg"]);
  });
});
