#!/usr/bin/env bash
# Makes a Debian root folder with debootstrap, from the mirror this machine's apt sources name, for building and
# testing dkit against another Debian's packages or timing the README's commands on a machine that has none of them.
#
#   scripts/debian_root.sh SUITE DIR [COMPONENTS]   # e.g. bookworm /tmp/fresh, trixie .cache/roots/trixie main,contrib
#   scripts/debian_root.sh --run DIR COMMAND...     # runs COMMAND as root inside DIR (proc, sys, dev mounted for it,
#                                                   # in a mount namespace of its own)
#
# A DIR that already holds a finished root of the same suite, components and mirror is reused as it is (its marker
# file .dkit-root names them; a root made otherwise is made again). Needs root and debootstrap (apt-get install
# debootstrap).
set -euo pipefail

die() {
  echo "debian_root: $*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap and chroot)"

# The first http(s) mirror of Debian's main archive in apt's sources (deb822 or one-line format).
mirror() {
  local found
  found=$(grep -rhoE '^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)https?://[^[:space:]]+' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
    grep -oE 'https?://[^[:space:]]+' | grep -v -e security -e updates | head -n 1 || true)
  [ -n "$found" ] || die "no Debian mirror in /etc/apt/sources.list{,.d}"
  echo "${found%/}"
}

# Runs a command in the root, in a mount namespace of its own (unshare --mount): the root is bind-mounted on itself
# there, so that its / is a mount point (`ip netns exec`, which the multi-host tests use, remounts / and cannot in a
# chroot whose / is a plain folder), with /proc, /sys and /dev mounted for it. Every mount is private to that
# namespace and goes with it, however the command ends; the machine's own mounts are never touched.
run_in() {
  local dir=$1
  shift
  [ -f "$dir/.dkit-root" ] || die "$dir is not a root made by this script"
  command -v unshare >/dev/null || die "unshare is missing (util-linux)"
  cp -L /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
  unshare --mount --propagation private -- bash "$(realpath "${BASH_SOURCE[0]}")" --run-unshared "$(realpath "$dir")" "$@"
}

# The part of run_in that runs inside the new mount namespace.
run_unshared() {
  local dir=$1
  shift
  mount --bind "$dir" "$dir"
  mount -t proc proc "$dir/proc"
  mount -t sysfs sys "$dir/sys"
  mount --bind /dev "$dir/dev"
  mount -t devpts devpts "$dir/dev/pts"
  mount -t tmpfs shm "$dir/dev/shm"
  exec chroot "$dir" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 TERM="${TERM:-dumb}" CI="${CI:-}" "$@"
}

if [ "${1:-}" = "--run" ]; then
  [ $# -ge 3 ] || die "usage: $0 --run DIR COMMAND..."
  dir=$2
  shift 2
  run_in "$dir" "$@"
  exit $?
fi
if [ "${1:-}" = "--run-unshared" ]; then
  shift
  run_unshared "$@"
fi

[ $# -ge 2 ] || die "usage: $0 SUITE DIR [COMPONENTS] | --run DIR COMMAND..."
suite=$1
dir=$2
components=${3:-main}
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"

url=$(mirror)
if [ -f "$dir/.dkit-root" ]; then
  made=$(cat "$dir/.dkit-root")
  if [ "$made" = "$suite $components $url" ]; then
    echo "debian_root: reusing $dir ($made)"
    exit 0
  fi
  echo "debian_root: $dir was made as '$made', not '$suite $components $url': making it again"
fi
rm -rf "$dir"
mkdir -p "$dir"
echo "debian_root: debootstrap $suite ($components) from $url into $dir"
debootstrap --variant=minbase --components="$components" "$suite" "$dir" "$url" >"$dir.debootstrap.log" 2>&1 ||
  die "debootstrap of $suite failed (see $dir.debootstrap.log)"
# apt in the root reads the same mirror, with the same components, and nothing recommended.
echo "deb $url $suite ${components//,/ }" >"$dir/etc/apt/sources.list"
echo 'APT::Install-Recommends "false";' >"$dir/etc/apt/apt.conf.d/90dkit-no-recommends"
# A mirror that serves a frozen copy of Debian (this workplace's does) has Release files past their Valid-Until date
# for the suites that move (sid); these roots are throwaway build roots, so apt takes them (signatures are still
# checked).
echo 'Acquire::Check-Valid-Until "false";' >"$dir/etc/apt/apt.conf.d/90dkit-frozen-mirror"
# debootstrap writes no /etc/hosts, which every installed Debian has: without it `localhost` does not resolve.
if [ ! -e "$dir/etc/hosts" ]; then
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$dir/etc/hosts"
fi
echo "$suite $components $url" >"$dir/.dkit-root"
rm -f "$dir.debootstrap.log"
echo "debian_root: made $dir"
