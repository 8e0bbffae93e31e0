#!/usr/bin/env bash
# Prints, one per line, the Debian/Ubuntu packages that own the shared libraries PROGRAM loads (everything ldd
# lists, direct and indirect), so that a runtime image installs what the build linked against, with the same
# providers chosen (OpenBLAS's libblas.so.3 rather than the reference BLAS, say). Libraries under a SKIP_DIR are
# left out: a LibTorch unpacked from a zip, which the image copies whole. Exits 1, naming the library, when one is
# not found or no package owns it. The Dockerfile's runtime stage installs this list.
#
#   scripts/runtime_packages.sh PROGRAM [SKIP_DIR...]
set -euo pipefail

if [ $# -lt 1 ] || [ ! -x "$1" ]; then
  echo "runtime_packages: usage: $0 PROGRAM [SKIP_DIR...] (PROGRAM: an executable file)" >&2
  exit 1
fi
program=$1
shift
skip=()
for dir in "$@"; do
  [ -n "$dir" ] && skip+=("$(readlink -f "$dir")")
done

listing=$(ldd "$program")
missing=$(grep 'not found' <<<"$listing" || true)
if [ -n "$missing" ]; then
  echo "runtime_packages: $program needs libraries the loader cannot find:" >&2
  echo "$missing" >&2
  exit 1
fi

# `name => /path (address)` and the loader's own `/path (address)`; the vDSO has no file.
paths=$(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$listing")

# Candidate names per library: dpkg knows a file by the path its package ships, which on a merged-/usr system can
# be /lib/... or /usr/lib/... whatever ldd printed.
libraries=()
candidates=()
for path in $paths; do
  real=$(readlink -f "$path")
  skipped=0
  for dir in "${skip[@]+"${skip[@]}"}"; do
    case "$real/" in "$dir"/*) skipped=1 ;; esac
    case "$path/" in "$dir"/*) skipped=1 ;; esac
  done
  [ "$skipped" -eq 1 ] && continue
  libraries+=("$path $real ${real#/usr} /usr$path")
  candidates+=("$path" "$real" "${real#/usr}" "/usr$path")
done
[ "${#libraries[@]}" -eq 0 ] && exit 0

# One dpkg-query for all of them: `pkg[:arch][, pkg2...]: /path` per path it knows.
declare -A owners
while IFS= read -r line; do
  file=${line##*: }
  owners[$file]=$(sed -E 's/: \/.*$//; s/, /\n/g' <<<"$line" | sed -E 's/:[a-z0-9_-]+$//')
done < <(dpkg-query -S "${candidates[@]}" 2>/dev/null | grep ': /' | grep -v '^diversion by' || true)

packages=()
for library in "${libraries[@]}"; do
  read -r -a names <<<"$library"
  found=""
  for name in "${names[@]}"; do
    if [ -n "${owners[$name]+x}" ]; then
      found=${owners[$name]}
      break
    fi
  done
  if [ -z "$found" ]; then
    echo "runtime_packages: no installed package owns ${names[0]} (${names[1]}), which $program loads" >&2
    exit 1
  fi
  while IFS= read -r package; do
    packages+=("$package")
  done <<<"$found"
done

printf '%s\n' "${packages[@]}" | sort -u
