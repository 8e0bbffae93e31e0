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
