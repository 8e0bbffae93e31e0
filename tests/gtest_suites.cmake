# Read by ctest (a TEST_INCLUDE_FILES entry that tests/CMakeLists.txt generates): one test per GoogleTest suite of
# dkit_tests, named `Suite.*` and run as `dkit_tests --gtest_filter=Suite.*`. The suites are listed from the program
# itself (--gtest_list_tests) whenever it is newer than the list, so a new test or suite needs no CMake line.
#
# Input variables: DKIT_TESTS_EXECUTABLE (the program), DKIT_TESTS_DIRECTORY (its working directory and where the
# list is kept).
set(_dkit_list "${DKIT_TESTS_DIRECTORY}/dkit_tests_suites.txt")
if(NOT EXISTS "${DKIT_TESTS_EXECUTABLE}")
  add_test([=[dkit_tests_NOT_BUILT]=] "${DKIT_TESTS_EXECUTABLE}")
  return()
endif()
if(NOT EXISTS "${_dkit_list}" OR "${DKIT_TESTS_EXECUTABLE}" IS_NEWER_THAN "${_dkit_list}")
  execute_process(COMMAND "${DKIT_TESTS_EXECUTABLE}" --gtest_list_tests
                  WORKING_DIRECTORY "${DKIT_TESTS_DIRECTORY}" TIMEOUT 120
                  OUTPUT_VARIABLE _dkit_output ERROR_VARIABLE _dkit_error RESULT_VARIABLE _dkit_result)
  # A suite's line starts in the first column and ends its name with '.' (a typed suite adds "  # TypeParam = ...");
  # its tests' lines start with two spaces.
  string(REGEX MATCHALL "(^|\n)[A-Za-z_][A-Za-z0-9_/]*\\." _dkit_suites "${_dkit_output}")
  list(TRANSFORM _dkit_suites STRIP)
  if(NOT _dkit_result EQUAL 0 OR NOT _dkit_suites)
    file(REMOVE "${_dkit_list}")
    string(REPLACE "\n" " " _dkit_error "${_dkit_error}")
    add_test([=[dkit_tests_LIST_FAILED]=] "${CMAKE_COMMAND}" -E echo
             "dkit_tests --gtest_list_tests failed (${_dkit_result}): ${_dkit_error}")
    set_tests_properties([=[dkit_tests_LIST_FAILED]=] PROPERTIES WILL_FAIL TRUE)
    return()
  endif()
  list(REMOVE_DUPLICATES _dkit_suites)
  string(REPLACE ";" "\n" _dkit_lines "${_dkit_suites}")
  file(WRITE "${_dkit_list}" "${_dkit_lines}\n")
endif()
file(STRINGS "${_dkit_list}" _dkit_suites)
foreach(_dkit_suite IN LISTS _dkit_suites)
  add_test("${_dkit_suite}*" "${DKIT_TESTS_EXECUTABLE}" "--gtest_filter=${_dkit_suite}*")
  # Skipped when the suite ran nothing but skips: every test needs a GPU and none is visible, or every test that ran
  # called GTEST_SKIP (tests/main.cpp says so in a line of its own, never when a test failed); a test that skips in
  # a suite whose other tests ran leaves the suite passed or failed by those.
  set_tests_properties("${_dkit_suite}*" PROPERTIES WORKING_DIRECTORY "${DKIT_TESTS_DIRECTORY}"
                       SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\] the whole run: ")
endforeach()
