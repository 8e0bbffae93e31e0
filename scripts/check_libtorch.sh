#!/usr/bin/env bash
# Builds dkit against the LibTorch of other Debian releases, each in a Debian root made with debootstrap from the
# mirror this machine's apt sources name (scripts/debian_root.sh), cached in .cache/roots (or $DKIT_ROOTS_DIR: CI
# keeps them in /var/cache/dkit/roots). A cached root is brought up to date (apt-get dist-upgrade) and gets what
# scripts/setup.sh lists and a new copy of the source; each build starts from an empty folder, and compiles through
# a compiler cache (ccache) kept in the root, which gives back the objects of sources compiled before unchanged.
#
#   scripts/check_libtorch.sh TARGET...             # TARGET: cuda, stable, newest or all
#   scripts/check_libtorch.sh --prepare TARGET...   # only makes the roots and installs their packages (CI runs
#                                                   # it while it builds; unpacking takes CPU too), so that a later
#                                                   # run of the same targets goes straight to building
#
#   stable  Debian 13 (trixie): its CPU LibTorch 2.6 (libtorch-dev); builds dkit as a shared library
#           (BUILD_SHARED_LIBS=ON, where the other builds make the static default) and runs the whole suite, the
#           outside projects built against the installed libdkit.so, with trixie's PyTorch 2.6 for the Python
#           interop tests.
#   newest  Debian unstable (sid): the newest LibTorch Debian has (C++20 from 2.13 on); builds and runs the whole
#           suite with sid's PyTorch. Sid moves: when its packages cannot be installed at the moment, the target
#           says "unavailable", not "failed", and does not fail the run.
#   cuda    Debian 13 with its CUDA build of LibTorch 2.6 (libtorch-cuda-dev, contrib), CUDA 12.4 (nvidia-cuda-
#           toolkit, non-free), NCCL and Gloo for CUDA: compiles and links everything with CUDA, NCCL and
#           DataParallel on, and lists the CUDA-gated sources it compiled. A compile-and-link check only: cuDNN
#           stays absent (Debian's nvidia-cudnn downloads it from NVIDIA when it is installed, which cannot work
#           without the internet), so the link leaves libtorch_cuda.so's cuDNN symbols unresolved, and nothing
#           runs (there is no GPU here either).
#   all     the three.
#
# Ends with one line per target: passed, failed or unavailable, with the LibTorch version. Exit status 0 when no
# target failed. Needs root and debootstrap (apt-get install debootstrap).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
roots=${DKIT_ROOTS_DIR:-$(pwd)/.cache/roots}
jobs=${DKIT_JOBS:-$(nproc)}

usage() {
  echo "usage: scripts/check_libtorch.sh [--prepare] cuda|stable|newest|all..." >&2
  exit 2
}
prepare_only=0
if [ "${1:-}" = "--prepare" ]; then
  prepare_only=1
  shift
fi
[ $# -ge 1 ] || usage
targets=()
for target in "$@"; do
  case $target in
    all) targets+=(cuda stable newest) ;;
    cuda | stable | newest) targets+=("$target") ;;
    *) usage ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "check_libtorch: needs root (debootstrap, chroot)" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null; then
  apt-get install -y -q debootstrap >/dev/null || { echo "check_libtorch: cannot install debootstrap" >&2; exit 1; }
fi
mkdir -p "$roots"
# One check at a time per roots folder (CI's keeps its roots between runs): a second waits for the first, and for any
# apt the first left running in a root.
exec 9>"$roots/.lock"
if ! flock -n 9; then
  echo "check_libtorch: waiting for the check that holds $roots/.lock"
  flock 9
fi

say() {
  echo "check_libtorch: $*"
}

in_root() {
  local root=$1
  shift
  bash scripts/debian_root.sh --run "$root" "$@"
}

# Copies the working tree (tracked files and the untracked ones git does not ignore) into the root's /src.
copy_source() {
  rm -rf "$1/src"
  mkdir -p "$1/src"
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -C "$1/src" -xf -
}

# Debian's nvidia-cudnn downloads cuDNN from NVIDIA in its postinst, which fails without the internet and leaves
# the package unconfigured: its postinst is replaced with a no-op, and the rest is configured.
readonly skip_cudnn_download='f=/var/lib/dpkg/info/nvidia-cudnn.postinst; if [ -f $f ] && ! dpkg -s nvidia-cudnn 2>/dev/null | grep -q "^Status: install ok installed"; then printf "#!/bin/sh\nexit 0\n" >$f; dpkg --configure -a; fi'

