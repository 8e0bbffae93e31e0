#!/usr/bin/env bash
# Installs what dkit needs to build, test and run from Debian's (or Ubuntu's) packages. Packages already installed
# are left alone; when everything is there it installs nothing and touches no package list.
set -euo pipefail

packages=(
  cmake g++ make                      # the build
  libtorch-dev                        # LibTorch 1.13, CPU only
  libgloo-dev                         # c10d's Gloo backend for multi-process training
  libspdlog-dev libcxxopts-dev libyaml-cpp-dev
  libgtest-dev                        # GoogleTest, for the test suite
  libopenblas0-openmp                 # OpenBLAS (OpenMP flavour, like LibTorch's threads) instead of the reference BLAS
  python3-torch                       # real PyTorch: the interop tests and the Python side of the benchmarks
  gnuplot-nox                         # bench/plot: CSV from dkit bench to PNG charts
)

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
