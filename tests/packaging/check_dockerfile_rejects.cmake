# Breaks a copy of the Dockerfile (or of README.md) in one way, runs scripts/check_dockerfile.sh on it, and passes
# only when the check fails with the message for that fault: proof that each rule of the check can fail.
#
#   cmake -DCASE=<name> -DBASH=... -DSOURCE_DIR=... -DBUILD_DIR=... -DWORK_DIR=... -P check_dockerfile_rejects.cmake
#
# Each case: the file to break, the text to replace (it must be there, or the case would prove nothing), its
# replacement, and a regular expression the check's output must match.
set(NL "\n")
if(CASE STREQUAL "missing_copy_source")
  set(file Dockerfile)
  set(from "COPY scripts/setup.sh ")
  set(to "COPY scripts/setup-gone.sh ")
  set(expect "COPY source 'scripts/setup-gone.sh' does not exist in the build context")
elseif(CASE STREQUAL "ignored_copy_source")
  set(file Dockerfile)
  set(from "COPY scripts/setup.sh ")
  set(to "COPY runs/setup.sh ")
  set(expect "COPY source 'runs/setup.sh' is left out of the build context by .dockerignore's 'runs'")
elseif(CASE STREQUAL "build_command_differs")
  set(file Dockerfile)
  set(from "cmake --build build --parallel \"$(nproc)\" &&")
  set(to "cmake --build build --parallel 4 &&")
  set(expect "configure/build/test commands differ from README.md's test command")
elseif(CASE STREQUAL "readme_without_test_command")
  set(file README.md)
  set(from "${NL}./scripts/setup.sh && cmake -S . -B build && cmake --build build --parallel \"$(nproc)\" && ctest ")
  set(to "${NL}./scripts/setup.sh && cmake -S . -B build && cmake --build build --parallel \"$(nproc)\" && make test ")
  set(expect "has no test command")
elseif(CASE STREQUAL "entrypoint_not_installed")
  set(file Dockerfile)
  set(from "ENTRYPOINT [\"dkit\"]")
  set(to "ENTRYPOINT [\"/usr/local/bin/dkit-cli\"]")
  set(expect "ENTRYPOINT runs 'dkit-cli', but cmake --install installs: dkit")
elseif(CASE STREQUAL "entrypoint_shell_form")
  set(file Dockerfile)
  set(from "ENTRYPOINT [\"dkit\"]")
  set(to "ENTRYPOINT dkit")
  set(expect "ENTRYPOINT is not in exec form")
elseif(CASE STREQUAL "runs_as_root")
  set(file Dockerfile)
  set(from "${NL}USER dkit${NL}")
  set(to "${NL}USER root${NL}")
  set(expect "the image runs as root")
else()
  message(FATAL_ERROR "check_dockerfile_rejects: unknown CASE '${CASE}'")
endif()

set(dir "${WORK_DIR}/${CASE}")
file(REMOVE_RECURSE "${dir}")
file(MAKE_DIRECTORY "${dir}")
foreach(name Dockerfile README.md)
  configure_file("${SOURCE_DIR}/${name}" "${dir}/${name}" COPYONLY)
endforeach()
file(READ "${dir}/${file}" text)
string(FIND "${text}" "${from}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "check_dockerfile_rejects: ${file} no longer has '${from}': update case ${CASE}")
endif()
string(REPLACE "${from}" "${to}" text "${text}")
file(WRITE "${dir}/${file}" "${text}")

execute_process(
  COMMAND "${BASH}" "${SOURCE_DIR}/scripts/check_dockerfile.sh" --dockerfile "${dir}/Dockerfile"
          --readme "${dir}/README.md" "${BUILD_DIR}"
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
if(result EQUAL 0)
  message(FATAL_ERROR "check_dockerfile_rejects: the check passed a Dockerfile broken by ${CASE}:\n${output}")
endif()
if(NOT output MATCHES "${expect}")
  message(FATAL_ERROR "check_dockerfile_rejects: the check failed, but without '${expect}':\n${output}")
endif()
message(STATUS "check_dockerfile_rejects: ${CASE} rejected as expected:\n${output}")
