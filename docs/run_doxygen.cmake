# Runs Doxygen over dkit's public headers and fails when it prints any warning (an undocumented public
# declaration, a broken doc comment). Used by the dkit_docs target and the docs.doxygen test.
#
#   cmake -DDOXYGEN=/usr/bin/doxygen -DSOURCE_DIR=... -DOUTPUT_DIR=... [-DVERSION=0.1.0] -P docs/run_doxygen.cmake
foreach(var DOXYGEN SOURCE_DIR OUTPUT_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_doxygen.cmake: -D${var}=... is needed")
  endif()
endforeach()
if(NOT DEFINED VERSION)
  set(VERSION "")
endif()

set(DKIT_DOCS_VERSION "${VERSION}")
set(DKIT_DOCS_SOURCE "${SOURCE_DIR}")
set(DKIT_DOCS_OUTPUT "${OUTPUT_DIR}")
set(DKIT_DOCS_WARNINGS "${OUTPUT_DIR}/doxygen-warnings.txt")
file(MAKE_DIRECTORY "${OUTPUT_DIR}")
file(REMOVE "${DKIT_DOCS_WARNINGS}")
configure_file("${SOURCE_DIR}/docs/Doxyfile.in" "${OUTPUT_DIR}/Doxyfile" @ONLY)

execute_process(COMMAND "${DOXYGEN}" "${OUTPUT_DIR}/Doxyfile" WORKING_DIRECTORY "${OUTPUT_DIR}"
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "doxygen failed (${result}):\n${out}${err}")
endif()

set(warnings "")
if(EXISTS "${DKIT_DOCS_WARNINGS}")
  file(READ "${DKIT_DOCS_WARNINGS}" warnings)
  string(STRIP "${warnings}" warnings)
endif()
if(NOT warnings STREQUAL "")
  message(FATAL_ERROR "doxygen warned about dkit's public headers (document each declaration with ///):\n${warnings}")
endif()
message(STATUS "dkit API reference: ${OUTPUT_DIR}/html/index.html (no warnings)")
