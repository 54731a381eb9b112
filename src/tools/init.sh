#!/bin/busybox sh
# AgentENV guest init (PID 1), `/init` on the read-only tools drive. The kernel mounts the tools
# drive as its root (root=/dev/vda ro init=/init) and, when the host passed ip=, has configured
# eth0 (CONFIG_IP_PNP). Stage 1 mounts the sandbox's root filesystem and pivots into it, keeping
# the tools drive at /.aenv; stage 2 mounts the API filesystems, sets the clock, hostname and
# resolver, starts envd from the tools drive and reaps orphans until envd exits. Nothing here
# needs anything from the root filesystem: every command is the drive's static busybox.
# Kernel parameters read here (all optional):
#   aenv.root=<dev>        the sandbox's root filesystem (default /dev/vdb)
#   aenv.rootfstype=<t>    its type (default ext4)
#   aenv.clock=<unix ms>   wall clock at boot, from the host
#   aenv.hostname=<name>   guest hostname (default: agentenv)
#   aenv.envd=0            do not start envd (kernel tests)
#   aenv.run=<base64>      a shell script run after boot (its output goes to the console)
#   aenv.dns=<ip>          nameserver for /etc/resolv.conf (default: the default gateway)
#   aenv.tmp=keep          leave /tmp as the disk has it (template builds). Otherwise a boot empties
#                          /tmp, as Debian's systemd-tmpfiles does at each boot (`D /tmp`); /tmp is
#                          the root filesystem's own directory, never a tmpfs (as in E2B and any
#                          container image: what a build step writes there is in the template, and
#                          it holds files larger than the guest's memory). A memory restore is no
#                          boot: its /tmp is what the snapshot had.
#   aenv.boot=wait         a boot snapshot's boot (src/sandbox/boot-snapshot.ts): start envd on the
#                          tools drive itself (its /.aenv is a link to its own root) and leave the
#                          root filesystem alone; the host snapshots the VM there, and each VM
#                          restored from it gets its root filesystem from envd running
#                            /.aenv/bin/sh /.aenv/init mount-root <dev> <fstype> <sectors> [<dns>]
#                          (environment AENV_TMP=keep: as aenv.tmp=keep)
#                          which waits until the kernel sees the disk at <sectors> (512 bytes; the
#                          host told it the disk's size), does stage 1 and stage 2 (pivot_root
#                          moves envd and PID 1 into the new root too) and exits 0, or non-zero
#                          with the reason on stderr.
PATH=/bin
export PATH

fail() {
  if [ "$$" = 1 ]; then
    echo "@@AENV-INIT-FAILED@@ $*" > /dev/console
    sync
    reboot -f
  fi
  echo "init: $*" >&2
  exit 1
}

# ---- stage 1: on the tools drive ----
# mount the sandbox's root filesystem $1 ($2: its type) and pivot into it
mount_root() {
  # read-write; a disk the host attached read-only mounts read-only
  mount -t "$2" -o rw "$1" /newroot 2>/dev/null || mount -t "$2" -o ro "$1" /newroot ||
    fail "cannot mount the root filesystem $1 ($2)"
  # an image may lack any of these (a root filesystem with nothing in it still boots); a read-only
  # one must have them
  mkdir -p /newroot/.aenv /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/run /newroot/etc /newroot/root 2>/dev/null
  mount --move /dev /newroot/dev || fail "cannot move /dev"
  mount --move /proc /newroot/proc || fail "cannot move /proc"
  cd /newroot || fail "cannot enter the root filesystem"
  pivot_root . .aenv || fail "pivot_root into $1 failed"
}

