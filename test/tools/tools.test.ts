/**
 * The tools drive (src/tools): ELF interpreter rewriting and boot arguments (no VM); the drive the
 * test home's `template build-base` made (read back with debugfs); and real QEMU microvm/TCG VMs
 * booted through it from root filesystems that hold no glibc: one with nothing but a static
 * busybox and two account lines, one with nothing at all. Both reach envd, which runs commands,
 * moves files and finds the drive's ss and curl on PATH.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.ts";
import { compileEnv, jscEnvLines, keptBootArgs, probeCommand, readInterpreter, resolveTools, setInterpreter, toolsBoot, toolsInitScript, TOOLS_INTERPRETER, type ToolsImage } from "../../src/tools/index.ts";
import { resolveKernelPath, type QemuVm } from "../../src/vmm/index.ts";
import { ENVD_PORT, runInGuest, waitEnvd } from "../vmm/qemu/envd-client.ts";
import { TEST_HOME, TestNet, testConfig, testDriver } from "../vmm/qemu/helpers.ts";

let work: string;
let tools: ToolsImage;

function sh(cmd: string[]): string {
  const r = Bun.spawnSync(cmd, { stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`${cmd.join(" ")}: ${r.stderr.toString()}`);
  return r.stdout.toString();
}

beforeAll(() => {
  work = mkdtempSync(join(tmpdir(), "aenv-tools-"));
  tools = resolveTools(TEST_HOME);
});

afterAll(() => {
  rmSync(work, { recursive: true, force: true });
});

describe("interpreter rewrite and boot arguments", () => {
  test("PT_INTERP is rewritten in place; too long, non-ELF and static files are refused", () => {
    const bin = join(work, "true");
    copyFileSync("/usr/bin/true", bin);
    expect(readInterpreter(bin)).toBe("/lib64/ld-linux-x86-64.so.2");
    const size = Bun.file(bin).size;
    setInterpreter(bin, TOOLS_INTERPRETER);
    expect(readInterpreter(bin)).toBe("/.aenv/lib/ld.so");
    expect(Bun.file(bin).size).toBe(size);
    // readelf agrees, so the kernel will too
    expect(sh(["readelf", "-l", bin])).toContain("[Requesting program interpreter: /.aenv/lib/ld.so]");
    expect(() => setInterpreter(bin, `/${"x".repeat(40)}`)).toThrow(expect.objectContaining({ code: "tools.bad_elf" }));
    expect(readInterpreter(bin)).toBe("/.aenv/lib/ld.so");
    writeFileSync(join(work, "text"), "#!/bin/sh\necho not elf\n".repeat(10));
    expect(() => readInterpreter(join(work, "text"))).toThrow(expect.objectContaining({ code: "tools.bad_elf" }));
    expect(() => readInterpreter("/bin/busybox")).toThrow(expect.objectContaining({ code: "tools.bad_elf" })); // static: no PT_INTERP
  });

  test("the tools drive is the kernel's read-only root; a template's own root and init are dropped", () => {
    const b = toolsBoot("/t/tools.ext4", "/s/root.img", "root=/dev/vda rw rootfstype=ext4 init=/sbin/aenv-init quiet x=1");
    expect(b.drives).toEqual([
      { id: "tools", path: "/t/tools.ext4", readOnly: true, isRoot: true },
      { id: "root", path: "/s/root.img", readOnly: false, isRoot: false },
    ]);
    expect(b.bootArgs).toBe("root=/dev/vda ro rootfstype=ext4 init=/init aenv.root=/dev/vdb aenv.rootfstype=ext4 quiet x=1");
    expect(toolsBoot("/t", "/s", "", { rootReadOnly: true }).drives[1]!.readOnly).toBe(true);
    // what is left of a template's arguments (a cold boot with any left does not use a boot snapshot)
    expect(keptBootArgs("root=/dev/vda rw rootfstype=ext4 init=/sbin/aenv-init quiet x=1")).toEqual(["quiet", "x=1"]);
    expect(keptBootArgs("  root=/dev/sda ro init=/sbin/init  ")).toEqual([]);
    expect(keptBootArgs("")).toEqual([]);
  });
});

test("probeCommand: the drive's shell, the drive's programs first on PATH, the script unchanged after them", () => {
  const p = probeCommand("echo \"$PATH\"; echo 'a b'");
  expect(p.cmd).toBe("/.aenv/bin/sh");
  expect(p.args[0]).toBe("-c");
  // the same text under the host's shell: the PATH given is kept after the drive's
  const run = (env: Record<string, string>) => Bun.spawnSync(["/bin/sh", ...p.args], { env }).stdout.toString();
  expect(run({ PATH: "/usr/bin:/bin" })).toBe("/.aenv/bin:/usr/bin:/bin\na b\n");
});

describe("the drive's agentenv build", () => {
  test("bun build inlines NODE_ENV: the compile runs without the caller's, so a drive built under bun test does not behave as in tests", () => {
    expect(process.env.NODE_ENV).toBe("test"); // bun test sets it, as scripts/test.sh does for the drive it builds
    const env = compileEnv();
    expect(env.NODE_ENV).toBeUndefined();
    expect(env.PATH).toBe(process.env.PATH!);
    expect(compileEnv({ NODE_ENV: "production", HOME: "/h", X: undefined })).toEqual({ HOME: "/h" });
    const src = join(work, "node-env.ts");
    writeFileSync(src, "console.log(String(process.env.NODE_ENV));\n");
    const printed = (buildEnv: Record<string, string | undefined>, out: string): string => {
      const b = Bun.spawnSync([process.execPath, "build", "--compile", src, "--outfile", join(work, out)], { env: buildEnv, stdout: "pipe", stderr: "pipe" });
      expect(b.exitCode).toBe(0);
      return sh([join(work, out)]).trim();
    };
    expect(printed(process.env, "inherited")).toBe("test"); // what the drive used to carry
    expect(printed(env, "clean")).toBe("development"); // what `bun run build` gives
  }, 60_000);
});

describe("[envd] jsc_options and runtime_env", () => {
  test("become BUN_JSC_<name>=<value> lines, then the runtime's NAME=VALUE lines; anything but such words is refused by the config", () => {
    expect(jscEnvLines("useBaselineJIT=0 thresholdForJITSoon=100")).toBe("BUN_JSC_useBaselineJIT=0\nBUN_JSC_thresholdForJITSoon=100\n");
    expect(jscEnvLines("")).toBe("");
    expect(jscEnvLines("useBaselineJIT=0", "MIMALLOC_PURGE_DELAY=0 BUN_GC_TIMER_INTERVAL=30000")).toBe("BUN_JSC_useBaselineJIT=0\nMIMALLOC_PURGE_DELAY=0\nBUN_GC_TIMER_INTERVAL=30000\n");
    expect(jscEnvLines("", "A=1")).toBe("A=1\n");
    expect(loadConfig({ env: { AENV__envd__runtime_env: "" } }).envd.runtime_env).toBe("");
    for (const bad of ["A=1;reboot", "A=$(id)", "A", "lower=1", " A=1", "A=1  B=2", "LD_PRELOAD=/x.so"]) {
      expect(() => loadConfig({ env: { AENV__envd__runtime_env: bad } })).toThrow(expect.objectContaining({ code: "config.bad_value" }));
    }
    expect(loadConfig({ env: { AENV__envd__jsc_options: "" } }).envd.jsc_options).toBe("");
    for (const bad of ["useJIT=0;reboot", "a=$(id)", "useJIT", " useJIT=0", "a=1  b=2", "a=1\nb=2"]) {
      expect(() => loadConfig({ env: { AENV__envd__jsc_options: bad } })).toThrow(expect.objectContaining({ code: "config.bad_value" }));
    }
  });
});

describe("the test home's tools drive", () => {
  test("holds the init, busybox, envd on the drive's loader, ss and curl with their libraries", () => {
    const cat = (p: string) => sh(["debugfs", "-R", `cat ${p}`, tools.path]);
    expect(cat("/init")).toBe(toolsInitScript());
    // the node's [envd] settings, which the guest's envd reads instead of a config file
    expect(JSON.parse(cat("/etc/envd.json"))).toEqual(testConfig().envd);
    // and its [envd] jsc_options as the variables Bun reads them from (the default turns the baseline
    // JIT off), then runtime_env (no mimalloc scavenger thread, Bun's heap timer every 30 s)
    expect(testConfig().envd.jsc_options).toBe("useBaselineJIT=0");
    expect(cat("/etc/envd.env")).toBe("BUN_JSC_useBaselineJIT=0\nMIMALLOC_PURGE_DELAY=0\nBUN_GC_TIMER_INTERVAL=30000\n");
    const envd = join(work, "agentenv");
    sh(["debugfs", "-R", `dump /bin/agentenv ${envd}`, tools.path]);
    expect(readInterpreter(envd)).toBe("/.aenv/lib/ld.so");
    expect(sh(["debugfs", "-R", "stat /lib/ld.so", tools.path])).toContain('Fast link dest: "ld-linux-x86-64.so.2"');
    // /.aenv names the drive's own root before a root filesystem is mounted (boot snapshots), and
    // /root is the home envd gives root's commands then
    expect(sh(["debugfs", "-R", "stat /.aenv", tools.path])).toContain('Fast link dest: "."');
    expect(sh(["debugfs", "-R", "stat /root", tools.path])).toContain("Type: directory");
    for (const b of ["blockdev", "pivot_root"]) expect(sh(["debugfs", "-R", "ls /bin", tools.path]).split(/\s+/)).toContain(b);
    const lib = sh(["debugfs", "-R", "ls /lib", tools.path]);
    for (const l of ["libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libcurl.so.4", "libmnl.so.0"]) expect(lib).toContain(l);
    const bin = sh(["debugfs", "-R", "ls /bin", tools.path]);
    for (const b of ["busybox", "sh", "mount", "pivot_root", "agentenv", "ss", "curl"]) expect(bin.split(/\s+/)).toContain(b);
    const curl = join(work, "curl");
    sh(["debugfs", "-R", `dump /bin/curl ${curl}`, tools.path]);
    expect(readInterpreter(curl)).toBe("/.aenv/lib/ld.so");
    expect(sh(["readelf", "-d", curl])).toContain("Library rpath: [/.aenv/lib]");
    // never written: no journal, mounted read-only by the guest
    expect(sh(["dumpe2fs", "-h", tools.path])).not.toContain("has_journal");
  });
});

/** An ext4 image of `tree` (empty directory: an empty filesystem). */
function ext4Of(tree: string, out: string): string {
  sh(["truncate", "-s", "64M", out]);
  sh(["mkfs.ext4", "-q", "-F", "-E", "root_owner=0:0", "-d", tree, out]);
  return out;
}

