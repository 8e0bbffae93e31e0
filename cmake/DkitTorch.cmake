# Finds LibTorch and works out what it can do. Works with Debian's libtorch-dev (1.13, CPU only) and with the
# LibTorch inside a PyTorch wheel (2.x, CUDA): pass -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)').
#
# Sets:
#   DKIT_TORCH_VERSION  the LibTorch version found
#   DKIT_WITH_CUDA      ON when the found LibTorch was built with CUDA
dkit_find_package(Torch)

set(DKIT_TORCH_VERSION "unknown")
foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS "${dir}/torch/version.h")
    file(STRINGS "${dir}/torch/version.h" _dkit_version_lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
    set(_dkit_parts "")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "TORCH_VERSION_${part} ([0-9]+)" _ "${_dkit_version_lines}")
      list(APPEND _dkit_parts "${CMAKE_MATCH_1}")
    endforeach()
    list(JOIN _dkit_parts "." DKIT_TORCH_VERSION)
    break()
  endif()
endforeach()

if(TARGET torch_cuda OR TARGET c10_cuda OR CAFFE2_USE_CUDA)
  set(DKIT_WITH_CUDA ON)
else()
  set(DKIT_WITH_CUDA OFF)
endif()

message(STATUS "dkit: LibTorch ${DKIT_TORCH_VERSION}, CUDA ${DKIT_WITH_CUDA}")

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
