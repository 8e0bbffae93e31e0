# dkit_warnings: a PRIVATE interface target that carries the warning flags for dkit's own code. It is never
# exported, so projects that use dkit as a dependency do not inherit them.
add_library(dkit_warnings INTERFACE)
if(DKIT_WARNINGS AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(dkit_warnings INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                                 -Wold-style-cast -Wcast-align -Wunused -Woverloaded-virtual
                                                 -Wnull-dereference -Wformat=2)
  if(DKIT_WARNINGS_AS_ERRORS)
    target_compile_options(dkit_warnings INTERFACE -Werror)
  endif()
endif()
