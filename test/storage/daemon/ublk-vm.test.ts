/**
 * The disk daemon with its ublk engine, inside a real guest (QEMU microvm/TCG, the guest kernel
 * with ublk + io_uring, booted through the tools drive with the compiled `agentenv`): one VM
 * runs one script (../ublk/guest.ts) that starts `agentenv ublk-daemon` (export "auto": ublk,
 * since /dev/ublk-control exists there) and drives it with `agentenv ublk-daemon --call` (the same
 * protocol the node speaks). Shown: the daemon picks ublk; its warm pool holds pre-created ublk
 * devices (added, queue threads waiting) between the watermarks, an exclusive acquire binds one
 * and it serves the stack's bytes; a sandbox-style stack (layer + created upper) becomes
 * /dev/ublkbN reading as the layer; a write lands; kill -9 of the daemon while fio writes to ext4
 * on one of its devices: the next daemon recovers every device from its database (user
 * recovery), fio verifies, fsck is clean; a shared read-only device is refcounted, opens
 * read-write (as QEMU opens guest RAM) but refuses writes, and goes with its last release; a
 * restack of the live device seals its upper into a layer and writes go on into a new upper; a
 * resize is a typed refusal; a kernel device the database does not name (the window between
 * ADD_DEV and recording its id) is removed by the next daemon; without user recovery a device
 * stopped from outside is reported lost (a `device_lost` event) and one whose daemon was killed
 * is gone and reported lost by the next daemon; shutdown removes every device, pooled ones too.
 */
import { beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { daemonSettings, diskConfig } from "../../../src/storage/daemon/index.ts";
import { ownerTagOf } from "../../../src/storage/ublk/index.ts";
import { guestValues, runGuestScript, type GuestRun } from "../ublk/guest.ts";

const W = "/dev/shm/d";
const MiB = 1024 * 1024;
const settings = daemonSettings({ ...diskConfig(), pool: { enabled: true, lowWatermark: 1, highWatermark: 2 } }, `${W}/run`);
// a second daemon without user recovery (and without a pool)
const settings2 = { ...settings, dir: `${W}/run2`, ublk: { ...settings.ublk, userRecovery: false }, pool: { enabled: false, lowWatermark: 0, highWatermark: 0 } };
const OWNER = `0x${ownerTagOf(`${W}/run`).toString(16)}`;

const SCRIPT = String.raw`
set -u
W=${W}; mkdir -p $W; cd $W
M=1048576
OWNER=${OWNER}
SET='${JSON.stringify(settings)}'
SET2='${JSON.stringify(settings2)}'
say() { echo "@@U $*"; }
ready() { i=0; while [ $i -lt 600 ]; do grep -q '^ready' "$1" 2>/dev/null && return 0; sleep 0.1; i=$((i+1)); done; return 1; }
gone() { i=0; while [ $i -lt 400 ]; do [ -e "$1" ] || return 0; sleep 0.1; i=$((i+1)); done; return 1; }
exists() { [ -e "$1" ] && echo 1 || echo 0; }
devsha() { dd if=$1 bs=1M iflag=direct 2>/dev/null | sha256sum | cut -c1-64; }
filesha() { sha256sum "$1" | cut -c1-64; }
call() { $A ublk-daemon --dir $W/run --settings "$SET" --call "$1" 2>>call.err; }
call2() { $A ublk-daemon --dir $W/run2 --settings "$SET2" --call "$1" 2>>call.err; }
# exec: run in the background, $! is the daemon's own pid (kill -9 must reach it, not a subshell)
daemon() { AENV_LOG_LEVEL=info exec $A ublk-daemon --dir $W/run --settings "$SET"; }
daemon2() { AENV_LOG_LEVEL=info exec $A ublk-daemon --dir $W/run2 --settings "$SET2"; }
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p"; }
# kernel ublk devices carrying owner tag $1
tagged() { $A ublk list | python3 -c 'import json,sys; print(len([d for d in json.load(sys.stdin) if d["owner"]==sys.argv[1]]))' "$1"; }
pooled() { call '{"kind":"get_features"}' | sed -n 's/.*"ublk":\([0-9]*\).*/\1/p'; }

head -c $((16*M)) /dev/urandom > base.raw
$A image import-raw base.raw l0 >/dev/null
say base_sha $(filesha base.raw)

# 1. the daemon; its warm pool is filled to the low watermark with pre-created ublk devices
daemon > d0.out 2> d0.err &
D0=$!
ready d0.out; say ready0 $?
say features $(call '{"kind":"get_features"}')
say tagged0 $(tagged $OWNER)
say blockdevs0 $(ls /sys/block | grep -c '^ublkb')
A0=$(call '{"kind":"acquire","access_mode":"exclusive","dev_id":"sb0","target":{"kind":"overlaybd","lowers":["'$W'/l0"],"upper":{"data":"'$W'/u0.data","index":"'$W'/u0.index"},"create_upper_size":0}}')
say acquired0 $A0
P0=$(echo "$A0" | field path)
say sb0_size $(blockdev --getsize64 $P0)
say sb0_sha $(devsha $P0)
head -c 65536 /dev/urandom > w0
dd if=w0 of=$P0 bs=64k seek=7 oflag=direct conv=notrunc 2>/dev/null; say sb0_write_rc $?
cp base.raw expect0.raw
dd if=w0 of=expect0.raw bs=64k seek=7 conv=notrunc 2>/dev/null
say sb0_expect_sha $(filesha expect0.raw)
say sb0_written_sha $(devsha $P0)
# one taken below the low watermark: refilled to the high one in the background
i=0; while [ $i -lt 300 ] && [ "$(pooled)" != 2 ]; do sleep 0.1; i=$((i+1)); done
say pooled1 $(pooled)
say tagged1 $(tagged $OWNER)
say release0 $(call '{"kind":"release","dev_id":"sb0"}' | field refcount)
say sb0_left $(exists $P0)

# 2. a sandbox-style stack created directly; a write lands
C=$(call '{"kind":"create_runtime_device","dev_id":"sb1","target":{"kind":"overlaybd","lowers":["'$W'/l0"],"upper":{"data":"'$W'/u.data","index":"'$W'/u.index"},"create_upper_size":0}}')
say created $C
P=$(echo "$C" | field path)
say path $P
say dev_sha $(devsha $P)
head -c $M /dev/urandom > w1
dd if=w1 of=$P bs=1M seek=4 oflag=direct conv=notrunc 2>/dev/null; say write_rc $?
blockdev --flushbufs $P
cp base.raw expect.raw
dd if=w1 of=expect.raw bs=1M seek=4 conv=notrunc 2>/dev/null
say expect_sha $(filesha expect.raw)
say written_sha $(devsha $P)

# 3. ext4 on another device; kill -9 of the daemon while fio writes to it; the next daemon recovers
F=$(call '{"kind":"create_runtime_device","dev_id":"fs1","target":{"kind":"overlaybd","lowers":["'$W'/l0"],"upper":{"data":"'$W'/f.data","index":"'$W'/f.index"},"create_upper_size":'$((64*M))'}}')
say fs_created $F
FP=$(echo "$F" | field path)
mkfs.ext4 -q -F $FP; say mkfs_rc $?
mkdir -p /tmp/f; mount $FP /tmp/f; say mount_rc $?
head -c $((2*M)) /dev/urandom > f1; cp f1 /tmp/f/f1; sync
say f1_sha_src $(filesha f1)
fio --name=w --filename=/tmp/f/fio.dat --size=12M --bs=4k --rw=randwrite --ioengine=libaio --iodepth=16 --direct=1 --rate_iops=4000,300 --verify=crc32c --verify_fatal=1 --output=fio.out >/dev/null 2>&1 &
FIO=$!
sleep 4
say fio_running_at_kill $(kill -0 $FIO 2>/dev/null && echo 1 || echo 0)
kill -9 $D0
daemon > d1.out 2> d1.err &
D1=$!
ready d1.out; say ready1 $?
say recovered $(call '{"kind":"get_features"}' | field restarts_recovered)
wait $FIO; say fio_rc $?
say fio_errors $(grep -o "err= *[0-9]*" fio.out | tr -dc '0-9 ' | tr ' ' '\n' | grep -v '^$' | sort -u | tr '\n' ,)
say fio_verify_errors $(grep -ci "verify.*fail\|bad magic\|crc32c.*mismatch" fio.out)
say f1_sha_after $(filesha /tmp/f/f1)
umount /tmp/f; say umount_rc $?
e2fsck -fn $FP > fsck.out 2>&1; say fsck_rc $?
tail -3 fsck.out
say fs1_stats $(call '{"kind":"stats","dev_id":"fs1"}')
say list $(call '{"kind":"list"}')
say after_sha $(devsha $P)
say pooled2 $(pooled)
say tagged2 $(tagged $OWNER)
n=0; grep -h '"ublk device pre-created"\|"ublk device started"' d0.err | while read -r l; do n=$((n+1)); say timing$n "$l"; done

# 4. shared read-only device, refcounted
S1=$(call '{"kind":"acquire","access_mode":"shared","share_key":"mem1","target":{"kind":"overlaybd","lowers":["'$W'/l0"]}}')
S2=$(call '{"kind":"acquire","access_mode":"shared","share_key":"mem1","target":{"kind":"overlaybd","lowers":["'$W'/l0"]}}')
say shared1 $S1
say shared2 $S2
SP=$(echo "$S2" | field path)
( exec 3<>$SP ) 2>/dev/null; say shared_rw_open $?
dd if=/dev/zero of=$SP bs=4096 count=1 oflag=direct conv=notrunc 2>/dev/null; say shared_write $?
say shared_sha $(devsha $SP)
say release1 $(call '{"kind":"release","dev_id":"shared.mem1"}' | field refcount)
say release2 $(call '{"kind":"release","dev_id":"shared.mem1"}' | field refcount)
say shared_left $(exists $SP)

# 5. restack of the live device; resize refused
R=$(call '{"kind":"restack_snapshot","dev_id":"sb1","output_layer_path":null,"next_upper":{"data":"'$W'/n.data","index":"'$W'/n.index"}}'); say restack_rc $?
say restacked $R
head -c $M /dev/urandom > w2
dd if=w2 of=$P bs=1M seek=8 oflag=direct conv=notrunc 2>/dev/null; say write2_rc $?
blockdev --flushbufs $P
dd if=w2 of=expect.raw bs=1M seek=8 conv=notrunc 2>/dev/null
say expect2_sha $(filesha expect.raw)
say restacked_sha $(devsha $P)
say new_upper_bytes $(stat -c %s $W/n.data)
say sb1_stats $(call '{"kind":"stats","dev_id":"sb1"}')
call '{"kind":"update_size","dev_id":"sb1","new_size":'$((32*M))'}'; say resize_rc $?
say resize_err $(grep -c "disk.unsupported" call.err)
say size_after $(blockdev --getsize64 $P)

# 6. a kernel device no row names (kill -9 between ADD_DEV and recording its id): the next daemon removes it
O=$(call '{"kind":"create_runtime_device","dev_id":"orph","target":{"kind":"raw","path":"'$W'/base.raw","read_only":true}}')
say orph_created $O
OP=$(echo "$O" | field path)
OID=$(echo $OP | tr -dc '0-9')
say orph_id $OID
kill -9 $D1
wait $D1 2>/dev/null
# the row as that window leaves it: written before ADD_DEV, without the device id
python3 - $W/run/daemon.db <<'PY'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
(st,) = db.execute("SELECT engine_state FROM devices WHERE dev_id = 'orph'").fetchone()
s = json.loads(st)
s.pop("ublk_dev_id")
db.execute("UPDATE devices SET engine_state = ? WHERE dev_id = 'orph'", (json.dumps(s),))
db.commit()
print("@@U orph_row", json.dumps(s))
PY
say orph_kernel_before $($A ublk list | python3 -c 'import json,sys; print(sum(1 for d in json.load(sys.stdin) if d["devId"]==int(sys.argv[1])))' $OID)
daemon > d2.out 2> d2.err &
D2=$!
ready d2.out; say ready2 $?
say swept_log $(grep '"removed ublk devices of this owner that no record names"' d2.err | head -1)
say orph_kernel_after $($A ublk list | python3 -c 'import json,sys; print(sum(1 for d in json.load(sys.stdin) if d["devId"]==int(sys.argv[1])))' $OID)
say orph_char_left $(exists /dev/ublkc$OID)
say list2 $(call '{"kind":"list"}')
say after2_sha $(devsha $P)

# 7. without user recovery: a device stopped from outside is lost (an event to every connection);
#    one whose daemon is killed is removed by the kernel, and the next daemon reports it lost
daemon2 > e0.out 2> e0.err &
E0=$!
ready e0.out; say ready_e0 $?
N1=$(call2 '{"kind":"create_runtime_device","dev_id":"nr1","target":{"kind":"raw","path":"'$W'/base.raw","read_only":true}}')
say nr1_created $N1
N1P=$(echo "$N1" | field path)
N1ID=$(echo $N1P | tr -dc '0-9')
timeout 120 python3 - $W/run2/daemon.sock > ev.out 2>&1 <<'PY' &
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
def read():
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    return json.loads(s.recv(n, socket.MSG_WAITALL))
b = json.dumps({"kind": "get_features", "seq": 1}).encode()
s.sendall(struct.pack(">I", len(b)) + b)
read()
print("connected", flush=True)
while True:
    m = read()
    print(json.dumps(m), flush=True)
    if m.get("kind") == "device_lost":
        break
PY
EV=$!
i=0; while [ $i -lt 600 ] && ! grep -q connected ev.out; do sleep 0.1; i=$((i+1)); done
$A ublk stop $N1ID; say stop_rc $?
wait $EV; say ev_rc $?
say lost_event $(grep device_lost ev.out)
gone /dev/ublkc$N1ID; say nr1_char_gone $?
say list_e0 $(call2 '{"kind":"list"}')
N2=$(call2 '{"kind":"create_runtime_device","dev_id":"nr2","target":{"kind":"raw","path":"'$W'/base.raw","read_only":true}}')
N2P=$(echo "$N2" | field path)
N2ID=$(echo $N2P | tr -dc '0-9')
say nr2_sha $(devsha $N2P)
kill -9 $E0
gone $N2P; say nr2_block_gone $?
daemon2 > e1.out 2> e1.err &
E1=$!
ready e1.out; say ready_e1 $?
say list_e1 $(call2 '{"kind":"list"}')
say nr2_char_left $(exists /dev/ublkc$N2ID)
say shutdown_e $(call2 '{"kind":"shutdown"}' | field kind)
wait $E1; say daemon_e_rc $?

# 8. shutdown removes every device, the pooled ones too
say tagged3 $(tagged $OWNER)
say shutdown $(call '{"kind":"shutdown"}' | field kind)
wait $D2; say daemon_rc $?
say dev_left $(exists $P)
say ublk_list $($A ublk list)
`;

let run: GuestRun;
let v: Map<string, string>;
const val = (k: string): string => {
  const x = v.get(k);
  if (x === undefined) throw new Error(`the guest script printed no ${k}\n${run.console.slice(-4000)}`);
  return x;
};

/** The daemon's log lines about making devices (first daemon), as printed by the script. */
function timings(): Record<string, number | string | boolean>[] {
  return [...v.entries()].filter(([k]) => /^timing\d+$/.test(k)).map(([, l]) => JSON.parse(l.slice(l.indexOf("{"))) as Record<string, number | string | boolean>);
}

beforeAll(async () => {
  run = await runGuestScript({ name: "diskd", script: SCRIPT, vcpus: 2, memoryMiB: 1024, timeoutMs: 600_000 });
  v = guestValues(run.console);
  // debugging aid: UBLK_VM_CONSOLE=<file> keeps the guest's console
  if (process.env.UBLK_VM_CONSOLE) writeFileSync(process.env.UBLK_VM_CONSOLE, run.console);
  if (run.rc !== 0 || !v.has("ublk_list")) console.error(run.console.slice(-6000));
  console.log(`disk daemon ublk VM test: ${run.seconds.toFixed(1)} s in the VM`);
  // what making a device costs, step by step (ms, under TCG): pre-created devices vs a bind vs a fresh create
  for (const t of timings()) {
    const kind = t.msg === "ublk device pre-created" ? "pre-create" : t.pooled ? "bind of a pre-created" : "create";
    const steps = kind === "pre-create" ? ["addMs", "openMs", "threadsMs"] : kind === "create" ? ["addMs", "openMs", "threadsMs", "paramsMs", "fetchMs", "startMs"] : ["paramsMs", "fetchMs", "startMs"];
    console.log(`ublk ${kind} device ${t.devId}: ${steps.map((k) => `${k.slice(0, -2)} ${t[k]}`).join(", ")} ms`);
  }
}, 660_000);

describe("the disk daemon's ublk engine in the guest", () => {
  test("with /dev/ublk-control the daemon serves over ublk by default; its pool holds pre-created ublk devices (added, no block device yet)", () => {
    expect(val("ready0")).toBe("0");
    const f = JSON.parse(val("features"));
    expect(f).toMatchObject({ kind: "features", engines: ["fuse", "ublk"], default_engine: "ublk", ublk_control: true, pooled: { ublk: 1 } });
    expect(val("tagged0")).toBe("1"); // the pre-created device, with the daemon's owner tag
    expect(val("blockdevs0")).toBe("0"); // not started: no /dev/ublkbN yet
  });

  test("an exclusive acquire binds a pre-created device: it has the stack's size and bytes, takes writes, and the pool refills to the high watermark", () => {
    expect(JSON.parse(val("acquired0"))).toMatchObject({ kind: "device_acquired", dev_id: "sb0", engine: "ublk", access: "exclusive", from_pool: true });
    expect(val("sb0_size")).toBe(String(16 * MiB));
    expect(val("sb0_sha")).toBe(val("base_sha"));
    expect(val("sb0_write_rc")).toBe("0");
    expect(val("sb0_written_sha")).toBe(val("sb0_expect_sha"));
    expect(val("pooled1")).toBe("2");
    expect(val("tagged1")).toBe("3"); // sb0 + two pooled
    expect([val("release0"), val("sb0_left")]).toEqual(["0", "0"]);
    // the acquired device is the one the prefill added before any request (ADD_DEV and threads done ahead)
    const ts = timings();
    const pre = ts.filter((t) => t.msg === "ublk device pre-created");
    expect(pre.length).toBe(3); // the prefill, then two refills
    const bound = ts.find((t) => t.msg === "ublk device started" && t.pooled === true)!;
    expect(bound.devId).toBe(pre[0]!.devId);
    expect(JSON.parse(val("acquired0")).path).toBe(`/dev/ublkb${pre[0]!.devId}`);
    expect(ts.indexOf(pre[0]!)).toBeLessThan(ts.indexOf(bound));
    // sb1 and fs1 were made from scratch (create_runtime_device does not take from the pool)
    expect(ts.filter((t) => t.msg === "ublk device started" && t.pooled === false).length).toBe(2);
  });

  test("a stack created directly reads as its layer; a write lands", () => {
    expect(JSON.parse(val("created"))).toMatchObject({ kind: "runtime_device_created", dev_id: "sb1", engine: "ublk", access: "exclusive", refcount: 1 });
    expect(val("path")).toMatch(/^\/dev\/ublkb\d+$/);
    expect(val("dev_sha")).toBe(val("base_sha"));
    expect(val("write_rc")).toBe("0");
    expect(val("written_sha")).toBe(val("expect_sha"));
  });

  test("kill -9 of the daemon while fio writes to ext4 on one of its devices: the next daemon recovers every device, fio verifies, fsck is clean", () => {
    expect(JSON.parse(val("fs_created"))).toMatchObject({ dev_id: "fs1", engine: "ublk" });
    expect([val("mkfs_rc"), val("mount_rc")]).toEqual(["0", "0"]);
    expect(val("fio_running_at_kill")).toBe("1");
    expect(val("ready1")).toBe("0");
    expect(val("recovered")).toBe("2"); // sb1 and fs1; the pooled devices were removed and made again
    expect(val("fio_rc")).toBe("0");
    expect(val("fio_errors")).toBe("0,");
    expect(val("fio_verify_errors")).toBe("0");
    expect(val("f1_sha_after")).toBe(val("f1_sha_src"));
    expect(val("umount_rc")).toBe("0");
    expect(val("fsck_rc")).toBe("0");
    // the recovering daemon served fio's later writes and ext4's flushes (journal commits, the unmount)
    const st = JSON.parse(val("fs1_stats")).stats;
    expect(st.writes).toBeGreaterThan(0);
    expect(st.fsyncs).toBeGreaterThan(0);
    expect(st.errors).toBe(0);
    const list = JSON.parse(val("list"));
    expect(list.devices.map((d: { dev_id: string }) => d.dev_id).sort()).toEqual(["fs1", "sb1"]);
    expect(list.lost).toEqual([]);
    expect(val("after_sha")).toBe(val("expect_sha"));
    // the pool is back at its low watermark: sb1, fs1 and one pre-created device carry the owner tag
    expect(val("pooled2")).toBe("1");
    expect(val("tagged2")).toBe("3");
  });

  test("a shared read-only device is one device, refcounted, gone with its last release", () => {
    const a = JSON.parse(val("shared1"));
    const b = JSON.parse(val("shared2"));
    expect(a).toMatchObject({ kind: "device_acquired", dev_id: "shared.mem1", engine: "ublk", access: "shared", refcount: 1 });
    expect(b).toMatchObject({ dev_id: "shared.mem1", path: a.path, refcount: 2 });
    // guest RAM: QEMU maps it MAP_PRIVATE but opens it O_RDWR; the open works, a write fails
    expect(val("shared_rw_open")).toBe("0");
    expect(val("shared_write")).not.toBe("0");
    expect(val("shared_sha")).toBe(val("base_sha"));
    expect([val("release1"), val("release2")]).toEqual(["1", "0"]);
    expect(val("shared_left")).toBe("0");
  });

  test("restack of a live ublk device seals its upper into a layer; later writes land in the new upper; the server's counters are reported", () => {
    expect(val("restack_rc")).toBe("0");
    expect(JSON.parse(val("restacked"))).toMatchObject({ kind: "restack_snapshot_created", dev_id: "sb1", layer_path: `${W}/u.data`, stats: { layers: 2 } });
    expect(val("write2_rc")).toBe("0");
    expect(val("restacked_sha")).toBe(val("expect2_sha"));
    // the 1 MiB written after the restack is in the new upper (4 KiB header + data)
    expect(Number(val("new_upper_bytes"))).toBeGreaterThanOrEqual(4096 + 1024 * 1024);
    const st = JSON.parse(val("sb1_stats")).stats;
    // counted since the recovering daemon started: the write after the restack, and the reads of the checksums
    expect(st.bytes_written).toBeGreaterThanOrEqual(1024 * 1024);
    expect(st.bytes_read).toBeGreaterThanOrEqual(2 * 16 * 1024 * 1024);
    expect(st.errors).toBe(0);
  });

  test("growing a ublk device is refused with a typed error", () => {
    expect(val("resize_rc")).toBe("1");
    expect(val("resize_err")).toBe("1");
    expect(val("size_after")).toBe(String(16 * 1024 * 1024));
  });

  test("a kernel device its row does not name (kill -9 between ADD_DEV and recording the id) is removed by the next daemon", () => {
    expect(JSON.parse(val("orph_created"))).toMatchObject({ dev_id: "orph", engine: "ublk" });
    expect(JSON.parse(val("orph_row"))).not.toHaveProperty("ublk_dev_id");
    expect(val("orph_kernel_before")).toBe("1");
    expect(val("ready2")).toBe("0");
    const swept = JSON.parse(val("swept_log").slice(val("swept_log").indexOf("{")));
    expect(swept.removed).toEqual([Number(val("orph_id"))]);
    expect(val("orph_kernel_after")).toBe("0");
    expect(val("orph_char_left")).toBe("0");
    // its row could not be recovered (no device id): the device is reported lost; the others are served on
    const list = JSON.parse(val("list2"));
    expect(list.devices.map((d: { dev_id: string }) => d.dev_id).sort()).toEqual(["fs1", "sb1"]);
    expect(list.lost).toEqual([{ dev_id: "orph", engine: "ublk", reason: "not recovered after a daemon restart: device orph has no ublk device id", at: expect.any(Number) }]);
    expect(val("after2_sha")).toBe(val("expect2_sha"));
  });

  test("without user recovery: a device stopped from outside is reported lost to every connection; one whose daemon was killed is gone and the next daemon reports it lost", () => {
    expect(val("ready_e0")).toBe("0");
    expect(JSON.parse(val("nr1_created"))).toMatchObject({ dev_id: "nr1", engine: "ublk" });
    expect([val("stop_rc"), val("ev_rc")]).toEqual(["0", "0"]);
    const ev = JSON.parse(val("lost_event"));
    expect(ev).toEqual({ kind: "device_lost", dev_id: "nr1", engine: "ublk", reason: "its ublk device stopped being served: all tags aborted", at: expect.any(Number) });
    expect(val("nr1_char_gone")).toBe("0"); // the daemon removed what was left (DEL_DEV)
    expect(JSON.parse(val("list_e0"))).toMatchObject({ devices: [], lost: [{ dev_id: "nr1", reason: ev.reason }] });
    expect(val("nr2_sha")).toBe(val("base_sha"));
    expect(val("nr2_block_gone")).toBe("0"); // the kernel removed the block device when its server died
    expect(val("ready_e1")).toBe("0");
    const l = JSON.parse(val("list_e1"));
    expect(l.devices).toEqual([]);
    expect(l.lost).toHaveLength(1);
    expect(l.lost[0]).toMatchObject({ dev_id: "nr2", engine: "ublk" });
    expect(l.lost[0].reason).toStartWith("not recovered after a daemon restart: ");
    expect(val("nr2_char_left")).toBe("0");
    expect([val("shutdown_e"), val("daemon_e_rc")]).toEqual(["ok", "0"]);
  });

  test("shutdown removes every device, the pre-created ones too", () => {
    expect(val("tagged3")).toBe("3"); // sb1, fs1, one pooled
    expect(val("shutdown")).toBe("ok");
    expect(val("daemon_rc")).toBe("0");
    expect(val("dev_left")).toBe("0");
    expect(JSON.parse(val("ublk_list"))).toEqual([]);
  });
});
