/**
 * The disk daemon with its ublk engine, inside a real guest (QEMU microvm/TCG, the guest kernel
 * with ublk + io_uring, booted through the tools drive with the compiled `agentenv`): one VM
 * runs one script (../ublk/guest.ts) that starts `agentenv ublk-daemon` (export "auto": ublk,
 * since /dev/ublk-control exists there) and drives it with `agentenv ublk-daemon --call` (the same
 * protocol the node speaks). Shown: the daemon picks ublk; a sandbox-style stack (layer + created
 * upper) becomes /dev/ublkbN reading as the layer; a write lands; kill -9 of the daemon and a new
 * one recovers the device from its database (user recovery) with the write intact; a shared
 * read-only device is refcounted, opens read-write (as QEMU opens guest RAM) but refuses writes,
 * and goes with its last release; a restack of the live device seals its upper into a layer and
 * writes go on into a new upper; a resize is a typed refusal; shutdown removes every device.
 */
import { beforeAll, describe, expect, test } from "bun:test";
import { daemonSettings, diskConfig } from "../../../src/storage/daemon/index.ts";
import { guestValues, runGuestScript, type GuestRun } from "../ublk/guest.ts";

const W = "/dev/shm/d";
const settings = daemonSettings({ ...diskConfig(), pool: { enabled: false, lowWatermark: 0, highWatermark: 0 } }, `${W}/run`);

const SCRIPT = String.raw`
set -u
W=${W}; mkdir -p $W; cd $W
M=1048576
SET='${JSON.stringify(settings)}'
say() { echo "@@U $*"; }
ready() { i=0; while [ $i -lt 600 ]; do grep -q '^ready' "$1" 2>/dev/null && return 0; sleep 0.1; i=$((i+1)); done; return 1; }
devsha() { dd if=$1 bs=1M iflag=direct 2>/dev/null | sha256sum | cut -c1-64; }
call() { $A ublk-daemon --dir $W/run --settings "$SET" --call "$1" 2>>call.err; }
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p"; }

head -c $((16*M)) /dev/urandom > base.raw
$A image import-raw base.raw l0 >/dev/null
say base_sha $(sha256sum base.raw | cut -c1-64)

$A ublk-daemon --dir $W/run --settings "$SET" > d0.out 2> d0.err &
D0=$!
ready d0.out; say ready0 $?
say features $(call '{"kind":"get_features"}')

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
say expect_sha $(sha256sum expect.raw | cut -c1-64)
say written_sha $(devsha $P)

kill -9 $D0
$A ublk-daemon --dir $W/run --settings "$SET" > d1.out 2> d1.err &
D1=$!
ready d1.out; say ready1 $?
say recovered $(call '{"kind":"get_features"}' | field restarts_recovered)
say list $(call '{"kind":"list"}')
say after_sha $(devsha $P)

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
say shared_left $([ -e "$SP" ] && echo 1 || echo 0)

R=$(call '{"kind":"restack_snapshot","dev_id":"sb1","output_layer_path":null,"next_upper":{"data":"'$W'/n.data","index":"'$W'/n.index"}}'); say restack_rc $?
say restacked $R
head -c $M /dev/urandom > w2
dd if=w2 of=$P bs=1M seek=8 oflag=direct conv=notrunc 2>/dev/null; say write2_rc $?
blockdev --flushbufs $P
dd if=w2 of=expect.raw bs=1M seek=8 conv=notrunc 2>/dev/null
say expect2_sha $(sha256sum expect.raw | cut -c1-64)
say restacked_sha $(devsha $P)
say new_upper_bytes $(stat -c %s $W/n.data)
say sb1_stats $(call '{"kind":"stats","dev_id":"sb1"}')
call '{"kind":"update_size","dev_id":"sb1","new_size":'$((32*M))'}'; say resize_rc $?
say resize_err $(grep -c "disk.unsupported" call.err)
say size_after $(blockdev --getsize64 $P)

say shutdown $(call '{"kind":"shutdown"}' | field kind)
wait $D1; say daemon_rc $?
say dev_left $([ -e "$P" ] && echo 1 || echo 0)
say ublk_list $($A ublk list)
`;

let run: GuestRun;
let v: Map<string, string>;
const val = (k: string): string => {
  const x = v.get(k);
  if (x === undefined) throw new Error(`the guest script printed no ${k}\n${run.console.slice(-4000)}`);
  return x;
};

beforeAll(async () => {
  run = await runGuestScript({ name: "diskd", script: SCRIPT, vcpus: 2, memoryMiB: 1024, timeoutMs: 300_000 });
  v = guestValues(run.console);
  if (run.rc !== 0 || !v.has("ublk_list")) console.error(run.console.slice(-6000));
  console.log(`disk daemon ublk VM test: ${run.seconds.toFixed(1)} s in the VM`);
}, 360_000);

describe("the disk daemon's ublk engine in the guest", () => {
  test("with /dev/ublk-control the daemon serves over ublk by default; a stack reads as its layer", () => {
    expect(val("ready0")).toBe("0");
    const f = JSON.parse(val("features"));
    expect(f).toMatchObject({ kind: "features", engines: ["fuse", "ublk"], default_engine: "ublk", ublk_control: true });
    expect(JSON.parse(val("created"))).toMatchObject({ kind: "runtime_device_created", dev_id: "sb1", engine: "ublk", access: "exclusive", refcount: 1 });
    expect(val("path")).toMatch(/^\/dev\/ublkb\d+$/);
    expect(val("dev_sha")).toBe(val("base_sha"));
  });

  test("a write lands; kill -9 of the daemon and the next one recovers the device with it", () => {
    expect(val("write_rc")).toBe("0");
    expect(val("written_sha")).toBe(val("expect_sha"));
    expect(val("ready1")).toBe("0");
    expect(val("recovered")).toBe("1");
    expect(JSON.parse(val("list")).devices).toEqual([{ dev_id: "sb1", engine: "ublk", path: val("path"), access: "exclusive", refcount: 1 }]);
    expect(val("after_sha")).toBe(val("expect_sha"));
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

  test("growing a ublk device is refused with a typed error; shutdown removes every device", () => {
    expect(val("resize_rc")).toBe("1");
    expect(val("resize_err")).toBe("1");
    expect(val("size_after")).toBe(String(16 * 1024 * 1024));
    expect(val("shutdown")).toBe("ok");
    expect(val("daemon_rc")).toBe("0");
    expect(val("dev_left")).toBe("0");
    expect(JSON.parse(val("ublk_list"))).toEqual([]);
  });
});
