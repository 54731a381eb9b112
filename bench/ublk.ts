#!/usr/bin/env bun
/**
 * ublk benchmark, measured inside a guest (QEMU microvm/TCG with the guest kernel and the base
 * template, which holds the compiled `agentenv` and fio): one raw file on the guest's tmpfs is
 * read through a loop device (the in-kernel baseline), through `agentenv ublk serve --raw` and
 * through the FUSE export of the disk daemon (`agentenv ublk-daemon`, engine "fuse"), with fio
 * (libaio, O_DIRECT): 4 KiB random reads at QD1 and QD32 (IOPS) and 1 MiB sequential reads at
 * QD8 (MB/s). Prints each figure and its ratio to the loop device (goal: ublk >= 0.7x loop at
 * QD32). Every figure comes from the same VM run, one device after the other. Needs root.
 *   bun bench/ublk.ts [--size-mib 256] [--seconds 3] [--rounds 3] [--queues 2] [--depth 64] [--max-io 524288] [--tmpfs]
 * The file lives on ext4 on a scratch virtio drive (as layer files live on a host disk), read
 * once before the runs so every target reads from the page cache; `--tmpfs` puts it on tmpfs.
 * Uses AENV_TEST_HOME_PATH (default /var/lib/agentenv-test) for the kernel and template.
 */
import { loadavg } from "node:os";
import { runGuestScript } from "../test/storage/ublk/guest.ts";

