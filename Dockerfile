# dkit in a container. The build stage compiles dkit and runs its whole test suite; the runtime stage holds only
# the `dkit` command and the libraries it loads, and runs as a non-root user.
#
#   docker build -t dkit .                                    # CUDA: LibTorch 2.8 for CUDA 12.8, Ubuntu 24.04
#   docker build -t dkit-cpu --build-arg DKIT_VARIANT=cpu .   # CPU only: Debian 12 and Debian's LibTorch 1.13
#   docker run --rm --gpus all dkit devices                   # --gpus needs the NVIDIA Container Toolkit
#
# docs/building.md explains more. Each variant has its own build-* and runtime-* stages, picked by DKIT_VARIANT;
# BuildKit (Docker's default builder since 23.0) builds only the stages the chosen variant uses.
# scripts/check_dockerfile.sh checks this file against the README and the CMake install (CTest: docker.*).
# scripts/check_docker.sh builds the CPU variant for real and runs it, with base images made locally (no registry).

ARG DKIT_VARIANT=cuda
ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=24.04

# ---- Build environment, CUDA: NVIDIA's CUDA + cuDNN development image and the official LibTorch for that CUDA.
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-ubuntu${UBUNTU_VERSION} AS build-cuda
# LibTorch comes from the official C++ zip rather than from pip's torch wheel. The zip is one folder (headers, CMake
# package, libraries and the CUDA libraries they were built with) that needs no Python, so the runtime stage copies
# that one folder; a wheel would bring Python, pip and some twenty nvidia-* wheels spread over site-packages into
# both stages. It must have the C++11 ABI, the ABI of Ubuntu's spdlog and yaml-cpp (older releases offered it as
# separate "cxx11-abi" zips); the step after the download checks. Keep its +cuXYZ in step with CUDA_VERSION.
ARG LIBTORCH_URL=https://download.pytorch.org/libtorch/cu128/libtorch-shared-with-deps-2.8.0%2Bcu128.zip
COPY scripts/setup.sh /tmp/dkit/setup.sh
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ca-certificates curl unzip \
 && /tmp/dkit/setup.sh --without-torch \
 && curl -fsSL --retry 3 -o /tmp/libtorch.zip "$LIBTORCH_URL" \
 && unzip -q /tmp/libtorch.zip -d /opt \
 && rm -rf /tmp/libtorch.zip /tmp/dkit /var/lib/apt/lists/*
RUN if grep -q -e '_GLIBCXX_USE_CXX11_ABI=0' /opt/libtorch/share/cmake/Torch/TorchConfig.cmake; then \
      echo "LIBTORCH_URL: $LIBTORCH_URL has the old C++ ABI; dkit needs a C++11-ABI LibTorch" >&2; exit 1; \
    fi
# CMake reads CMAKE_PREFIX_PATH from the environment too, so the README's cmake commands below find this LibTorch.
ENV CMAKE_PREFIX_PATH=/opt/libtorch
# Folders the runtime stage copies whole, rather than installing their owners' packages.
ENV DKIT_RUNTIME_DIRS=/opt/libtorch/lib

# ---- Build environment, CPU only: Debian with Debian's LibTorch 1.13, set up as on a developer's machine.
FROM debian:bookworm AS build-cpu
COPY scripts/setup.sh /tmp/dkit/setup.sh
RUN /tmp/dkit/setup.sh && rm -rf /tmp/dkit /var/lib/apt/lists/*
ENV DKIT_RUNTIME_DIRS=

# ---- Build and test, the same for both variants.
FROM build-${DKIT_VARIANT} AS build
# Built and tested as an ordinary user, as on a developer's machine: tests of file permissions mean nothing as root.
RUN useradd --create-home --shell /bin/bash builder \
 && install -d -o builder -g builder /home/builder/dkit /stage
USER builder
WORKDIR /home/builder/dkit
COPY --chown=builder:builder . .
# The README's test command, less scripts/setup.sh (run above); docker.static_check keeps the two the same.
RUN cmake -S . -B build && cmake --build build --parallel "$(nproc)" && ctest --test-dir build --output-on-failure --parallel "$(nproc)"
# /stage is what the runtime image gets: the installed program, the list of the packages that own the libraries it
# loads (scripts/runtime_packages.sh), the DKIT_RUNTIME_DIRS folders, and the example data.
RUN cmake --install build --prefix /stage/usr/local --component dkit_runtime \
 && mkdir -p /stage/usr/local/share/dkit \
 && scripts/runtime_packages.sh /stage/usr/local/bin/dkit $DKIT_RUNTIME_DIRS >/stage/usr/local/share/dkit/runtime-packages.txt \
 && for dir in $DKIT_RUNTIME_DIRS; do mkdir -p "/stage$(dirname "$dir")" && cp -a "$dir" "/stage$dir"; done \
 && cp -a data /stage/usr/local/share/dkit/data

# ---- Runtime bases: NVIDIA's CUDA + cuDNN runtime image (no compiler, no headers), or Debian slim.
FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-ubuntu${UBUNTU_VERSION} AS runtime-cuda
FROM debian:bookworm-slim AS runtime-cpu

# ---- The image: the runtime base, dkit, the packages it loads, a non-root user. /data is the example data, so
# that configs/digits.yaml mounted at /configs finds its `../data/digits.csv`.
FROM runtime-${DKIT_VARIANT} AS runtime
COPY --from=build /stage/ /
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      $(cat /usr/local/share/dkit/runtime-packages.txt) \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 --shell /bin/bash dkit \
 && ln -s /usr/local/share/dkit/data /data \
 && dkit --version
USER dkit
WORKDIR /home/dkit
ENTRYPOINT ["dkit"]
CMD ["--help"]
