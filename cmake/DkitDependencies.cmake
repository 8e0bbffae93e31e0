# dkit_find_package(<Package> [find_package arguments...])
#
# find_package() for a package that the dkit library links. It also records the package, so that the installed
# dkitConfig.cmake finds it again with find_dependency(): a static libdkit.a hands even its PRIVATE dependencies
# on to whoever links it, so a project using the installed dkit needs them too. Use it in place of find_package()
# in lib/ (REQUIRED is implied), one line per package:
#
#   dkit_find_package(spdlog)
#   target_link_libraries(dkit PRIVATE spdlog::spdlog)
#
# Packages that only the app or the tests use keep plain find_package(). When dkit is a parent project's
# subdirectory, the targets the package defines are made global, so that the parent can link dkit::dkit. dkit_install_dependencies() (called by
# DkitInstall.cmake) turns the records into find_dependency() lines, keeping those whose targets are in dkit's
# link interface, and stops the configure when that interface names an imported target no recorded package made.
macro(dkit_find_package _dkit_package)
  set(_dkit_args ${ARGN})
  list(REMOVE_ITEM _dkit_args REQUIRED)
  if(NOT CMAKE_VERSION VERSION_LESS 3.21)
    get_directory_property(_dkit_targets_before IMPORTED_TARGETS)
  endif()
  find_package(${_dkit_package} ${_dkit_args} REQUIRED)
  if(NOT CMAKE_VERSION VERSION_LESS 3.21)
    get_directory_property(_dkit_targets_after IMPORTED_TARGETS)
    if(_dkit_targets_before)
      list(REMOVE_ITEM _dkit_targets_after ${_dkit_targets_before})
    endif()
    set_property(GLOBAL APPEND PROPERTY DKIT_DEPENDENCY_TARGETS_${_dkit_package} ${_dkit_targets_after})
    # In a parent project's add_subdirectory(dkit), the parent links dkit::dkit and so must see these targets too.
    if(NOT PROJECT_IS_TOP_LEVEL AND _dkit_targets_after)
      set_target_properties(${_dkit_targets_after} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endif()
  list(JOIN _dkit_args " " _dkit_call)
  string(STRIP "${_dkit_package} ${_dkit_call}" _dkit_call)
  set_property(GLOBAL APPEND PROPERTY DKIT_DEPENDENCY_PACKAGES "${_dkit_package}")
  set_property(GLOBAL PROPERTY DKIT_DEPENDENCY_CALL_${_dkit_package} "${_dkit_call}")
  unset(_dkit_args)
  unset(_dkit_call)
  unset(_dkit_targets_before)
  unset(_dkit_targets_after)
endmacro()

# Sets <out_var> to the find_dependency() lines for dkitConfig.cmake, one per recorded package that dkit's link
# interface needs, in the order the packages were first found.
function(dkit_install_dependencies out_var)
  get_target_property(_interface dkit INTERFACE_LINK_LIBRARIES)
  if(NOT _interface)
    set(_interface "")
  endif()
  # INTERFACE_LINK_LIBRARIES holds items such as `torch`, `$<LINK_ONLY:spdlog::spdlog>` and, for links made from
  # another folder, the markers `::@(0x...)` and `::@`. Reduce it to plain names.
  string(REGEX REPLACE "::@(\\([^)]*\\))?" "" _interface "${_interface}")
  string(REGEX REPLACE "\\$<LINK_ONLY:([^>]*)>" "\\1" _interface "${_interface}")
  # What only the build tree links ($<BUILD_INTERFACE:...>) is not the install's; what only the install links is.
  string(REGEX REPLACE "\\$<BUILD_INTERFACE:[^>]*>" "" _interface "${_interface}")
  string(REGEX REPLACE "\\$<INSTALL_INTERFACE:([^>]*)>" "\\1" _interface "${_interface}")
  set(_linked "")
  foreach(_item IN LISTS _interface)
    if(_item MATCHES "^[A-Za-z0-9_.+-]+(::[A-Za-z0-9_.+-]+)?$")
      list(APPEND _linked "${_item}")
    endif()
  endforeach()

  get_property(_packages GLOBAL PROPERTY DKIT_DEPENDENCY_PACKAGES)
  list(REMOVE_DUPLICATES _packages)
  set(_covered "")
  set(_lines "")
  foreach(_package IN LISTS _packages)
    get_property(_targets GLOBAL PROPERTY DKIT_DEPENDENCY_TARGETS_${_package})
    get_property(_call GLOBAL PROPERTY DKIT_DEPENDENCY_CALL_${_package})
    list(APPEND _covered ${_targets})
    set(_needed FALSE)
    if(CMAKE_VERSION VERSION_LESS 3.21)
      set(_needed TRUE) # no IMPORTED_TARGETS to tell: keep every recorded package
    endif()
    foreach(_target IN LISTS _targets)
      if(_target IN_LIST _linked)
        set(_needed TRUE)
      endif()
    endforeach()
    if(_needed)
      string(APPEND _lines "find_dependency(${_call})\n")
    endif()
  endforeach()

  if(NOT CMAKE_VERSION VERSION_LESS 3.21)
    # Every imported target of the build, whichever folder's find_package() made it: a name such as yaml-cpp's
    # `yaml-cpp` is a target only if one of them has it.
    set(_imported "")
    set(_folders "${PROJECT_SOURCE_DIR}")
    while(_folders)
      list(POP_FRONT _folders _folder)
      get_directory_property(_folder_imported DIRECTORY "${_folder}" IMPORTED_TARGETS)
      get_directory_property(_subfolders DIRECTORY "${_folder}" SUBDIRECTORIES)
      list(APPEND _imported ${_folder_imported})
      list(APPEND _folders ${_subfolders})
    endwhile()
    set(_unrecorded "")
    foreach(_item IN LISTS _linked)
      if((_item MATCHES "::" OR _item IN_LIST _imported) AND NOT _item MATCHES "^dkit::"
         AND NOT _item IN_LIST _covered)
        string(REGEX REPLACE "::.*" "" _guess "${_item}")
        string(APPEND _unrecorded "\n  ${_item}: replace find_package(${_guess} ...) with dkit_find_package(${_guess} ...)")
      endif()
    endforeach()
    if(_unrecorded)
      message(FATAL_ERROR "dkit links targets that no dkit_find_package() found, so the installed dkitConfig.cmake "
                          "would not find them for the projects that use dkit. In the lib/ folder that links "
                          "each one (see cmake/DkitDependencies.cmake):${_unrecorded}")
    endif()
  endif()
  set(${out_var} "${_lines}" PARENT_SCOPE)
endfunction()
