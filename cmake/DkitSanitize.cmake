# Sanitizers and fuzzing for dkit's own code. LibTorch and the other libraries are used as they are, not
# instrumented: the sanitizer runtimes still see their allocations (malloc and operator new are intercepted), but
# not their memory accesses.
#
#   DKIT_SANITIZE=address,undefined   instruments the library, the command and the tests (any -fsanitize= list the
#                                     compiler takes). scripts/sanitize.sh builds and runs the test suite this way.
#   DKIT_FUZZ=ON                      builds the libFuzzer targets of fuzz/ (clang only). The library is compiled
#                                     with -fsanitize=fuzzer-no-link for coverage, only the fuzz programs link
#                                     libFuzzer's main. Implies DKIT_SANITIZE=address,undefined when it is empty.
#                                     scripts/fuzz.sh builds and runs them.
#
# Both are off by default and change nothing in a normal build. The flags are directory-wide (every target of
# this project gets them, so the precompiled header is shared as usual) and never reach a parent project's own
# targets; a sanitized build is for testing, not for installing.
set(DKIT_SANITIZE "" CACHE STRING "Sanitizers for dkit's own code, as for -fsanitize= (e.g. address,undefined); empty for none")
option(DKIT_FUZZ "Build the libFuzzer targets in fuzz/ (clang only)" OFF)

if(DKIT_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DKIT_FUZZ needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ (scripts/fuzz.sh does)")
  endif()
  if(DKIT_SANITIZE STREQUAL "")
    set(DKIT_SANITIZE "address,undefined" CACHE STRING "Sanitizers for dkit's own code" FORCE)
  endif()
endif()

if(NOT DKIT_SANITIZE STREQUAL "")
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR "DKIT_SANITIZE needs GCC or clang, not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  # Line tables are enough for symbolized stack traces and cost far less than full debug information.
  add_compile_options(-fsanitize=${DKIT_SANITIZE} -fno-omit-frame-pointer
                      $<$<CXX_COMPILER_ID:Clang>:-gline-tables-only> $<$<CXX_COMPILER_ID:GNU>:-g1>)
  add_link_options(-fsanitize=${DKIT_SANITIZE})
  if(DKIT_FUZZ)
    add_compile_options(-fsanitize=fuzzer-no-link)
  endif()
  message(STATUS "dkit: sanitizers ${DKIT_SANITIZE}, fuzz targets ${DKIT_FUZZ}")
endif()
