/**
 * The ublk server inside a real guest (QEMU microvm/TCG, the guest kernel with ublk + io_uring,
 * the base template's root filesystem with the compiled `agentenv` and fio): one VM runs one
 * script (guest.ts) that builds overlaybd layers with `agentenv image`, serves them with
 * `agentenv ublk serve` and checks from the guest side; every check prints a value the tests
 * below assert. Shown: reads of a served stack equal `agentenv image cat` of it byte for byte;
 * writes land in the upper and read back after a restart of the server; mkfs.ext4 + mount + fsck
 * clean; DISCARD and WRITE_ZEROES read back as zeros; a read-only shared device read by two readers at once; kill -9 of the server under fio
 * with user recovery (START/END_USER_RECOVERY) keeps fio's verified data and the filesystem
 * clean, and so does a server that detaches (SIGUSR2) for another to recover; without recovery the kernel removes the device and `ublk remove` deletes it; a corrupt
 * ZFile block and a layer truncated under the server give I/O errors for their ranges only, with
 * a log line naming the file and offset; the CoW target copies on write and leaves its origin alone;
 * a raw file on ext4 (where the queue threads chain RWF_NOWAIT reads to their commit) reads
 * exactly, cached or not, by four readers at once, and truncated under the server gives EIO.
 */
import { beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { guestValues, runGuestScript, type GuestRun } from "./guest.ts";

const MiB = 1024 * 1024;

const SCRIPT = String.raw`
set -u
W=/dev/shm/w; mkdir -p $W; cd $W
M=1048576
say() { echo "@@U $*"; }
# wait until file $1 has the serve command's "ready" line (60 s)
ready() { i=0; while [ $i -lt 600 ]; do grep -q '^ready' "$1" 2>/dev/null && return 0; sleep 0.1; i=$((i+1)); done; return 1; }
# wait until path $1 is gone (40 s)
gone() { i=0; while [ $i -lt 400 ]; do [ -e "$1" ] || return 0; sleep 0.1; i=$((i+1)); done; return 1; }
devsha() { dd if=$1 bs=1M iflag=direct 2>/dev/null | sha256sum | cut -c1-64; }
filesha() { sha256sum "$1" | cut -c1-64; }
exists() { [ -e "$1" ] && echo 1 || echo 0; }

say features $($A ublk features)

# three layers: l0 random 32 MiB with a 2 MiB zero hole, l1 rewrites 2 MiB, l2 (ZFile) 1 MiB
head -c $((32*M)) /dev/urandom > base.raw
dd if=/dev/zero of=base.raw bs=1M seek=20 count=2 conv=notrunc 2>/dev/null
cp base.raw top.raw
dd if=/dev/urandom of=top.raw bs=1M seek=4 count=2 conv=notrunc 2>/dev/null
cp top.raw z.raw
dd if=/dev/urandom of=z.raw bs=1M seek=8 count=1 conv=notrunc 2>/dev/null
$A image import-raw base.raw l0 >/dev/null
$A image import-raw top.raw l1 --parent l0 >/dev/null
$A image import-raw z.raw l2 --parent l0,l1 >/dev/null
$A image zfile l2 l2.z >/dev/null
$A image stack stack.json --lowers l0,l1,l2.z --upper-data u.data --upper-index u.index --create-upper >/dev/null
$A image stack ro.json --lowers l0,l1,l2.z >/dev/null
say base_sha $(filesha base.raw)
say raw_sha $(filesha z.raw)
say cat_sha $($A image cat stack.json | sha256sum | cut -c1-64)

# 1. the writable stack as /dev/ublkb0 with 2 queues
$A ublk serve --config stack.json --id 0 --queues 2 --depth 32 > s0.out 2> s0.err &
S0=$!
ready s0.out; say ready0 $?
say dev0_size $(blockdev --getsize64 /dev/ublkb0)
say dev0_ro $(blockdev --getro /dev/ublkb0)
say lbs $(cat /sys/block/ublkb0/queue/logical_block_size)
say pbs $(cat /sys/block/ublkb0/queue/physical_block_size)
say max_kb $(cat /sys/block/ublkb0/queue/max_sectors_kb)
say hw_queues $(ls -d /sys/block/ublkb0/mq/*/ | wc -l)
say nr_tags $(cat /sys/block/ublkb0/mq/0/nr_tags)
say dev0_sha $(devsha /dev/ublkb0)
say past_end_bytes $(dd if=/dev/ublkb0 bs=512 skip=$((32*M/512)) count=1 iflag=direct 2>/dev/null | wc -c)
head -c $M /dev/urandom > w1; head -c 4096 /dev/urandom > w2; head -c 512 /dev/urandom > w3
dd if=w1 of=/dev/ublkb0 bs=1M seek=20 oflag=direct conv=notrunc 2>/dev/null
dd if=w2 of=/dev/ublkb0 bs=4096 seek=$((5*M/4096)) oflag=direct conv=notrunc 2>/dev/null
dd if=w3 of=/dev/ublkb0 bs=512 seek=12345 oflag=direct conv=notrunc 2>/dev/null
# DISCARD of 1 MiB of layer data and WRITE_ZEROES of 64 KiB: both read back as zeros
say discard_max $(cat /sys/block/ublkb0/queue/discard_max_bytes)
say write_zeroes_max $(cat /sys/block/ublkb0/queue/write_zeroes_max_bytes)
blkdiscard -o $((8*M)) -l $M /dev/ublkb0; say discard_rc $?
# BLKZEROOUT (the guest's blkdiscard is busybox's, without -z)
python3 -c 'import fcntl, os, struct, sys; fcntl.ioctl(os.open("/dev/ublkb0", os.O_WRONLY), 0x127f, struct.pack("QQ", int(sys.argv[1]), int(sys.argv[2])))' $((24*M)) 65536; say zeroout_rc $?
blockdev --flushbufs /dev/ublkb0
cp z.raw expect.raw
dd if=w1 of=expect.raw bs=1M seek=20 conv=notrunc 2>/dev/null
dd if=w2 of=expect.raw bs=4096 seek=$((5*M/4096)) conv=notrunc 2>/dev/null
dd if=w3 of=expect.raw bs=512 seek=12345 conv=notrunc 2>/dev/null
dd if=/dev/zero of=expect.raw bs=1M seek=8 count=1 conv=notrunc 2>/dev/null
dd if=/dev/zero of=expect.raw bs=65536 seek=$((24*M/65536)) count=1 conv=notrunc 2>/dev/null
say discarded_sha $(dd if=/dev/ublkb0 bs=64k skip=128 count=16 iflag=direct 2>/dev/null | sha256sum | cut -c1-64)
say zero_mib_sha $(head -c $M /dev/zero | sha256sum | cut -c1-64)
say expect_sha $(filesha expect.raw)
say written_sha $(devsha /dev/ublkb0)
kill $S0; wait $S0; say serve0_rc $?
say stats0 $(grep '"ublk device stats"' s0.err | head -1)
say dev0_left $(exists /dev/ublkb0)
say upper_cat_sha $($A image cat stack.json | sha256sum | cut -c1-64)
$A ublk serve --config stack.json --id 0 --queues 2 --depth 32 > s1.out 2> s1.err &
S1=$!
ready s1.out; say ready1 $?
say restart_sha $(devsha /dev/ublkb0)

# 2. ext4 on the device
mkfs.ext4 -q -F /dev/ublkb0; say mkfs_rc $?
mkdir -p /tmp/u; mount /dev/ublkb0 /tmp/u; say mount_rc $?
head -c $((2*M)) /dev/urandom > f1; cp f1 /tmp/u/f1; sync
umount /tmp/u
e2fsck -fn /dev/ublkb0 > fsck1.out 2>&1; say fsck1_rc $?
mount /dev/ublkb0 /tmp/u
say f1_sha_src $(filesha f1)
say f1_sha_dev $(filesha /tmp/u/f1)

# 3. kill -9 of the server under fio, then user recovery
fio --name=w --filename=/tmp/u/fio.dat --size=12M --bs=4k --rw=randwrite --ioengine=libaio --iodepth=16 --direct=1 --rate_iops=4000,300 --verify=crc32c --verify_fatal=1 --output=fio.out >/dev/null 2>&1 &
F=$!
sleep 4
say fio_running_at_kill $(kill -0 $F 2>/dev/null && echo 1 || echo 0)
kill -9 $S1
$A ublk serve --config stack.json --recover 0 > s2.out 2> s2.err &
S2=$!
ready s2.out; say ready2 $?
wait $F; say fio_rc $?
say fio_errors $(grep -o "err= *[0-9]*" fio.out | tr -dc '0-9 ' | tr ' ' '\n' | grep -v '^$' | sort -u | tr '\n' ,)
say fio_verify_errors $(grep -ci "verify.*fail\|bad magic\|crc32c.*mismatch" fio.out)
say f1_sha_after $(filesha /tmp/u/f1)
umount /tmp/u; say umount_rc $?
e2fsck -fn /dev/ublkb0 > fsck2.out 2>&1; say fsck2_rc $?
tail -3 fsck2.out
say recovered_log $(grep -c '"ublk device recovered"' s2.err)

# 3b. SIGUSR2: the server stops serving and leaves the device; another server recovers it
say pre_detach_sha $(devsha /dev/ublkb0)
kill -USR2 $S2; wait $S2; say detach_rc $?
say stats2 $(grep '"ublk device stats"' s2.err | head -1)
say detach_dev_left $(exists /dev/ublkb0)
$A ublk serve --config stack.json --recover 0 > s7.out 2> s7.err &
S7=$!
ready s7.out; say ready7 $?
say post_detach_sha $(devsha /dev/ublkb0)

# 4. a read-only stack shared by two readers at once
$A ublk serve --config ro.json --read-only --id 1 > s3.out 2> s3.err &
S3=$!
ready s3.out; say ready3 $?
say dev1_ro $(blockdev --getro /dev/ublkb1)
( devsha /dev/ublkb1 > r1.sha ) &
R1=$!
( devsha /dev/ublkb1 > r2.sha ) &
R2=$!
wait $R1; wait $R2
say ro1_sha $(cat r1.sha)
say ro2_sha $(cat r2.sha)
dd if=/dev/zero of=/dev/ublkb1 bs=4096 count=1 oflag=direct 2>/dev/null; say ro_write_rc $?
kill $S3; wait $S3

# 5. a corrupt ZFile block: I/O errors for its range only, a log line naming file and offset
cp l2.z bad.z
say corrupt_at $(( $(stat -c %s bad.z) / 2 ))
printf 'CORRUPTCORRUPT!!' | dd of=bad.z bs=1 seek=$(( $(stat -c %s bad.z) / 2 )) conv=notrunc 2>/dev/null
$A image stack bad.json --lowers l0,l1,bad.z >/dev/null
$A ublk serve --config bad.json --read-only --id 2 > s4.out 2> s4.err &
S4=$!
ready s4.out; say ready4 $?
say bad_errors $(dd if=/dev/ublkb2 of=/dev/null bs=64k skip=128 count=16 iflag=direct conv=noerror 2>&1 | grep -c "Input/output error")
say bad_head_sha $(dd if=/dev/ublkb2 bs=1M count=8 iflag=direct 2>/dev/null | sha256sum | cut -c1-64)
say good_head_sha $(head -c $((8*M)) z.raw | sha256sum | cut -c1-64)
say bad_log_lines $(grep '"request failed' s4.err | grep -c "$W/bad.z")
grep '"request failed' s4.err | head -1
kill $S4; wait $S4

# 6. a layer file truncated while served: the queue threads' direct reads fail with EIO
cp l1 l1t
$A image stack trunc.json --lowers l0,l1t >/dev/null
$A ublk serve --config trunc.json --read-only --id 3 > s6.out 2> s6.err &
S6=$!
ready s6.out; say ready6 $?
truncate -s 4096 l1t
say trunc_errors $(dd if=/dev/ublkb3 of=/dev/null bs=1M skip=4 count=2 iflag=direct conv=noerror 2>&1 | grep -c "Input/output error")
say trunc_head_sha $(dd if=/dev/ublkb3 bs=1M count=4 iflag=direct 2>/dev/null | sha256sum | cut -c1-64)
say base_head_sha $(head -c $((4*M)) base.raw | sha256sum | cut -c1-64)
say trunc_log_lines $(grep 'short read of' s6.err | grep -c "$W/l1t")
grep 'short read of' s6.err | head -1
kill $S6; wait $S6

# 7. CoW over base.raw without user recovery; kill -9 removes the device
$A ublk serve --cow cow.img --origin base.raw --create --no-recovery --id 5 > s5.out 2> s5.err &
S5=$!
ready s5.out; say ready5 $?
head -c 65536 /dev/urandom > w4; head -c 4096 /dev/urandom > w5
dd if=w4 of=/dev/ublkb5 bs=64k seek=3 oflag=direct conv=notrunc 2>/dev/null
dd if=w5 of=/dev/ublkb5 bs=4096 seek=$((M/4096 + 1)) oflag=direct conv=notrunc 2>/dev/null
cp base.raw cowexpect.raw
dd if=w4 of=cowexpect.raw bs=64k seek=3 conv=notrunc 2>/dev/null
dd if=w5 of=cowexpect.raw bs=4096 seek=$((M/4096 + 1)) conv=notrunc 2>/dev/null
say cow_expect_sha $(filesha cowexpect.raw)
say cow_dev_sha $(devsha /dev/ublkb5)
say cow_base_sha $(filesha base.raw)
kill -9 $S5
T0=$(date +%s)
gone /dev/ublkb5; say norec_gone_rc $?
say norec_seconds $(( $(date +%s) - T0 ))
say norec_list $($A ublk list)
$A ublk remove 5; say remove_rc $?
say norec_char_left $(exists /dev/ublkc5)

# 8. bad requests to the CLI: typed errors, exit codes, nothing created
$A ublk serve --recover 9 --raw base.raw > /dev/null 2> e1.err; say bad_recover_rc $?
say bad_recover_err $(grep -c "ublk.not_found" e1.err)
$A ublk serve --recover 0 --raw base.raw > /dev/null 2> e2.err; say busy_recover_rc $?
say busy_recover_err $(grep -c "ublk.not_recoverable: device 0 is served by the running process $S7" e2.err)
$A ublk remove 0 2> e3.err; say busy_remove_rc $?
say busy_remove_err $(grep -c "ublk.busy" e3.err)
$A ublk serve --raw base.raw --depth 5000 > /dev/null 2> e4.err; say bad_depth_rc $?
say bad_depth_err $(grep -c "ublk.bad_config" e4.err)
$A ublk serve > /dev/null 2> e5.err; say no_target_rc $?

# 9. a raw file on ext4 (a file system whose reads can be tried without blocking: the queue
#    thread chains RWF_NOWAIT reads to their COMMIT); cached, uncached, concurrent, truncated
mkfs.ext4 -q /dev/vdd && mkdir -p /tmp/e && mount /dev/vdd /tmp/e; say ext4_rc $?
cp base.raw /tmp/e/e.raw; cp base.raw /tmp/e/t.raw; sync
$A ublk serve --raw /tmp/e/e.raw --read-only --id 6 > s8.out 2> s8.err &
S8=$!
ready s8.out; say ready8 $?
say ext_cached_sha $(devsha /dev/ublkb6)
sync; echo 3 > /proc/sys/vm/drop_caches
say ext_cold_sha $(devsha /dev/ublkb6)
# four readers at once, 4 KiB requests, each over its own 8 MiB
# (wait for these four only: a bare wait would also wait for the servers still running)
PAR=""
for k in 0 1 2 3; do ( dd if=/dev/ublkb6 bs=4096 skip=$((k*2048)) count=2048 iflag=direct 2>/dev/null | sha256sum | cut -c1-64 > par$k.sha ) & PAR="$PAR $!"; done
wait $PAR
for k in 0 1 2 3; do say par_sha$k $(cat par$k.sha); say par_want$k $(dd if=base.raw bs=4096 skip=$((k*2048)) count=2048 2>/dev/null | sha256sum | cut -c1-64); done
kill $S8; wait $S8
say stats8 $(grep '"ublk device stats"' s8.err | head -1)
$A ublk serve --raw /tmp/e/t.raw --read-only --id 7 > s9.out 2> s9.err &
S9=$!
ready s9.out; say ready9 $?
cat /tmp/e/t.raw > /dev/null
truncate -s $((4*M + 2048)) /tmp/e/t.raw
say ext_trunc_errors $(dd if=/dev/ublkb7 of=/dev/null bs=1M skip=4 count=2 iflag=direct conv=noerror 2>&1 | grep -c "Input/output error")
say ext_trunc_head_sha $(dd if=/dev/ublkb7 bs=1M count=4 iflag=direct 2>/dev/null | sha256sum | cut -c1-64)
say base_head4_sha $(head -c $((4*M)) base.raw | sha256sum | cut -c1-64)
say ext_trunc_log $(grep -c 'short read of /tmp/e/t.raw' s9.err)
kill $S9; wait $S9
umount /tmp/e

kill $S7; wait $S7; say serve7_rc $?
say devices_left $($A ublk list)
`;

let run: GuestRun;
let v: Map<string, string>;
const val = (k: string): string => {
  const x = v.get(k);
  if (x === undefined) throw new Error(`the guest script printed no ${k}`);
  return x;
};

beforeAll(async () => {
  run = await runGuestScript({ name: "vm", script: SCRIPT, vcpus: 2, memoryMiB: 1024, scratchMiB: 128, timeoutMs: 420_000 });
  v = guestValues(run.console);
  // debugging aid: UBLK_VM_CONSOLE=<file> keeps the guest's console
  if (process.env.UBLK_VM_CONSOLE) writeFileSync(process.env.UBLK_VM_CONSOLE, run.console);
  if (run.rc !== 0 || !v.has("devices_left")) console.error(run.console.slice(-6000));
  console.log(`ublk VM test: ${run.seconds.toFixed(1)} s in the VM`);
}, 480_000);

describe("ublk in the guest", () => {
  test("the guest kernel offers ublk with user recovery, legacy opcodes (6.1)", () => {
    expect(run.rc).toBe(0);
    expect(JSON.parse(val("features"))).toEqual({ available: true, flags: "0x1f", encodedOps: false, userRecovery: true });
  });

  test("a served overlaybd stack has the configured geometry and reads exactly as `agentenv image cat` of it; past the end there are no bytes", () => {
    expect(val("ready0")).toBe("0");
    expect(Number(val("dev0_size"))).toBe(32 * MiB);
    expect(val("dev0_ro")).toBe("0");
    // logical block 512 B, physical 4 KiB, largest request [ublk] max_io_bytes; --queues 2 --depth 32
    expect([val("lbs"), val("pbs"), val("max_kb")]).toEqual(["512", "4096", "512"]);
    expect([val("hw_queues"), val("nr_tags")]).toEqual(["2", "32"]);
    expect(val("cat_sha")).toBe(val("raw_sha"));
    expect(val("dev0_sha")).toBe(val("cat_sha"));
    expect(val("past_end_bytes")).toBe("0");
  });

  test("DISCARD and WRITE_ZEROES reach the server as such and read back as zeros", () => {
    expect(Number(val("discard_max"))).toBe(512 * 1024); // max_io_bytes: one request at most
    expect(Number(val("write_zeroes_max"))).toBe(512 * 1024);
    expect([val("discard_rc"), val("zeroout_rc")]).toEqual(["0", "0"]);
    expect(val("discarded_sha")).toBe(val("zero_mib_sha"));
    const st = JSON.parse(val("stats0"));
    expect(st.discards).toBe(2 + 1); // 1 MiB discard in two 512 KiB requests, one write-zeroes
  });

  test("writes land in the upper and read back after a restart of the server", () => {
    expect(val("written_sha")).toBe(val("expect_sha"));
    expect(val("written_sha")).not.toBe(val("raw_sha"));
    expect(val("serve0_rc")).toBe("0");
    expect(val("dev0_left")).toBe("0"); // SIGTERM stopped and deleted the device
    expect(val("upper_cat_sha")).toBe(val("expect_sha"));
    expect(val("ready1")).toBe("0");
    expect(val("restart_sha")).toBe(val("expect_sha"));
    // what the server counted: the bytes of the three writes exactly (the guest's dd is busybox's,
    // which writes through the page cache: the 512-byte write reaches the device as its 4 KiB
    // page); the discard and write-zeroes are not writes; reads of the whole device twice at least
    const st = JSON.parse(val("stats0"));
    expect(st).toMatchObject({ devId: 0, why: "SIGTERM", bytesWritten: MiB + 4096 + 4096, errors: 0 });
    expect(st.writes).toBeGreaterThanOrEqual(3); // 1 MiB may be split at max_io_bytes
    expect(st.bytesRead).toBeGreaterThanOrEqual(2 * 32 * MiB);
    expect(st.reads).toBeGreaterThanOrEqual(2 * 64);
    expect(st.forwarded).toBeGreaterThan(0); // the upper's writes and reads of the ZFile layer go through the image
  });

  test("mkfs.ext4, mount, a file written and read back, fsck clean", () => {
    expect([val("mkfs_rc"), val("mount_rc"), val("fsck1_rc")]).toEqual(["0", "0", "0"]);
    expect(val("f1_sha_dev")).toBe(val("f1_sha_src"));
  });

  test("kill -9 of the server under fio: user recovery resumes the device, fio verifies, fsck clean", () => {
    expect(val("fio_running_at_kill")).toBe("1");
    expect(val("ready2")).toBe("0");
    expect(val("recovered_log")).toBe("1");
    expect(val("fio_rc")).toBe("0");
    expect(val("fio_errors")).toBe("0,");
    expect(val("fio_verify_errors")).toBe("0");
    expect(val("f1_sha_after")).toBe(val("f1_sha_src"));
    expect(val("umount_rc")).toBe("0");
    expect(val("fsck2_rc")).toBe("0");
    // the recovering server answered fio's later writes, and ext4's flushes (journal commits, the
    // unmount) reached it as FLUSH requests (the device has a volatile cache)
    const st = JSON.parse(val("stats2"));
    expect(st).toMatchObject({ devId: 0, why: "SIGUSR2", errors: 0 });
    expect(st.writes).toBeGreaterThan(0);
    expect(st.flushes).toBeGreaterThan(0);
  });

  test("SIGUSR2 detaches: the device stays, another server recovers it with the same content", () => {
    expect(val("detach_rc")).toBe("0");
    expect(val("detach_dev_left")).toBe("1");
    expect(val("ready7")).toBe("0");
    expect(val("post_detach_sha")).toBe(val("pre_detach_sha"));
    expect(val("serve7_rc")).toBe("0");
  });

  test("a read-only stack is one device two readers read at once; writes to it fail", () => {
    expect(val("ready3")).toBe("0");
    expect(val("dev1_ro")).toBe("1");
    expect(val("ro1_sha")).toBe(val("raw_sha"));
    expect(val("ro2_sha")).toBe(val("raw_sha"));
    expect(val("ro_write_rc")).not.toBe("0");
  });

  test("a corrupt ZFile block: I/O error for its range only, a log line naming the file and the offset of the block", () => {
    expect(val("ready4")).toBe("0");
    expect(Number(val("bad_errors"))).toBeGreaterThanOrEqual(1);
    expect(Number(val("bad_errors"))).toBeLessThanOrEqual(2);
    expect(val("bad_head_sha")).toBe(val("good_head_sha"));
    expect(Number(val("bad_log_lines"))).toBeGreaterThanOrEqual(1);
    const line = run.console.split("\n").find((l) => l.includes('"request failed') && l.includes("bad.z"))!;
    const logged = JSON.parse(line.slice(line.indexOf("{")));
    // (read before toMatchObject: bun's asymmetric matchers replace the value they matched)
    const off = logged.fileOffset;
    expect(logged).toMatchObject({ code: "overlaybd.crc_mismatch", file: "/dev/shm/w/bad.z" });
    expect(typeof off).toBe("number");
    // the offset is where the failing block's stored bytes start in the file: the 16 corrupt bytes
    // lie in that block, whose stored length is at most 2 x 4 KiB + 1 KiB (the jump table's bound)
    const at = Number(val("corrupt_at"));
    expect(off).toBeLessThanOrEqual(at + 15);
    expect(off).toBeGreaterThan(at - (2 * 4096 + 1024));
  });

  test("a layer truncated under the server: EIO for its range, the rest intact, the file and offset logged", () => {
    expect(val("ready6")).toBe("0");
    expect(val("trunc_errors")).toBe("2");
    expect(val("trunc_head_sha")).toBe(val("base_head_sha"));
    expect(Number(val("trunc_log_lines"))).toBeGreaterThanOrEqual(1);
    const line = run.console.split("\n").find((l) => l.includes("short read of") && l.includes("l1t"))!;
    expect(JSON.parse(line.slice(line.indexOf("{")))).toMatchObject({ file: "/dev/shm/w/l1t", offset: expect.any(Number) });
  });

  test("a raw file on ext4 (reads chained to their commit with RWF_NOWAIT): exact bytes cached, uncached and four readers at once; truncated under the server: EIO past the end, a log line", () => {
    expect([val("ext4_rc"), val("ready8")]).toEqual(["0", "0"]);
    expect(val("ext_cached_sha")).toBe(val("base_sha"));
    expect(val("ext_cold_sha")).toBe(val("base_sha"));
    for (const k of [0, 1, 2, 3]) expect(val(`par_sha${k}`)).toBe(val(`par_want${k}`));
    const st = JSON.parse(val("stats8"));
    expect(st).toMatchObject({ devId: 6, errors: 0, forwarded: 0 });
    // the device read twice and four eighths at once, all on the queue threads (plus the kernel's partition scan)
    expect(st.bytesRead).toBeGreaterThanOrEqual(3 * 32 * MiB);
    expect(st.bytesRead).toBeLessThanOrEqual(3 * 32 * MiB + MiB);
    expect(val("ready9")).toBe("0");
    // the first 1 MiB read past 4 MiB ends 2 KiB into it: short, then nothing more: EIO; the next is past the end
    expect(val("ext_trunc_errors")).toBe("2");
    expect(val("ext_trunc_head_sha")).toBe(val("base_head4_sha"));
    expect(Number(val("ext_trunc_log"))).toBeGreaterThanOrEqual(1);
  });

  test("bad CLI requests: unknown device, a device another process serves, bad depth, no target", () => {
    expect([val("bad_recover_rc"), val("bad_recover_err")]).toEqual(["1", "1"]);
    expect([val("busy_recover_rc"), val("busy_recover_err")]).toEqual(["1", "1"]);
    expect([val("busy_remove_rc"), val("busy_remove_err")]).toEqual(["1", "1"]);
    expect([val("bad_depth_rc"), val("bad_depth_err")]).toEqual(["1", "1"]);
    expect(val("no_target_rc")).toBe("2");
  });

  test("CoW over a raw origin: writes read back, the origin is untouched; without recovery kill -9 removes the device", () => {
    expect(val("ready5")).toBe("0");
    expect(val("cow_dev_sha")).toBe(val("cow_expect_sha"));
    expect(val("cow_base_sha")).toBe(val("base_sha"));
    expect(val("norec_gone_rc")).toBe("0");
    expect(JSON.parse(val("norec_list"))).toContainEqual({ devId: 5, state: "dead", serverPid: -1, queues: 1, depth: 64, recoverable: false, owner: null });
    expect(val("remove_rc")).toBe("0");
    expect(val("norec_char_left")).toBe("0");
    expect(JSON.parse(val("devices_left"))).toEqual([]);
  });
});