# /tmp on the root filesystem: emptied at a boot unless $TMP is keep. A read-only root (a disk the
# host attached read-only) gets a tmpfs there: nothing else could be written.
clean_tmp() {
  [ -L /tmp ] && return
  # the last mount on / is the one in effect; its options start with rw or ro
  ROOTOPTS=
  while read -r _ MNT _ OPTS _; do [ "$MNT" = / ] && ROOTOPTS=$OPTS; done < /proc/mounts
  case "$ROOTOPTS" in
    ro | ro,*)
      mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
      return
      ;;
  esac
  mkdir -p /tmp
  # every entry, dot files too; rm -r does not follow links out of /tmp
  [ "$TMP" != keep ] && rm -rf /tmp/* /tmp/.[!.]* /tmp/..?* 2>/dev/null
  chmod 1777 /tmp
}

# ---- stage 2: in the sandbox's root filesystem, the tools drive at /.aenv ----
# API filesystems, clock ($CLOCK), host name ($HOST), loopback and resolver ($DNS, else the gateway)
setup_root() {
  PATH=/.aenv/bin
  cd /
  mount -t sysfs sysfs /sys
  mkdir -p /dev/pts /dev/shm
  mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
  mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
  clean_tmp
  mkdir -p /sys/fs/cgroup 2>/dev/null
  mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
  [ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd

  [ -n "$CLOCK" ] && date -s "@$((CLOCK / 1000))" >/dev/null 2>&1
  echo "$HOST" > /proc/sys/kernel/hostname
  echo "$HOST" > /etc/hostname 2>/dev/null
  # ip= (kernel IP autoconfig) brings lo up; without it, do it here (IFF_UP is bit 0 of the flags)
  read -r LOFLAGS < /sys/class/net/lo/flags
  case "$LOFLAGS" in *[13579bdf]) ;; *) ip link set lo up 2>/dev/null ;; esac

  # DNS: aenv.dns=<ip>, else the default gateway (the host side of the tap answers or redirects
  # port 53). /proc/net/route holds the gateway as little-endian hex, e.g. 1600FEA9 = 169.254.0.22.
  if [ -z "$DNS" ]; then
    while read -r IF DST GW _; do
      if [ "$DST" = 00000000 ] && [ "$GW" != 00000000 ]; then
        DNS="$((0x${GW#??????})).$((0x$(echo "$GW" | cut -c5-6))).$((0x$(echo "$GW" | cut -c3-4))).$((0x${GW%??????}))"
        break
      fi
    done < /proc/net/route
  fi
  if [ -n "$DNS" ]; then
    # a link to a resolver stub that does not run here (systemd-resolved) would swallow the write
    [ -L /etc/resolv.conf ] && [ ! -e /etc/resolv.conf ] && rm -f /etc/resolv.conf
    echo "nameserver $DNS" > /etc/resolv.conf 2>/dev/null
  fi

  # free page reporting (the host's virtio-balloon) hands back free blocks of 2^9 pages (2 MiB)
  # and more, not only the default pageblocks (4 MiB here): of 256 MiB a process freed, 245 MiB
  # went back to the host instead of 207 (docs/density.md); the balloon driver sets its order when
  # it registers, so it is lowered here, after
  echo 9 > /sys/module/page_reporting/parameters/page_reporting_order 2>/dev/null
}

# what commands see: the image's programs first, then the tools drive's
GUEST_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/.aenv/bin

# envd runs as root (it drops to the requested user per process) and logs to the console. Its
# glibc comes from the tools drive (LD_LIBRARY_PATH, which envd drops before it starts
# anything); its PATH, which commands inherit, ends with the tools drive's programs.
# its settings are the node's [envd] section, on the drive (no config file in the guest);
# envd.env holds its runtime's JavaScriptCore options ([envd] jsc_options: BUN_JSC_<name>=<value>
# lines, no spaces), which envd also drops before it starts anything.
# PID 1 must reap every orphan; `wait` returns when any child exits, so loop until envd is gone.
run_envd() {
  ENVD_JSC=$(cat /.aenv/etc/envd.env 2>/dev/null)
  # shellcheck disable=SC2086 # one word per line of envd.env
  env $ENVD_JSC PATH=$GUEST_PATH HOME=/root LD_LIBRARY_PATH=/.aenv/lib \
    /.aenv/bin/agentenv envd --settings /.aenv/etc/envd.json > /dev/console 2>&1 &
  ENVD_PID=$!
  echo "@@AENV-ENVD-STARTED@@ pid=$ENVD_PID" > /dev/console
  while kill -0 "$ENVD_PID" 2>/dev/null; do wait; done
  echo "@@AENV-ENVD-EXITED@@" > /dev/console
}

CLOCK=; HOST=agentenv; DNS=; TMP=${AENV_TMP:-}

# run by envd in a VM restored from a boot snapshot: stage 1 and 2 on the root filesystem $2
if [ "$1" = mount-root ]; then
  [ "$$" = 1 ] && fail "mount-root is not for PID 1"
  case "$4" in '' | *[!0-9]*) fail "usage: init mount-root <dev> <fstype> <sectors> [<dns>]" ;; esac
  [ -n "$2" ] && [ -n "$3" ] || fail "usage: init mount-root <dev> <fstype> <sectors> [<dns>]"
  # on the tools drive /.aenv is a link to its own root; in a root filesystem, the mount point
  [ -L /.aenv ] || fail "the root filesystem is mounted already"
  DNS=$5
  # the boot snapshot's kernel probed a placeholder disk under this name: its size (the kernel
  # reads the new one on the host's config change, a moment later) and its cached blocks (the
  # first sectors) are not this disk's
  N=0
  until [ "$(blockdev --getsz "$2" 2>/dev/null)" = "$4" ]; do
    N=$((N + 1))
    [ "$N" -gt 500 ] && fail "the kernel sees $2 at $(blockdev --getsz "$2" 2>&1) sectors, not $4"
    usleep 10000
  done
  blockdev --flushbufs "$2" || fail "cannot drop the cached blocks of $2"
  mount_root "$2" "$3"
  setup_root
  read -r UP _ < /proc/uptime
  echo "@@AENV-INIT@@ uptime=$UP mount-root=$2" > /dev/console
  exit 0
fi

mount -t proc proc /proc
[ -e /dev/null ] || mount -t devtmpfs devtmpfs /dev # DEVTMPFS_MOUNT normally did it already
ROOT=/dev/vdb; FSTYPE=ext4; ENVD=1; RUN=; BOOT=
read -r CMDLINE < /proc/cmdline
for w in $CMDLINE; do
  case "$w" in
    aenv.root=*) ROOT=${w#aenv.root=} ;;
    aenv.rootfstype=*) FSTYPE=${w#aenv.rootfstype=} ;;
    aenv.clock=*) CLOCK=${w#aenv.clock=} ;;
    aenv.hostname=*) HOST=${w#aenv.hostname=} ;;
    aenv.envd=*) ENVD=${w#aenv.envd=} ;;
    aenv.run=*) RUN=${w#aenv.run=} ;;
    aenv.dns=*) DNS=${w#aenv.dns=} ;;
    aenv.boot=*) BOOT=${w#aenv.boot=} ;;
    aenv.tmp=*) TMP=${w#aenv.tmp=} ;;
  esac
done

if [ "$BOOT" = wait ]; then
  read -r UP _ < /proc/uptime
  echo "@@AENV-BOOT-WAIT@@ uptime=$UP" > /dev/console
  # the drive's programs before and after mount-root's pivot (/bin is then the image's)
  PATH=/.aenv/bin
  run_envd
  sync
  reboot -f
fi

mount_root "$ROOT" "$FSTYPE"
setup_root

read -r UP _ < /proc/uptime
read -r KREL < /proc/sys/kernel/osrelease
echo "@@AENV-INIT@@ uptime=$UP kernel=$KREL" > /dev/console

if [ -n "$RUN" ]; then
  echo "$RUN" | base64 -d > /run/aenv-run.sh
  PATH=$GUEST_PATH /.aenv/bin/sh /run/aenv-run.sh > /dev/console 2>&1
  echo "@@AENV-RUN-EXIT@@ rc=$?" > /dev/console
fi

[ "$ENVD" = 1 ] && run_envd
sync
# No init system to hand over to: reset directly (QEMU -no-reboot and Firecracker exit on a guest
# reset; the driver's reboot=t/k picks how).
reboot -f
