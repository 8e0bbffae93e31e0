# Configures examples/consumer against the installed dkit and a LibTorch that claims another version (a package
# folder whose TorchConfig.cmake loads the real one, with a version file of its own), and passes only when
# dkitConfig.cmake refuses it with its message.
#
#   cmake -DPREFIX=... -DSOURCE_DIR=... -DWORK_DIR=... -DTORCH_DIR=... -DGENERATOR=... -DCXX=... -P other_libtorch.cmake
#
# PREFIX is the install prefix, then any other prefixes to search (a list).
set(fake "${WORK_DIR}/torch")
file(REMOVE_RECURSE "${WORK_DIR}")
file(WRITE "${fake}/TorchConfig.cmake" "include(\"${TORCH_DIR}/TorchConfig.cmake\")\n")
file(WRITE "${fake}/TorchConfigVersion.cmake" "set(PACKAGE_VERSION 99.1.0)\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/examples/consumer" -B "${WORK_DIR}/build" -G "${GENERATOR}"
          "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DTorch_DIR=${fake}" "-DCMAKE_CXX_COMPILER=${CXX}"
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
# CMake wraps the message: match it a word at a time.
string(REGEX REPLACE "[ \n]+" " " output "${output}")
set(expect "dkit was built against LibTorch [0-9.]+, but this project found LibTorch 99\\.1\\.0 \\(Torch_DIR=")
if(result EQUAL 0)
  message(FATAL_ERROR "other_libtorch: find_package(dkit) accepted LibTorch 99.1.0:\n${output}")
endif()
if(NOT output MATCHES "${expect}")
  message(FATAL_ERROR "other_libtorch: the configure failed, but not with '${expect}':\n${output}")
endif()
message(STATUS "other_libtorch: refused as expected")
