#!/usr/bin/env bash
# Builds the Dockerfile's CPU variant for real and runs it, with no image registry:
#   1. starts dockerd when none answers (and stops it again at the end);
#   2. makes the Debian base images the CPU variant names (debian:bookworm, debian:bookworm-slim) with debootstrap
#      from the mirror the machine's apt sources name, and `docker import` (scripts/debian_root.sh; the root is cached
#      in .cache/images);
#   3. builds the image with BuildKit (its build stage builds dkit and runs the whole test suite);
#   4. runs `dkit train` in a container on the mounted configs/digits.yaml and checks the run's summary.json;
#   5. prints each image's size and the build's time.
#
#   scripts/check_docker.sh            # needs root (debootstrap) and Debian's docker.io (dockerd, BuildKit)
#
# DOCKER names the docker client (default: Debian's /usr/bin/docker when present, which has BuildKit built in).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=$(pwd)/.cache/images
image=dkit-cpu

say() {
  echo "check_docker: $*"
}
die() {
  say "$*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, dockerd)"
if [ -z "${DOCKER:-}" ]; then
  DOCKER=docker
  [ -x /usr/bin/docker ] && DOCKER=/usr/bin/docker
fi
command -v "$DOCKER" >/dev/null || die "no docker client: apt-get install docker.io"
mkdir -p "$cache"

started_dockerd=""
stop_dockerd() {
  if [ -n "$started_dockerd" ]; then
    kill "$started_dockerd" 2>/dev/null || true
    wait "$started_dockerd" 2>/dev/null || true
  fi
}
trap stop_dockerd EXIT
if ! "$DOCKER" info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || die "no Docker engine: apt-get install docker.io"
  say "starting dockerd (log: $cache/dockerd.log)"
  dockerd >"$cache/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 1 120); do
    "$DOCKER" info >/dev/null 2>&1 && break
    kill -0 "$started_dockerd" 2>/dev/null || die "dockerd stopped at start: see $cache/dockerd.log"
    sleep 0.5
  done
  "$DOCKER" info >/dev/null 2>&1 || die "dockerd does not answer: see $cache/dockerd.log"
fi

# The base images, made locally. Both are Debian 12 minbase roots; the -slim one also leaves out documentation.
for base in debian:bookworm debian:bookworm-slim; do
  if "$DOCKER" image inspect "$base" >/dev/null 2>&1; then
    say "$base: present"
    continue
  fi
  bash scripts/debian_root.sh bookworm "$cache/bookworm" main
  excludes=(--exclude=./.dkit-root --exclude=./src)
  [ "$base" = debian:bookworm-slim ] && excludes+=(--exclude=./usr/share/doc/* --exclude=./usr/share/man/* --exclude=./usr/share/info/*)
  say "$base: importing $cache/bookworm"
  tar -C "$cache/bookworm" "${excludes[@]}" -c . | "$DOCKER" import - "$base" >/dev/null
done

say "building $image (DKIT_VARIANT=cpu; the build stage runs the whole test suite)"
start=$SECONDS
DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain -t "$image" --build-arg DKIT_VARIANT=cpu . >"$cache/build.log" 2>&1 ||
  { tail -n 40 "$cache/build.log"; die "the image did not build: see $cache/build.log"; }
build_seconds=$((SECONDS - start))
grep -E '[0-9]+% tests passed' "$cache/build.log" | tail -n 1 | sed 's/^/check_docker: build stage: /' || true

runs=$(mktemp -d)
trap 'stop_dockerd; rm -rf "$runs"' EXIT
say "dkit train in a container, on the mounted configs/digits.yaml"
"$DOCKER" run --rm --user "$(id -u):$(id -g)" -v "$(pwd)/configs:/configs:ro" -v "$runs:/runs" "$image" \
  train --config /configs/digits.yaml --out /runs/digits --no-progress >"$cache/run.log" 2>&1 ||
  { tail -n 20 "$cache/run.log"; die "dkit train failed in the container: see $cache/run.log"; }
[ -f "$runs/digits/summary.json" ] || die "the run wrote no summary.json"
accuracy=$(sed -nE 's/.*"val_accuracy":([0-9.eE+-]+).*/\1/p' "$runs/digits/summary.json")
steps=$(sed -nE 's/.*"steps":([0-9]+).*/\1/p' "$runs/digits/summary.json")
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.97) }' ||
  die "summary.json: val_accuracy ${accuracy:-missing}, expected at least 0.97"
say "summary.json: $steps steps, val_accuracy $accuracy"

size() {
  "$DOCKER" image inspect -f '{{.Size}}' "$1" | awk '{ printf "%.0f MB", $1 / 1e6 }'
}
say "image $image: $(size "$image"); bases: debian:bookworm $(size debian:bookworm), debian:bookworm-slim $(size debian:bookworm-slim)"
say "built in $build_seconds s; passed"
