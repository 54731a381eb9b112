/**
 * Run a shell script inside a VM for the ublk tests and bench: QEMU microvm/TCG with the guest
 * kernel (ublk + io_uring built in), booted through the tools drive (/dev/vda: init and the
 * compiled `agentenv` at /.aenv/bin, see src/tools) into the base template's root filesystem
 * (/dev/vdb, read-only; it holds fio), no network. The script travels on a third virtio drive
 * (/dev/vdc, NUL-padded) because the kernel command line is too short for it; the guest init
 * runs it (`aenv.run`) with its output on the serial console and ends with `@@AENV-RUN-EXIT@@ rc=N`.
 * In the script, `$A` runs agentenv. Scratch space in the guest: /dev/shm and /tmp (tmpfs), and
 * with `scratchMiB` an empty writable drive /dev/vdd (a sparse file on the host) for a file system
 * of the script's own.
 */
import { mkdtempSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { resolveTemplate } from "../../../src/template/index.ts";
import { resolveKernelPath } from "../../../src/vmm/index.ts";
import { TEST_HOME, testBoot, testConfig, testDriver, waitConsole } from "../../vmm/qemu/helpers.ts";

/** What a guest script printed and how it ended. */
export interface GuestRun {
  /** The whole serial console. */
  console: string;
  /** Exit code of the script. */
  rc: number;
  /** Wall time from boot to the script's end, seconds. */
  seconds: number;
  /** `@@U <key> <value>` lines, by key (the last one wins). */
  values: Map<string, string>;
}

/** Parse the script's `@@U <key> <value>` lines. */
export function guestValues(console: string): Map<string, string> {
  const m = new Map<string, string>();
  for (const line of console.split("\n")) {
    const r = /^@@U (\S+) ?(.*?)\r?$/.exec(line);
    if (r) m.set(r[1]!, r[2]!);
  }
  return m;
}

/**
 * Boot a VM, run `script` (POSIX sh) as root in it, stop the VM.
 * @throws Error when the VM does not finish the script within `timeoutMs` (with the console tail)
 */
export async function runGuestScript(opts: { name: string; script: string; vcpus?: number; memoryMiB?: number; scratchMiB?: number; timeoutMs: number }): Promise<GuestRun> {
  const cfg = testConfig();
  const tpl = resolveTemplate(TEST_HOME, "base");
  const drv = testDriver();
  const dir = mkdtempSync(join(tmpdir(), `ublk-${opts.name}-`));
  const scriptBytes = new TextEncoder().encode(opts.script);
  const padded = new Uint8Array(Math.ceil((scriptBytes.length + 1) / 512) * 512);
  padded.set(scriptBytes);
  writeFileSync(join(dir, "script.raw"), padded);
  if (opts.scratchMiB) {
    writeFileSync(join(dir, "scratch.raw"), "");
    truncateSync(join(dir, "scratch.raw"), opts.scratchMiB * 1024 * 1024);
  }
  const run = 'tr -d "\\000" </dev/vdc >/run/t.sh; A="env LD_LIBRARY_PATH=/.aenv/lib /.aenv/bin/agentenv" sh /run/t.sh';
  const boot = testBoot(tpl.rootfsPath, { readOnly: true, args: `aenv.envd=0 aenv.run=${btoa(run)}` });
  const t0 = performance.now();
  const vm = await drv.driver.boot({
    id: `ublk${process.pid}${opts.name}`.slice(0, 40),
    workDir: join(dir, "vm"),
    kernelPath: resolveKernelPath(cfg),
    bootArgs: boot.bootArgs,
    vcpus: opts.vcpus ?? 2,
    memoryMiB: opts.memoryMiB ?? 1024,
    drives: [
      ...boot.drives,
      { id: "script", path: join(dir, "script.raw"), readOnly: true, isRoot: false },
      ...(opts.scratchMiB ? [{ id: "scratch", path: join(dir, "scratch.raw"), readOnly: false, isRoot: false }] : []),
    ],
  });
  try {
    let rc: number;
    try {
      rc = Number((await waitConsole(vm.consolePath!, /@@AENV-RUN-EXIT@@ rc=(\d+)/, opts.timeoutMs))[1]);
    } catch (e) {
      throw new Error(`${(e as Error).message}\nconsole:\n${vm.consoleTail(6000)}`);
    }
    const seconds = (performance.now() - t0) / 1000;
    const console = vm.consoleTail(1 << 30);
    return { console, rc, seconds, values: guestValues(console) };
  } finally {
    await vm.stop();
    drv.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
}
