# Finds LibTorch and works out what it can do. Works with Debian's libtorch-dev (1.13, CPU only) and with the
# LibTorch inside a PyTorch wheel (2.x, CUDA): pass -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)').
#
# Sets:
#   DKIT_TORCH_VERSION  the LibTorch version found
#   DKIT_WITH_CUDA      ON when the found LibTorch was built with CUDA
dkit_find_package(Torch)

# The version: from the package's version file (TorchConfigVersion.cmake, which PyTorch's wheels and zips ship), or
# else from the headers' TORCH_VERSION_* macros, which LibTorch 2.8 and later define in torch/headeronly/version.h
# (torch/version.h only includes that one there).
set(DKIT_TORCH_VERSION "unknown")
if(Torch_VERSION MATCHES "^[0-9]+\\.[0-9]+")
  string(REGEX MATCH "^[0-9]+\\.[0-9]+(\\.[0-9]+)?" DKIT_TORCH_VERSION "${Torch_VERSION}")
else()
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    foreach(header torch/version.h torch/headeronly/version.h)
      if(NOT EXISTS "${dir}/${header}")
        continue()
      endif()
      file(STRINGS "${dir}/${header}" _dkit_version_lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
      string(REGEX MATCH "TORCH_VERSION_MAJOR \\(?([0-9]+)" _ "${_dkit_version_lines}")
      if(CMAKE_MATCH_1 STREQUAL "")
        continue()
      endif()
      set(_dkit_parts "")
      foreach(part MAJOR MINOR PATCH)
        string(REGEX MATCH "TORCH_VERSION_${part} \\(?([0-9]+)" _ "${_dkit_version_lines}")
        list(APPEND _dkit_parts "${CMAKE_MATCH_1}")
      endforeach()
      list(JOIN _dkit_parts "." DKIT_TORCH_VERSION)
      break()
    endforeach()
    if(NOT DKIT_TORCH_VERSION STREQUAL "unknown")
      break()
    endif()
  endforeach()
endif()

# The C++ standard: LibTorch 2.13 and later need C++20 (their headers stop with "#error C++20 or later compatible
# compiler is required"), earlier ones C++17. dkit asks for no more than its LibTorch needs, since dkit::dkit hands
# its standard on to every program that links it: a C++17 project on LibTorch 1.13 or 2.6 can use dkit as it is. A
# higher CMAKE_CXX_STANDARD given on the command line is kept.
#
# Sets:
#   DKIT_CXX_STANDARD  17 or 20, what the found LibTorch needs (dkit::dkit's cxx_std_NN compile feature)
if(DKIT_TORCH_VERSION VERSION_GREATER_EQUAL 2.13)
  set(DKIT_CXX_STANDARD 20)
else()
  set(DKIT_CXX_STANDARD 17)
endif()
if(NOT CMAKE_CXX_STANDARD OR CMAKE_CXX_STANDARD LESS DKIT_CXX_STANDARD)
  set(CMAKE_CXX_STANDARD ${DKIT_CXX_STANDARD})
endif()

if(TARGET torch_cuda OR TARGET c10_cuda OR CAFFE2_USE_CUDA)
  set(DKIT_WITH_CUDA ON)
else()
  set(DKIT_WITH_CUDA OFF)
endif()

message(STATUS "dkit: LibTorch ${DKIT_TORCH_VERSION}, C++${CMAKE_CXX_STANDARD}, CUDA ${DKIT_WITH_CUDA}")

# What the found LibTorch offers for training on several processes or GPUs. c10d's backends are compiled into
# libtorch_cpu/libtorch_cuda when PyTorch was built with them, which the exported targets say through the
# definitions they hand on (USE_C10D_GLOO on torch_cpu, USE_C10D_NCCL on torch_cuda); their headers include Gloo's
# and NCCL's own headers, which not every LibTorch ships, so those are looked for too.
#
# Sets:
#   DKIT_WITH_GLOO           ON when c10d's Gloo backend can be used (multi-process training on the CPU)
#   DKIT_WITH_NCCL           ON when c10d's NCCL backend can be used (CUDA builds)
#   DKIT_WITH_DATA_PARALLEL  ON when torch::nn::parallel::data_parallel compiles and links (CUDA builds: its header
#                            needs CUDA's, and its Scatter/Gather functions live in libtorch_cuda)
function(_dkit_target_definitions target out_var)
  set(_defs "")
  if(TARGET ${target})
    get_target_property(_defs ${target} INTERFACE_COMPILE_DEFINITIONS)
    if(NOT _defs)
      set(_defs "")
    endif()
  endif()
  set(${out_var} "${_defs}" PARENT_SCOPE)
endfunction()

_dkit_target_definitions(torch_cpu _dkit_cpu_defs)
_dkit_target_definitions(torch_cuda _dkit_cuda_defs)

set(DKIT_WITH_GLOO OFF)
if("USE_C10D_GLOO" IN_LIST _dkit_cpu_defs)
  find_path(DKIT_GLOO_INCLUDE_DIR gloo/algorithm.h HINTS ${TORCH_INCLUDE_DIRS}
            DOC "Gloo's headers, which c10d's ProcessGroupGloo.hpp includes")
  if(DKIT_GLOO_INCLUDE_DIR)
    set(DKIT_WITH_GLOO ON)
  else()
    message(STATUS "dkit: LibTorch has c10d's Gloo backend but Gloo's headers were not found (Debian: libgloo-dev; "
                   "or set DKIT_GLOO_INCLUDE_DIR): multi-process training is left out")
  endif()
endif()

set(DKIT_WITH_NCCL OFF)
if(DKIT_WITH_CUDA AND "USE_C10D_NCCL" IN_LIST _dkit_cuda_defs)
  find_path(DKIT_NCCL_INCLUDE_DIR nccl.h
            HINTS ${TORCH_INCLUDE_DIRS} ${CUDAToolkit_INCLUDE_DIRS} ${CUDA_INCLUDE_DIRS} ENV NCCL_HOME ENV NCCL_ROOT
                  ENV CUDA_HOME
            PATH_SUFFIXES include
            DOC "NCCL's nccl.h, which c10d's ProcessGroupNCCL.hpp includes")
  if(DKIT_NCCL_INCLUDE_DIR)
    set(DKIT_WITH_NCCL ON)
  else()
    message(STATUS "dkit: LibTorch has c10d's NCCL backend but nccl.h was not found (set NCCL_HOME or "
                   "DKIT_NCCL_INCLUDE_DIR): multi-process training on GPUs is left out")
  endif()
endif()

set(DKIT_WITH_DATA_PARALLEL OFF)
if(DKIT_WITH_CUDA)
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${dir}/torch/nn/parallel/data_parallel.h")
      set(DKIT_WITH_DATA_PARALLEL ON)
    endif()
  endforeach()
endif()

message(STATUS "dkit: c10d Gloo ${DKIT_WITH_GLOO}, NCCL ${DKIT_WITH_NCCL}; DataParallel ${DKIT_WITH_DATA_PARALLEL}")

# at::parallel_for and at::parallel_reduce are templates whose parallel branch is compiled only where _OPENMP is
# defined (ATen/ParallelOpenMP.h): in code built without OpenMP they run their whole range on one thread, whatever
# at::set_num_threads() says. dkit's own parallel kernels are therefore compiled with OpenMP when the found
# LibTorch parallelises with OpenMP, and linked against the very OpenMP runtime it loads (Debian's libgomp.so.1, or
# the libgomp-<hash>.so.1 a wheel bundles beside libtorch_cpu), so that both share one team of threads. GCC only:
# Clang's -fopenmp targets a different runtime (libomp).
#
# Sets:
#   DKIT_OPENMP_RUNTIME  the OpenMP runtime library to link, or empty when dkit's kernels stay on one thread
#   DKIT_WITH_OPENMP     ON when DKIT_OPENMP_RUNTIME is set
option(DKIT_OPENMP "Compile dkit's parallel kernels with OpenMP when LibTorch uses OpenMP" ON)
set(DKIT_OPENMP_RUNTIME "")
if(DKIT_OPENMP)
  set(_dkit_torch_openmp OFF)
  foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
    if(EXISTS "${dir}/ATen/Config.h")
      file(STRINGS "${dir}/ATen/Config.h" _dkit_parallel REGEX "#define AT_PARALLEL_OPENMP 1")
      if(_dkit_parallel)
        set(_dkit_torch_openmp ON)
      endif()
      break()
    endif()
  endforeach()
  set(_dkit_torch_library "${TORCH_LIBRARY}")
  if(NOT _dkit_torch_library AND TARGET torch_cpu)
    get_target_property(_dkit_torch_library torch_cpu IMPORTED_LOCATION)
  endif()
  set(_dkit_openmp_why "")
  if(NOT _dkit_torch_openmp)
    set(_dkit_openmp_why "LibTorch does not parallelise with OpenMP")
  elseif(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(_dkit_openmp_why "only GCC's OpenMP (libgomp) is the runtime LibTorch uses")
  elseif(NOT _dkit_torch_library)
    set(_dkit_openmp_why "the LibTorch library's folder is unknown")
  else()
    get_filename_component(_dkit_torch_lib_dir "${_dkit_torch_library}" DIRECTORY)
    file(GLOB _dkit_gomp "${_dkit_torch_lib_dir}/libgomp*.so*")
    if(_dkit_gomp)
      list(SORT _dkit_gomp)
      list(GET _dkit_gomp 0 DKIT_OPENMP_RUNTIME)
    else()
      # A LibTorch that bundles no libgomp loads the system's, GCC's own.
      find_library(DKIT_GOMP_LIBRARY NAMES libgomp.so.1 gomp DOC "the OpenMP runtime LibTorch loads")
      if(DKIT_GOMP_LIBRARY)
        set(DKIT_OPENMP_RUNTIME "${DKIT_GOMP_LIBRARY}")
      else()
        set(_dkit_openmp_why "no libgomp beside ${_dkit_torch_library} or on the system")
      endif()
    endif()
  endif()
  if(_dkit_openmp_why)
    message(STATUS "dkit: OpenMP OFF (${_dkit_openmp_why}): dkit's own kernels run on one thread")
  else()
    message(STATUS "dkit: OpenMP ON, runtime ${DKIT_OPENMP_RUNTIME}")
  endif()
endif()
# How dkit links that runtime (DKIT_OPENMP_LINK, for target_link_libraries(dkit PRIVATE ...)): by its path in this
# build tree; in the install, by what the user's machine has, never by a path of this one: the system's libgomp
# through find_dependency(OpenMP) and OpenMP::OpenMP_CXX, a wheel's bundled one beside the user's torch_cpu.
set(DKIT_OPENMP_LINK "")
if(DKIT_OPENMP_RUNTIME)
  set(DKIT_WITH_OPENMP ON)
  get_filename_component(_dkit_gomp_name "${DKIT_OPENMP_RUNTIME}" NAME)
  if(_dkit_gomp_name MATCHES "^libgomp-")
    set(DKIT_OPENMP_LINK "$<BUILD_INTERFACE:${DKIT_OPENMP_RUNTIME}>"
                         "$<INSTALL_INTERFACE:$<TARGET_FILE_DIR:torch_cpu>/${_dkit_gomp_name}>")
  else()
    dkit_find_package(OpenMP COMPONENTS CXX)
    set(DKIT_OPENMP_LINK "$<BUILD_INTERFACE:${DKIT_OPENMP_RUNTIME}>" "$<INSTALL_INTERFACE:OpenMP::OpenMP_CXX>")
  endif()
else()
  set(DKIT_WITH_OPENMP OFF)
endif()
