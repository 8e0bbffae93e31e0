# dkit's API reference, made by Doxygen from the /// comments of the public headers (docs/Doxyfile.in).
#
# - DKIT_DOCS=ON adds the `dkit_docs` target (build/docs/api/html/index.html) and needs Doxygen (Debian: doxygen).
# - Whenever Doxygen is found and the tests are built, the CTest test `docs.doxygen` runs it into a folder of the
#   build tree and fails on any warning: every public declaration must be documented. It compiles nothing.
option(DKIT_DOCS "Add the dkit_docs target: the API reference, made by Doxygen" OFF)

find_program(DKIT_DOXYGEN_EXECUTABLE NAMES doxygen DOC "Doxygen, for dkit's API reference")
if(DKIT_DOCS AND NOT DKIT_DOXYGEN_EXECUTABLE)
  message(FATAL_ERROR "DKIT_DOCS=ON needs Doxygen: install it (Debian: apt-get install doxygen) or set "
                      "DKIT_DOXYGEN_EXECUTABLE")
endif()

set(_dkit_docs_script "${PROJECT_SOURCE_DIR}/docs/run_doxygen.cmake")
if(DKIT_DOCS)
  add_custom_target(dkit_docs
    COMMAND "${CMAKE_COMMAND}" "-DDOXYGEN=${DKIT_DOXYGEN_EXECUTABLE}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
            "-DOUTPUT_DIR=${PROJECT_BINARY_DIR}/docs/api" "-DVERSION=${PROJECT_VERSION}" -P "${_dkit_docs_script}"
    COMMENT "Doxygen: dkit's API reference in ${PROJECT_BINARY_DIR}/docs/api/html"
    VERBATIM)
endif()

if(DKIT_DOXYGEN_EXECUTABLE AND DKIT_BUILD_TESTS)
  add_test(NAME docs.doxygen
           COMMAND "${CMAKE_COMMAND}" "-DDOXYGEN=${DKIT_DOXYGEN_EXECUTABLE}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
                   "-DOUTPUT_DIR=${PROJECT_BINARY_DIR}/docs/api-test" "-DVERSION=${PROJECT_VERSION}"
                   -P "${_dkit_docs_script}")
  set_tests_properties(docs.doxygen PROPERTIES LABELS docs TIMEOUT 300)
endif()
