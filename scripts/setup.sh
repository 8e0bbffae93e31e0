#!/usr/bin/env bash
# Installs what dkit needs to build, test and run from Debian's (or Ubuntu's) packages. Packages already installed
# are left alone; when everything is there it installs nothing and touches no package list.
#
#   scripts/setup.sh                    # everything, Debian's LibTorch 1.13 included
#   scripts/setup.sh --without-torch    # for a LibTorch from elsewhere (the official zip, a PyTorch wheel): leaves
#                                       # out Debian's LibTorch and what goes with it (the Dockerfile's CUDA build)
set -euo pipefail

packages=(
  cmake g++ make                      # the build
  libspdlog-dev libcxxopts-dev libyaml-cpp-dev
  zlib1g-dev                          # reads the gzipped IDX files of MNIST and Fashion-MNIST
  libgtest-dev                        # GoogleTest, for the test suite
)
torch_packages=(
  libtorch-dev                        # LibTorch 1.13, CPU only
  libgloo-dev                         # c10d's Gloo backend for multi-process training
  libopenblas0-openmp                 # OpenBLAS (OpenMP flavour, like LibTorch's threads) instead of the reference BLAS
  python3-torch                       # real PyTorch: the interop tests and the Python side of the benchmarks
  gnuplot-nox                         # bench/plot: CSV from dkit bench to PNG charts
)
case "${1:-}" in
  "") packages+=("${torch_packages[@]}") ;;
  --without-torch) ;;
  *)
    echo "setup: unknown option '$1' (the only option is --without-torch)" >&2
    exit 2
    ;;
esac

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages are installed"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