describe("VMs whose root filesystem has no glibc", () => {
  const drv = testDriver();
  const cleanups: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const c of cleanups.reverse()) await c();
    drv.dispose();
  });

  async function boot(name: string, rootDisk: string): Promise<{ vm: QemuVm; base: string }> {
    const net = new TestNet();
    cleanups.push(() => net.destroy());
    const b = toolsBoot(tools.path, rootDisk);
    const vm = await drv.driver.boot({
      id: `tl${process.pid}${name}`,
      workDir: join(work, name),
      kernelPath: resolveKernelPath(testConfig()),
      bootArgs: b.bootArgs,
      vcpus: 1,
      memoryMiB: 256,
      drives: b.drives,
      net: net.spec,
    });
    cleanups.push(() => vm.stop());
    const base = net.url(ENVD_PORT);
    try {
      await waitEnvd(base, 90_000);
    } catch (e) {
      throw new Error(`${(e as Error).message}\nconsole:\n${vm.consoleTail(3000)}`);
    }
    return { vm, base };
  }

  // no access token: runInGuest names the user with Basic auth, as the SDK does without one
  const init = (base: string, defaultUser: string) => fetch(`${base}/init`, { method: "POST", body: JSON.stringify({ defaultUser, timestamp: new Date().toISOString() }) });

  test("busybox-only root: envd runs commands as root and user, moves files; ss and curl come from the drive", async () => {
    const tree = join(work, "bb-tree");
    for (const d of ["bin", "etc", "home/user"]) mkdirSync(join(tree, d), { recursive: true });
    copyFileSync("/bin/busybox", join(tree, "bin/busybox"));
    for (const a of ["sh", "ls", "id", "cat", "test", "readlink", "grep", "mount"]) symlinkSync("busybox", join(tree, "bin", a));
    writeFileSync(join(tree, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n");
    writeFileSync(join(tree, "etc/group"), "root:x:0:\nuser:x:1000:\n");
    const disk = ext4Of(tree, join(work, "bb.ext4"));
    for (const f of ["uid", "gid"]) sh(["debugfs", "-w", "-R", `set_inode_field /home/user ${f} 1000`, disk]);
    const { base } = await boot("bb", disk);
    expect((await init(base, "user")).status).toBe(204);

    const run = (script: string, user = "root") => runInGuest(base, script, user);
    expect(await run("test -e /lib/x86_64-linux-gnu/libc.so.6 || test -e /lib64/ld-linux-x86-64.so.2 || echo no-glibc")).toEqual({ stdout: "no-glibc\n", stderr: "", exitCode: 0 });
    // envd is the drive's binary with the drive's settings; the drive is mounted read-only at /.aenv
    const envd = "/proc/$(cut -d' ' -f4 /proc/$$/stat)";
    expect((await run(`readlink ${envd}/exe; tr '\\0' ' ' < ${envd}/cmdline; echo; grep ' /.aenv ' /proc/mounts | cut -d' ' -f4 | cut -d, -f1`)).stdout).toBe(
      "/.aenv/bin/agentenv\n/.aenv/bin/agentenv envd --settings /.aenv/etc/envd.json \nro\n",
    );
    // envd started with the drive's JavaScriptCore options and runtime environment; the commands
    // it runs do not inherit them; its runtime has no mimalloc scavenger thread
    expect((await run(`tr '\\0' '\\n' < ${envd}/environ | grep -E '^(BUN_JSC_|MIMALLOC_|BUN_GC_)'`)).stdout).toBe("BUN_JSC_useBaselineJIT=0\nMIMALLOC_PURGE_DELAY=0\nBUN_GC_TIMER_INTERVAL=30000\n");
    expect(await run("env | grep -E '^(BUN_JSC_|MIMALLOC_|BUN_GC_)'; echo rc=$?")).toEqual({ stdout: "rc=1\n", stderr: "", exitCode: 0 });
    expect((await run(`cat ${envd}/task/*/comm | grep -c mi-scavenger`)).stdout).toBe("0\n");
    expect(await run("id -un; id -u; echo $HOME", "user")).toEqual({ stdout: "user\n1000\n/home/user\n", stderr: "", exitCode: 0 });
    // the drive's programs are at the end of PATH: busybox has no ss and no curl
    const ss = await run("ss -Htln | grep -c ':49983 '");
    expect(ss).toEqual({ stdout: "1\n", stderr: "", exitCode: 0 });
    const curl = await run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:49983/health");
    expect(curl).toEqual({ stdout: "204", stderr: "", exitCode: 0 });
    expect((await run("echo $PATH")).stdout).toBe("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/.aenv/bin\n");
    // files in and out through envd, owned by the acting user
    const body = new Uint8Array(300_000).map((_, i) => (i * 31) & 0xff);
    const up = await fetch(`${base}/files?path=/home/user/blob.bin&username=user`, { method: "POST", headers: { "content-type": "application/octet-stream" }, body });
    expect(up.status).toBe(200);
    const down = await fetch(`${base}/files?path=/home/user/blob.bin&username=user`);
    expect(new Uint8Array(await down.arrayBuffer())).toEqual(body);
    expect((await run("ls -n /home/user/blob.bin | cut -c1-40 | tr -s ' ' | cut -d' ' -f3,4")).stdout).toBe("1000 1000\n");
    // the image itself gained only the mount points the init made
    expect((await run("ls -A /")).stdout).toBe(".aenv\nbin\ndev\netc\nhome\nlost+found\nproc\nroot\nrun\nsys\ntmp\n");
  }, 180_000);

  test("empty root: envd still answers and runs the drive's shell as root; a ready probe's shell and programs come from the drive", async () => {
    const tree = join(work, "empty-tree");
    mkdirSync(tree);
    const { base } = await boot("empty", ext4Of(tree, join(work, "empty.ext4")));
    expect((await init(base, "root")).status).toBe(204);
    const r = await fetch(`${base}/process.Process/Start`, {
      method: "POST",
      headers: { "content-type": "application/connect+json" },
      body: (() => {
        // the root has no shell and no programs: what runs is the probe's (src/tools probeCommand)
        const j = Buffer.from(JSON.stringify({ process: probeCommand("ls -A /; id -u; echo $HOME; echo $PATH; ss -Htln | grep -c ':49983 '"), stdin: false }));
        const f = Buffer.alloc(5 + j.length);
        f.writeUInt32BE(j.length, 1);
        j.copy(f, 5);
        return f;
      })(),
    });
    const text = Buffer.from(await r.arrayBuffer());
    let out = "";
    let end: unknown;
    for (let off = 0; off + 5 <= text.length; ) {
      const len = text.readUInt32BE(off + 1);
      const msg = JSON.parse(text.subarray(off + 5, off + 5 + len).toString());
      if (text[off] === 0 && msg.event.data) out += Buffer.from(msg.event.data.stdout, "base64").toString();
      if (text[off] === 0 && msg.event.end) end = msg.event.end;
      off += 5 + len;
    }
    expect(end).toEqual({ exited: true, status: "exit status 0" });
    expect(out).toBe(".aenv\ndev\netc\nlost+found\nproc\nroot\nrun\nsys\ntmp\n0\n/root\n/.aenv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/.aenv/bin\n1\n");
  }, 180_000);
});

