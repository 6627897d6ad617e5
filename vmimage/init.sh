#!/bin/sh
# /init of Berth's microVM initramfs (package vmimage, docs/vm-images.md):
# mounts the kernel's file systems, loads the modules a microVM needs
# (/lib/modules/load-order: one file a line, dependencies first), then
# runs the berth agent as init. When the agent cannot be started it says
# why on the console and powers the VM off, so a broken VM never hangs.
export PATH=/bin
umask 022

fail() {
	echo "berth init: $*; powering off" >&2
	poweroff -f
	# poweroff returns only when it failed: init exiting panics the
	# kernel, which reboots with panic=-1 (and QEMU -no-reboot stops).
	exit 1
}

mount -t proc -o nosuid,nodev,noexec proc /proc || fail "cannot mount /proc"
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys || fail "cannot mount /sys"
mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev || fail "cannot mount /dev"
mkdir -p /dev/pts
mount -t devpts -o nosuid,noexec,gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts || fail "cannot mount /dev/pts"

# Module parameters on the kernel command line (module.param=value, as
# QEMU's microvm machine adds virtio_mmio.device=…) go to insmod, as
# modprobe would pass them. A module built into the kernel, or loaded
# already, fails with "File exists": that is fine.
set -f
read -r cmdline </proc/cmdline
while read -r ko; do
	[ -n "$ko" ] || continue
	mod=${ko%.ko}
	params=
	for arg in $cmdline; do
		case $arg in "$mod".*=*) params="$params ${arg#"$mod".}" ;; esac
	done
	if ! out=$(insmod "/lib/modules/$ko" $params 2>&1); then
		case $out in
		*"File exists"*) ;;
		*) echo "berth init: insmod $ko: $out" >&2 ;;
		esac
	fi
done </lib/modules/load-order
set +f

[ -x /berth/berth ] || fail "no agent: /berth/berth is missing or not executable"
# exec replaces this shell; when it cannot (the binary's loader missing,
# a binary for another machine), the shell exits and this trap says so.
trap 'fail "cannot start the agent /berth/berth guest --init (exit status $?)"' EXIT
exec /berth/berth guest --init
