#!/usr/bin/env bash
# Checks the Dockerfile without a Docker engine (CI has none). Prints what it checked and exits 0, or names every
# rule broken and exits 1.
#
#   scripts/check_dockerfile.sh [--dockerfile FILE] [--readme FILE] [BUILD_DIR]
#
# FILE defaults: the repository's Dockerfile and README.md. BUILD_DIR (default build) is a configured build tree of
# this repository. The build context is the repository root, filtered by its .dockerignore.
#
# Reading the Dockerfile: a line ending in a backslash continues on the next; lines starting with # are comments
# (also inside a continued instruction, as Docker has it); runs of blanks count as one space. Heredocs and a
# changed escape character are not understood.
#
# 1. COPY sources. Every source of a COPY or ADD instruction that has no --from= (those copy between stages)
#    exists in the build context (globs allowed), and neither it nor a folder above it matches a .dockerignore
#    pattern (matched as shell globs; `!` exceptions and `**` patterns are not interpreted). A source with a
#    variable in it cannot be checked and is an error; an ADD source that is a URL is not checked.
# 2. Build commands. README.md's test command is its first line starting with `./scripts/setup.sh ` that runs
#    ctest (the line .ci/run runs). The Dockerfile's commands are those of its shell-form RUN instructions. Both
#    are split into commands at `&&`, `||` and `;`. A configure/build/test command is one whose first word is
#    `ctest`, or is `cmake` with a second word other than --install, -E and -P. The Dockerfile's
#    configure/build/test commands must be the README's, the same text, the same number, in the same order.
# 3. ENTRYPOINT. The final stage (after the last FROM) has an ENTRYPOINT in exec form (a JSON array), and its
#    program, by base name, is one that `cmake --install` installs: named by `TYPE EXECUTABLE FILES "..."` in
#    BUILD_DIR's cmake_install.cmake files (BUILD_DIR's own and those of the folders right under it).
# 4. User. The final stage's last USER instruction names a user other than root and 0: the image does not run as
#    root.
# 5. Shell syntax. Every shell-form RUN instruction parses with `sh -n` (Docker runs them with /bin/sh -c).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dockerfile=$root/Dockerfile
readme=$root/README.md
build=$root/build
while [ $# -gt 0 ]; do
  case "$1" in
    --dockerfile) dockerfile=$2; shift 2 ;;
    --readme) readme=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "check_dockerfile: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done

errors=0
fail() {
  echo "check_dockerfile: $*" >&2
  errors=$((errors + 1))
}
for file in "$dockerfile" "$readme"; do
  if [ ! -f "$file" ]; then
    echo "check_dockerfile: no such file: $file" >&2
    exit 1
  fi
done

# One instruction per line: continuations joined, comments and empty lines dropped, blanks squeezed.
instructions=$(awk '
  { sub(/\r$/, "") }
  /^[ \t]*#/ { next }
  {
    if (continued) { text = text " " $0 } else if ($0 ~ /^[ \t]*$/) { next } else { text = $0 }
    continued = sub(/\\[ \t]*$/, "", text)
    if (!continued) { print text; text = "" }
  }
  END { if (text != "") print text }
' "$dockerfile" | sed -E 's/[[:space:]]+/ /g; s/^ //; s/ $//')

keyword() { awk '{ print toupper($1) }' <<<"$1"; }
arguments() { sed -E 's/^[^ ]+ ?//' <<<"$1"; }

# Splits shell text into commands at &&, || and ;, one per line, trimmed.
split_commands() {
  sed -E 's/&&|\|\||;/\n/g' | sed -E 's/^ +//; s/ +$//' | sed '/^$/d'
}
indent() { sed 's/^/    /'; }
# Keeps the configure/build/test commands (rule 2).
build_commands() {
  awk '$1 == "ctest" || ($1 == "cmake" && $2 != "--install" && $2 != "-E" && $2 != "-P")'
}

# ---- 1. COPY sources
ignore_patterns=()
if [ -f "$root/.dockerignore" ]; then
  while IFS= read -r pattern; do
    pattern=$(sed -E 's/^[[:space:]]+//; s/[[:space:]]+$//; s#^\./##; s#^/##; s#/$##' <<<"$pattern")
    case "$pattern" in "" | "#"* | "!"* | *"**"*) continue ;; esac
    ignore_patterns+=("$pattern")
  done <"$root/.dockerignore"
