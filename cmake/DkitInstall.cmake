# Install rules and package files, in the style of spdlog and fmt. `cmake --install BUILD [--prefix P]` puts
#   P/include/dkit/...                 the public headers, in lib/'s folder layout, and the generated config.h
#   P/lib/libdkit.a                    the library (libdkit.so with -DBUILD_SHARED_LIBS=ON)
#   P/lib/cmake/dkit/dkitConfig.cmake, dkitConfigVersion.cmake, dkitTargets*.cmake: find_package(dkit)
#   P/bin/dkit                         the command (app/CMakeLists.txt installs it)
#   P/share/dkit/mlp_train.py          the PyTorch side of `dkit bench train` (bench/CMakeLists.txt installs it)
# Components: dkit_runtime (the command, a shared library), dkit_development (everything else).
#
# The build tree is a package too: find_package(dkit) with -Ddkit_DIR=BUILD uses the library in place.
include(CMakePackageConfigHelpers)

set(DKIT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/dkit"
    CACHE STRING "Where to install dkitConfig.cmake, relative to the install prefix")

install(TARGETS dkit
  EXPORT dkitTargets
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT dkit_development
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT dkit_runtime NAMELINK_COMPONENT dkit_development
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT dkit_runtime
)
# The build tree reaches the headers through a link to lib/ (lib/CMakeLists.txt); the install copies only them.
install(DIRECTORY "${PROJECT_SOURCE_DIR}/lib/"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/dkit"
  COMPONENT dkit_development
  FILES_MATCHING
  PATTERN "*.h"
  PATTERN "pch.h" EXCLUDE
  # Internal headers: the library's own sources and the tests use them, projects that use dkit do not.
  PATTERN "detail" EXCLUDE
  PATTERN "compat.h" EXCLUDE
)
get_directory_property(_dkit_generated_root DIRECTORY "${PROJECT_SOURCE_DIR}/lib" DEFINITION DKIT_GENERATED_ROOT)
install(FILES "${_dkit_generated_root}/dkit/config.h"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/dkit"
  COMPONENT dkit_development
)

dkit_install_dependencies(DKIT_FIND_DEPENDENCIES)
configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/dkitConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/dkitConfig.cmake"
  INSTALL_DESTINATION "${DKIT_INSTALL_CMAKEDIR}"
)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/dkitConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY SameMajorVersion
)
install(FILES "${PROJECT_BINARY_DIR}/dkitConfig.cmake" "${PROJECT_BINARY_DIR}/dkitConfigVersion.cmake"
  DESTINATION "${DKIT_INSTALL_CMAKEDIR}"
  COMPONENT dkit_development
)
install(EXPORT dkitTargets
  NAMESPACE dkit::
  DESTINATION "${DKIT_INSTALL_CMAKEDIR}"
  COMPONENT dkit_development
)
export(EXPORT dkitTargets
  NAMESPACE dkit::
  FILE "${PROJECT_BINARY_DIR}/dkitTargets.cmake"
)
