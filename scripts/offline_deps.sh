#!/usr/bin/env bash
# Builds dkit on a machine without a package manager or registry (the GPU machine that is sometimes lent: PyTorch
# with its LibTorch, CMake, a compiler and ninja, nothing else), from Debian packages downloaded elsewhere.
#
#   scripts/offline_deps.sh download DIR           # here (Debian): apt-get download of exactly the packages the build
#                                                  # needs besides LibTorch (spdlog, fmt, cxxopts, yaml-cpp,
#                                                  # nlohmann-json, zlib, GoogleTest) and the libraries they load,
#                                                  # into DIR
#   scripts/offline_deps.sh build DIR [BUILD]      # there: unpack DIR's packages with dpkg -x into DIR/prefix and
#                                                  # configure and build dkit into BUILD (default build-offline)
#                                                  # against the LibTorch of python3's torch
#
# The build step finds LibTorch through `python3 -c 'import torch; print(torch.utils.cmake_prefix_path)'` (set
# PYTHON for another interpreter) and passes CMake options from DKIT_CMAKE_ARGS. It uses ninja when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
  echo "offline_deps: $*" >&2
  exit 1
}

# The -dev packages the build needs besides LibTorch: scripts/setup.sh's list less the toolchain and LibTorch.
dev_packages=(libspdlog-dev libcxxopts-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev libgtest-dev)
# What every machine with a C++ toolchain has, and what the -dev packages pull in only for other uses.
base='^(<.*>|libc6.*|libc-dev-bin|linux-libc-dev|gcc-.*|libgcc-s1|libstdc\+\+.*|libcrypt.*|libnsl.*|libtirpc.*|rpcsvc-proto|libssl.*|libk5crypto3|libkrb5.*|libgssapi-krb5-2|libkeyutils1|libcom-err2|catch2)$'

download() {
  local dir=$1
  command -v apt-get >/dev/null || die "download runs on Debian or Ubuntu (apt-get)"
  mkdir -p "$dir"
  local packages
  packages=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
               --no-enhances "${dev_packages[@]}" | grep -v '^ ' | sort -u | grep -vE "$base" || true)
  [ -n "$packages" ] || die "apt-cache knows none of ${dev_packages[*]}: run apt-get update first"
  echo "offline_deps: downloading $(echo $packages | wc -w) packages into $dir: $(echo $packages)"
  (cd "$dir" && apt-get download $packages)
  echo "offline_deps: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1); carry $dir to the build machine"
}

build() {
  local dir=$1 out=${2:-build-offline}
  ls "$dir"/*.deb >/dev/null 2>&1 || die "no .deb files in $dir: run 'scripts/offline_deps.sh download $dir' first"
  local prefix
  prefix=$(cd "$dir" && pwd)/prefix
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for deb in "$dir"/*.deb; do
    dpkg-deb -x "$deb" "$prefix" 2>/dev/null || dpkg -x "$deb" "$prefix" || die "cannot unpack $deb"
  done
  local python=${PYTHON:-python3}
  local torch_prefix
  torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)') ||
    die "$python cannot import torch: set PYTHON to an interpreter that has PyTorch"
  local multiarch
  multiarch=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  echo "offline_deps: LibTorch from $torch_prefix; Debian packages unpacked in $prefix"
  # The unpacked packages' libraries are found at build time through the prefix; the programs find them at run time
  # through their RUNPATH (CMake adds the folders of the libraries it links).
  cmake -S . -B "$out" "${generator[@]}" \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$prefix/usr;$prefix/usr/lib/$multiarch/cmake" \
    -DCMAKE_INCLUDE_PATH="$prefix/usr/include" \
    -DCMAKE_LIBRARY_PATH="$prefix/usr/lib/$multiarch" \
    -DZLIB_ROOT="$prefix/usr" \
    ${DKIT_CMAKE_ARGS:-}
  cmake --build "$out" --parallel "$(nproc)"
  echo "offline_deps: built into $out; run the tests with: ctest --test-dir $out --output-on-failure"
}

case ${1:-} in
  download) [ $# -eq 2 ] || die "usage: $0 download DIR"; download "$2" ;;
  build) [ $# -ge 2 ] || die "usage: $0 build DIR [BUILD]"; build "$2" "${3:-build-offline}" ;;
  *) die "usage: $0 download DIR | build DIR [BUILD]" ;;
esac
