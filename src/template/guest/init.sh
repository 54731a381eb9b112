#!/bin/sh
# AgentENV guest init (PID 1), installed as /sbin/aenv-init and started with init=/sbin/aenv-init.
# The kernel has already mounted the root disk (root=/dev/vda) and, when the host passed ip=,
# configured eth0 (CONFIG_IP_PNP). This script mounts the API filesystems, sets the clock from
# aenv.clock=<unix ms>, sets the hostname, starts envd and reaps orphans until envd exits.
# Kernel parameters read here (all optional):
#   aenv.clock=<unix ms>   wall clock at boot, from the host
#   aenv.hostname=<name>   guest hostname (default: agentenv)
#   aenv.envd=0            do not start envd (kernel tests)
#   aenv.run=<base64>      a shell script run after boot (its output goes to the console)
#   aenv.dns=<ip>          nameserver for /etc/resolv.conf (default: the default gateway)
# /opt/aenv/bin last: the static busybox image templates get, for images without these tools
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/aenv/bin
export PATH

# Shell builtins where possible: every exec costs tens of ms under TCG.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
[ -e /dev/null ] || mount -t devtmpfs devtmpfs /dev # DEVTMPFS_MOUNT normally did it already
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs /run
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -o remount,rw / 2>/dev/null
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd

CLOCK=; HOST=agentenv; ENVD=1; RUN=; DNS=
read -r CMDLINE < /proc/cmdline
for w in $CMDLINE; do
  case "$w" in
    aenv.clock=*) CLOCK=${w#aenv.clock=} ;;
    aenv.hostname=*) HOST=${w#aenv.hostname=} ;;
    aenv.envd=*) ENVD=${w#aenv.envd=} ;;
    aenv.run=*) RUN=${w#aenv.run=} ;;
    aenv.dns=*) DNS=${w#aenv.dns=} ;;
  esac
done
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
[ -n "$DNS" ] && echo "nameserver $DNS" > /etc/resolv.conf 2>/dev/null

read -r UP _ < /proc/uptime
read -r KREL < /proc/sys/kernel/osrelease
echo "@@AENV-INIT@@ uptime=$UP kernel=$KREL" > /dev/console

if [ -n "$RUN" ]; then
  echo "$RUN" | base64 -d > /run/aenv-run.sh
  sh /run/aenv-run.sh > /dev/console 2>&1
  echo "@@AENV-RUN-EXIT@@ rc=$?" > /dev/console
fi

if [ "$ENVD" = 1 ] && [ -x /usr/local/bin/agentenv ]; then
  # envd runs as root (it drops to the requested user per process) and logs to the console.
  HOME=/root /usr/local/bin/agentenv envd > /dev/console 2>&1 &
  ENVD_PID=$!
  echo "@@AENV-ENVD-STARTED@@ pid=$ENVD_PID" > /dev/console
  # PID 1 must reap every orphan; `wait` returns when any child exits, so loop until envd is gone.
  while kill -0 "$ENVD_PID" 2>/dev/null; do wait; done
  echo "@@AENV-ENVD-EXITED@@" > /dev/console
fi
sync
# No init system to hand over to: reset directly (QEMU -no-reboot and Firecracker exit on a guest
# reset). Without busybox, PID 1 exiting panics the kernel, and panic=1 resets it too.
command -v busybox >/dev/null && busybox reboot -f
exit 0