# A compiler cache in each root, kept with it (in /root/.cache/ccache): the build runs through it when it is there
# (scripts/libtorch_build.sh), so that a later run of unchanged sources in the same root compiles only what changed.
# The precompiled header needs the sloppiness below (ccache's manual, "Precompiled headers").
readonly ccache='apt-get install -y -q ccache &&
  printf "max_size = 1G\nsloppiness = pch_defines,time_macros\n" >/etc/ccache.conf'

# The packages each target installs: scripts/setup.sh's (one list for every build), plus the CUDA ones for cuda,
# after the root's own packages are brought up to date (a cached root was made in an earlier run; for cuda a failed
# upgrade is left to the repair that follows, as nvidia-cudnn's download fails in any upgrade of it). The caller
# runs apt-get update before and apt-get clean after (downloaded packages would stay in a cached root).
install_command() {
  case $1 in
    cuda)
      echo "{ apt-get dist-upgrade -y -q || true; } && \
            ./scripts/setup.sh --without-torch && { apt-get install -y -q libtorch-cuda-dev nvidia-cuda-toolkit \
            libnccl-dev libgloo-cuda-dev || true; } && $skip_cudnn_download && \
            apt-get install -y -q -f && dpkg -s libtorch-cuda-dev >/dev/null && $ccache"
      ;;
    *) echo "apt-get dist-upgrade -y -q && ./scripts/setup.sh && $ccache" ;;
  esac
}

results=()
failed=0

record() {
  results+=("$(printf '%-7s %-12s %s' "$1" "$2" "$3")")
  [ "$2" = failed ] && failed=1
  return 0
}

for target in "${targets[@]}"; do
  start=$SECONDS
  case $target in
    stable) suite=trixie components=main torch_package=libtorch-dev ;;
    newest) suite=sid components=main torch_package=libtorch-dev ;;
    cuda) suite=trixie components=main,contrib,non-free torch_package=libtorch-cuda-dev ;;
  esac
  root=$roots/$target
  log=$roots/$target.log
  : >"$log"
  say "$target: Debian $suite ($components) in $root; log $log"
  if ! bash scripts/debian_root.sh "$suite" "$root" "$components" >>"$log" 2>&1; then
    tail -n 5 "$log" | sed 's/^/  | /'
    if [ "$target" = newest ]; then
      record "$target" unavailable "(could not make a Debian $suite root now: not a build or test failure)"
    else
      record "$target" failed "(could not make a Debian $suite root: see $log)"
    fi
    continue
  fi
  copy_source "$root"
  say "$target: installing the packages"
  install="apt-get update -q && $(install_command "$target") && apt-get clean"
  if ! in_root "$root" bash -c "export DEBIAN_FRONTEND=noninteractive; cd /src && $install" >>"$log" 2>&1; then
    tail -n 15 "$log" | sed 's/^/  | /'
    if [ "$target" = newest ]; then
      say "$target: Debian $suite's packages cannot be installed at the moment: not a build or test failure"
      record "$target" unavailable "(Debian $suite's packages cannot be installed now: see $log)"
    else
      record "$target" failed "(the packages could not be installed: see $log)"
    fi
    continue
  fi
  version=$(in_root "$root" dpkg-query -W -f='${Version}' "$torch_package" | sed -E 's/^[0-9]+://; s/[-+~].*//')
  if [ "$prepare_only" -eq 1 ]; then
    record "$target" prepared "LibTorch $version ($((SECONDS - start)) s)"
    continue
  fi
  say "$target: LibTorch $version ($torch_package), g++ $(in_root "$root" g++ -dumpfullversion)"
  mode=full
  [ "$target" = cuda ] && mode=cuda
  [ "$target" = stable ] && mode=shared
  rm -rf "$root/build" "$root/build.build.log"
  if in_root "$root" bash /src/scripts/libtorch_build.sh "$mode" /src /build "$jobs" 2>&1 | tee -a "$log" |
      grep -E --line-buffered '^(libtorch_build|test_shards|-- dkit:|[0-9]+% tests passed|The following tests|CMake Error|\[  FAILED  \])|^\s+[0-9]+ - .*\((Failed|Timeout|Not Run|SEGFAULT|Subprocess aborted)\)|error:'; [ "${PIPESTATUS[0]}" -eq 0 ]; then
    record "$target" passed "LibTorch $version ($((SECONDS - start)) s)"
  else
    record "$target" failed "LibTorch $version ($((SECONDS - start)) s; log: $log)"
  fi
done

echo
for line in "${results[@]}"; do
  say "$line"
done
exit $failed