fi
copies=0
while IFS= read -r instruction; do
  case "$(keyword "$instruction")" in COPY | ADD) ;; *) continue ;; esac
  kind=$(keyword "$instruction")
  args=$(arguments "$instruction")
  if [[ $args == *"["* ]]; then # exec form: ["src", ..., "dest"]
    args=$(sed -E 's/[][",]/ /g; s/ +/ /g; s/^ //; s/ $//' <<<"$args")
  fi
  read -r -a words <<<"$args"
  paths=()
  from_stage=0
  for word in "${words[@]}"; do
    case "$word" in
      --from=*) from_stage=1 ;;
      --*) ;;
      *) paths+=("$word") ;;
    esac
  done
  [ "$from_stage" -eq 1 ] && continue
  if [ "${#paths[@]}" -lt 2 ]; then
    fail "$kind needs a source and a destination: '$instruction'"
    continue
  fi
  for source in "${paths[@]:0:${#paths[@]}-1}"; do
    copies=$((copies + 1))
    if [[ $kind == ADD && $source == *://* ]]; then
      continue
    fi
    if [[ $source == *'$'* ]]; then
      fail "$kind source '$source' uses a variable, which this check cannot follow"
      continue
    fi
    relative=$(sed -E 's#^(\./)+##; s#^/+##' <<<"$source")
    if [ -z "$relative" ] || [ "$relative" = "." ]; then
      continue
    fi
    ignored=""
    prefix=""
    IFS=/ read -r -a parts <<<"$relative"
    for part in "${parts[@]}"; do
      prefix=${prefix:+$prefix/}$part
      for pattern in "${ignore_patterns[@]+"${ignore_patterns[@]}"}"; do
        # shellcheck disable=SC2053 # the pattern is a glob on purpose
        if [[ -z $ignored && $prefix == $pattern ]]; then
          ignored=$pattern
        fi
      done
    done
    if [ -n "$ignored" ]; then
      fail "$kind source '$source' is left out of the build context by .dockerignore's '$ignored'"
    elif ! compgen -G "$root/$relative" >/dev/null; then
      fail "$kind source '$source' does not exist in the build context ($root)"
    fi
  done
done <<<"$instructions"

# ---- 2. Build commands, the same as README.md's test command
readme_line=$(grep -m1 -E '^\./scripts/setup\.sh .*ctest ' "$readme" || true)
readme_commands=""
docker_commands=""
if [ -z "$readme_line" ]; then
  fail "$readme has no test command (a line starting with ./scripts/setup.sh that runs ctest)"
else
  readme_commands=$(split_commands <<<"$readme_line" | sed -E 's/[[:space:]]+/ /g' | build_commands)
  docker_commands=$(while IFS= read -r instruction; do
    if [ "$(keyword "$instruction")" = RUN ]; then
      args=$(arguments "$instruction" | sed -E 's/^(--[a-z]+=[^ ]* )+//')
      [[ $args == "["* ]] || printf '%s\n' "$args"
    fi
  done <<<"$instructions" | split_commands | build_commands)
  if [ -z "$readme_commands" ]; then
    fail "README.md's test command has no cmake or ctest command: '$readme_line'"
  elif [ "$docker_commands" != "$readme_commands" ]; then
    fail "the Dockerfile's configure/build/test commands differ from README.md's test command"
    {
      echo "  README.md:"
      indent <<<"$readme_commands"
      echo "  Dockerfile:"
      indent <<<"${docker_commands:-(none)}"
    } >&2
  fi
fi

# ---- 3. ENTRYPOINT runs the program CMake installs
final_stage=$(awk 'toupper($1) == "FROM" { text = "" } { text = text $0 "\n" } END { printf "%s", text }' \
  <<<"$instructions")
entrypoint=$(grep -iE '^ENTRYPOINT( |$)' <<<"$final_stage" | tail -n1 || true)
program=""
if [ -z "$entrypoint" ]; then
  fail "the final stage has no ENTRYPOINT"
else
  args=$(arguments "$entrypoint")
  if [[ $args =~ ^\[\ ?\"([^\"]+)\" ]]; then
    program=$(basename "${BASH_REMATCH[1]}")
  else
    fail "ENTRYPOINT is not in exec form (a JSON array such as [\"dkit\"]): '$entrypoint'"
  fi
fi
installed=""
if ! compgen -G "$build/cmake_install.cmake" >/dev/null; then
  fail "$build is not a configured build tree with install rules (run: cmake -S . -B $build)"
else
  installed=$(find "$build" -maxdepth 2 -name cmake_install.cmake -exec \
    grep -ho 'TYPE EXECUTABLE FILES "[^"]*"' {} + | sed -E 's/.*"(.*)"$/\1/' | xargs -r -n1 basename | sort -u)
  if [ -z "$installed" ]; then
    fail "cmake --install installs no program from $build (is DKIT_BUILD_APP or DKIT_INSTALL off?)"
  elif [ -n "$program" ] && ! grep -qxF "$program" <<<"$installed"; then
    fail "ENTRYPOINT runs '$program', but cmake --install installs: $(tr '\n' ' ' <<<"$installed")"
  fi
fi

# ---- 4. Not root
user=$(grep -iE '^USER ' <<<"$final_stage" | tail -n1 | awk '{ print $2 }' | cut -d: -f1 || true)
if [ -z "$user" ] || [ "$user" = root ] || [ "$user" = 0 ]; then
  fail "the image runs as root: the final stage's last USER must name another user (it is '${user:-missing}')"
fi

# ---- 5. RUN instructions parse
runs=0
while IFS= read -r instruction; do
  [ "$(keyword "$instruction")" = RUN ] || continue
  args=$(arguments "$instruction" | sed -E 's/^(--[a-z]+=[^ ]* )+//')
  [[ $args == "["* ]] && continue
  runs=$((runs + 1))
  if ! problem=$(sh -n -c "$args" 2>&1); then
    fail "RUN is not valid shell ($problem): '$instruction'"
  fi
done <<<"$instructions"

if [ "$errors" -gt 0 ]; then
  echo "check_dockerfile: $errors problem(s) in $dockerfile" >&2
  exit 1
fi
echo "check_dockerfile: $dockerfile is fine: $copies COPY/ADD source(s) exist," \
  "$(wc -l <<<"$docker_commands") build command(s) match README.md, ENTRYPOINT runs the installed '$program'," \
  "USER $user, $runs RUN instruction(s) parse"