const arg = (n: string, d: number) => {
  const i = process.argv.indexOf(n);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const SIZE_MIB = arg("--size-mib", 256);
const SECONDS = arg("--seconds", 3);
const ROUNDS = arg("--rounds", 3);
const QUEUES = arg("--queues", 2);
const DEPTH = arg("--depth", 64);
const MAX_IO = arg("--max-io", 524288);
/** Where the raw file lives in the guest: "ext4" (a file system on a scratch drive, as layer files on a host disk) or "tmpfs". */
const BACKING = process.argv.includes("--tmpfs") ? "tmpfs" : "ext4";

const CASES = [
  { name: "4 KiB random read QD1", rw: "randread", bs: "4k", qd: 1, unit: "IOPS" },
  { name: "4 KiB random read QD32", rw: "randread", bs: "4k", qd: 32, unit: "IOPS" },
  { name: "1 MiB sequential read QD8", rw: "read", bs: "1M", qd: 8, unit: "MB/s" },
] as const;
const TARGETS = ["loop", "ublk", "fuse"] as const;

const script = String.raw`
set -u
M=1048576
say() { echo "@@U $*"; }
if [ ${BACKING} = ext4 ]; then
  mkfs.ext4 -q /dev/vdd && mkdir -p /tmp/b && mount /dev/vdd /tmp/b || say error scratch file system
  cd /tmp/b
else
  cd /dev/shm
fi
B=$(pwd)/bench.raw
ready() { i=0; while [ $i -lt 600 ]; do grep -q '^ready' "$1" 2>/dev/null && return 0; sleep 0.1; i=$((i+1)); done; return 1; }
dd if=/dev/urandom of=bench.raw bs=1M count=${SIZE_MIB} 2>/dev/null
cat bench.raw > /dev/null
# the guest's losetup may be busybox's (no --show): attach, then find the device by its file
losetup -f $B || say error losetup failed
LOOP=$(losetup -a | grep bench.raw | head -1 | cut -d: -f1)
[ -b "$LOOP" ] || say error no loop device over $B
$A ublk serve --raw $B --read-only --queues ${QUEUES} --depth ${DEPTH} --max-io ${MAX_IO} > u.out 2> u.err &
U=$!
ready u.out || { say error ublk serve did not start; cat u.err; }
# the FUSE export through the disk daemon (its framed JSON protocol, spoken by python3)
$A ublk-daemon --dir /tmp/dd > d.out 2> d.err &
DD=$!
ready d.out || { say error disk daemon did not start; cat d.err; }
python3 - "$B" > f.out <<'PY' || say error fuse export failed
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect("/tmp/dd/daemon.sock")
req = json.dumps({"kind": "create_runtime_device", "dev_id": "bench", "engine": "fuse", "target": {"kind": "raw", "path": sys.argv[1], "read_only": True}, "fuse": {"mount_point": "/tmp/fm", "file_name": "root.img"}}).encode()
s.sendall(struct.pack(">I", len(req)) + req)
n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
r = json.loads(s.recv(n, socket.MSG_WAITALL))
print(r.get("path") or r)
PY
FP=$(cat f.out)
run() {
  fio --name=b --filename="$1" --rw=$2 --bs=$3 --iodepth=$4 --ioengine=libaio --direct=1 --time_based --runtime=${SECONDS} --ramp_time=1 --output-format=json 2>/dev/null \
    | python3 -c 'import json,sys; r=json.load(sys.stdin)["jobs"][0]["read"]; print(r["iops"], r["bw_bytes"])'
}
dev() { case $1 in loop) echo $LOOP ;; ublk) echo /dev/ublkb0 ;; fuse) echo $FP ;; esac; }
# warm-up, not measured: the servers' JIT compiles their hot paths (costly under TCG)
for t in loop ublk fuse; do run "$(dev $t)" randread 4k 32 > /dev/null; done
# targets alternate within each round, so a change of host load hits all of them alike
for r in $(seq 1 ${ROUNDS}); do
  ${CASES.map((c, i) => `for t in loop ublk fuse; do say $t.${i}.$r $(run "$(dev $t)" ${c.rw} ${c.bs} ${c.qd}); done`).join("\n  ")}
done
kill $U; wait $U
say ublk_stats $(grep '"ublk device stats"' u.err | head -1)
kill $DD; wait $DD
losetup -d $LOOP
`;

const load0 = loadavg();
const run = await runGuestScript({ name: "bench", script, vcpus: 2, memoryMiB: 1024 + SIZE_MIB, scratchMiB: BACKING === "ext4" ? SIZE_MIB + 256 : 0, timeoutMs: 900_000 });
const load1 = loadavg();
if (run.rc !== 0 || run.values.has("error")) {
  console.error(run.console.slice(-4000));
  process.exit(1);
}
/** Median over the rounds of one target and case: IOPS and MB/s. */
const fig = (t: string, i: number): { iops: number; mbps: number } => {
  const rows = Array.from({ length: ROUNDS }, (_, r) => (run.values.get(`${t}.${i}.${r + 1}`) ?? "").split(" ").map(Number));
  if (rows.some((x) => x.length !== 2 || !x.every(Number.isFinite))) throw new Error(`missing figures for ${t} case ${i}:\n${run.console.slice(-3000)}`);
  const med = (k: number) => rows.map((x) => x[k]!).sort((a, b) => a - b)[Math.floor(rows.length / 2)]!;
  return { iops: med(0), mbps: med(1) / 1e6 };
};
console.log(`ublk bench in a 2-vCPU TCG guest: ${SIZE_MIB} MiB raw file on ${BACKING === "ext4" ? "ext4 (virtio disk, page-cached)" : "tmpfs"}, fio libaio O_DIRECT, median of ${ROUNDS} rounds of ${SECONDS} s per case (targets interleaved); ublk ${QUEUES} queue(s) x depth ${DEPTH}, max ${MAX_IO / 1024} KiB per request; FUSE via the disk daemon`);
console.log(`host load average before ${load0.map((l) => l.toFixed(2)).join(" ")}, after ${load1.map((l) => l.toFixed(2)).join(" ")}; VM run ${run.seconds.toFixed(0)} s`);
CASES.forEach((c, i) => {
  const v = (t: string) => (c.unit === "IOPS" ? fig(t, i).iops : fig(t, i).mbps);
  const base = v("loop");
  const cells = TARGETS.map((t) => `${t} ${v(t).toFixed(0)}${t === "loop" ? "" : ` (${(v(t) / base).toFixed(2)}x)`}`);
  console.log(`${c.name.padEnd(28)} ${c.unit.padEnd(5)} ${cells.join("   ")}`);
});
// how well the ublk queue threads batched: requests answered per io_uring_enter they waited in
const us = run.values.get("ublk_stats");
if (us) {
  const st = JSON.parse(us.slice(us.indexOf("{"))) as { reads: number; enters?: number; errors: number };
  console.log(`ublk server: ${st.reads} reads, ${st.errors} errors${st.enters ? `, ${st.enters} io_uring_enter waits (${(st.reads / st.enters).toFixed(1)} requests each)` : ""}`);
}
