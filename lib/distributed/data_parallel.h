#pragma once

#include <dkit/config.h>
#include <dkit/device/device.h>

#include <ATen/core/Tensor.h>

#if DKIT_WITH_CUDA && DKIT_WITH_DATA_PARALLEL
#include <torch/nn/parallel/data_parallel.h>
#endif

#include <vector>

namespace dkit {

/// Throws the dkit::Error data_parallel_forward() throws in a build without DataParallel.
[[noreturn]] void throw_data_parallel_unavailable();

/// `module` (a module holder of a `torch::nn::Cloneable` module, such as `dkit::Mlp` or a `TORCH_MODULE`) applied
/// to `input` as `torch::nn::parallel::data_parallel` does it: the rows of `input` are scattered over `devices`, the
/// module is replicated on each, the outputs are gathered on `devices[0]` (where the module lives), and backward
/// sums the replicas' gradients into the module's parameters. A build without the capability throws a dkit::Error
/// saying so (see data_parallel_available()).
template <typename ModuleHolder>
at::Tensor data_parallel_forward(ModuleHolder& module, const at::Tensor& input, const std::vector<Device>& devices) {
#if DKIT_WITH_CUDA && DKIT_WITH_DATA_PARALLEL
  TORCH_INTERNAL_ASSERT(!devices.empty(), "data_parallel_forward needs at least one device");
  return torch::nn::parallel::data_parallel(module, input, devices, devices.front());
#else
  (void)module;
  (void)input;
  (void)devices;
  throw_data_parallel_unavailable();
#endif
}

} // namespace dkit