describe("the init's mount-root (a VM restored from a boot snapshot)", () => {
  /** Run the drive's init as `busybox sh init <args>` on the host (not PID 1). */
  const init = (...args: string[]) => {
    const script = join(work, "init.sh");
    writeFileSync(script, toolsInitScript());
    const r = Bun.spawnSync(["busybox", "sh", script, ...args], { stderr: "pipe", stdout: "pipe" });
    return { exit: r.exitCode, stderr: r.stderr.toString() };
  };

  test("refuses missing arguments, and a root that is not the tools drive's (nothing mounted)", () => {
    const usage = { exit: 1, stderr: "init: usage: init mount-root <dev> <fstype> <sectors> [<dns>]\n" };
    expect(init("mount-root")).toEqual(usage);
    expect(init("mount-root", "/dev/vdb", "ext4")).toEqual(usage);
    expect(init("mount-root", "/dev/vdb", "ext4", "12x")).toEqual(usage);
    expect(init("mount-root", "/dev/vdb", "", "4096")).toEqual(usage);
    // the host's / has no /.aenv link: it is not a tools drive before its pivot
    expect(init("mount-root", "/dev/vdb", "ext4", "4096")).toEqual({ exit: 1, stderr: "init: the root filesystem is mounted already\n" });
  });
});
