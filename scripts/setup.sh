#!/usr/bin/env bash
# Installs what dkit needs to build, test and run from Debian's (or Ubuntu's) packages. Packages already installed
# are left alone; when everything is there it installs nothing and touches no package list.
#
#   scripts/setup.sh                    # everything, Debian's LibTorch 1.13 included
#   scripts/setup.sh --without-torch    # for a LibTorch from elsewhere (the official zip, a PyTorch wheel): leaves
#                                       # out Debian's LibTorch and what goes with it (the Dockerfile's CUDA build)
#   scripts/setup.sh --sanitizers       # also clang and its sanitizer and libFuzzer runtimes, for
#                                       # scripts/sanitize.sh and scripts/fuzz.sh (the two options combine)
set -euo pipefail

packages=(
  cmake g++ make                      # the build
  libspdlog-dev libcxxopts-dev libyaml-cpp-dev
  nlohmann-json3-dev                  # writes the JSON outputs, reads the benchmark's PyTorch results
  zlib1g-dev                          # reads the gzipped IDX files of MNIST and Fashion-MNIST
  libgtest-dev                        # GoogleTest, for the test suite
  iproute2                            # ip netns: the multi-host tests make their two hosts with network namespaces
  libsleef-dev                        # sleef.h, included by LibTorch's AVX2 and AVX-512 vector headers (the fused optimizers)
)
torch_packages=(
  libtorch-dev                        # LibTorch 1.13, CPU only
  libgloo-dev                         # c10d's Gloo backend for multi-process training
  libopenblas0-openmp                 # OpenBLAS (OpenMP flavour, like LibTorch's threads) instead of the reference BLAS
  python3-torch                       # real PyTorch: the interop tests and the Python side of the benchmarks
  python3-protobuf python3-crc32c     # the tests' independent reader of dkit's TensorBoard event files
  gnuplot-nox                         # bench/plot: CSV from dkit bench to PNG charts
)
# Installed where the release has them, left out where it has not: checked against apt's package lists, again after
# an update. None of them is needed to build or to pass the suite; the tests that use one skip without it.
torch_packages_where_available=(
  python3-safetensors                 # Python's safetensors (Debian 13 and later; Debian 12 has none): the tests
                                      # that check Python reads dkit's safetensors files
)
sanitizer_packages=(
  clang                               # the compiler for the sanitized build and the fuzz targets (clang 14 on Debian 12)
  libclang-rt-dev                     # its AddressSanitizer, UBSan and libFuzzer runtimes (libclang-rt-14-dev)
  llvm                                # llvm-symbolizer: function names and lines in sanitizer reports
)
with_torch=1
for option in "$@"; do
  case "$option" in
    --without-torch) with_torch=0 ;;
    --sanitizers) packages+=("${sanitizer_packages[@]}") ;;
    *)
      echo "setup: unknown option '$option' (options: --without-torch, --sanitizers)" >&2
      exit 2
      ;;
  esac
done
if [ "$with_torch" -eq 1 ]; then
  packages+=("${torch_packages[@]}")
fi

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

in_package_lists() {
  apt-cache show --no-all-versions "$1" >/dev/null 2>&1
}

missing=()
for package in "${packages[@]}"; do
  if ! installed "$package"; then
    missing+=("$package")
  fi
done
unlisted=()
if [ "$with_torch" -eq 1 ]; then
  for package in "${torch_packages_where_available[@]}"; do
    if installed "$package"; then
      continue
    elif in_package_lists "$package"; then
      missing+=("$package")
    else
      unlisted+=("$package")
    fi
  done
fi

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages are installed"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
$sudo apt-get update -q
for package in "${unlisted[@]}"; do
  if in_package_lists "$package"; then
    missing+=("$package")
  else
    echo "setup: leaving out $package, which this release does not have"
  fi
done
echo "setup: installing ${missing[*]}"
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
