#include <dkit/distributed/data_parallel.h>

#include <dkit/config.h>
#include <dkit/core/error.h>

#if DKIT_WITH_CUDA && DKIT_WITH_DATA_PARALLEL
#include <torch/nn/parallel/data_parallel.h>
#endif

#include <torch/torch.h>

namespace dkit {

bool data_parallel_available() {
  return DKIT_WITH_DATA_PARALLEL == 1;
}

std::string data_parallel_unavailable_reason() {
  if (data_parallel_available()) {
    return "";
  }
  return std::string("this dkit was built against LibTorch ") + TORCH_VERSION +
         (DKIT_WITH_CUDA ? " with CUDA but without torch/nn/parallel/data_parallel.h"
                         : " without CUDA, which cannot compile torch::nn::parallel::data_parallel");
}

at::Tensor data_parallel_forward(Mlp& model, const at::Tensor& input, const std::vector<Device>& devices) {
#if DKIT_WITH_CUDA && DKIT_WITH_DATA_PARALLEL
  TORCH_INTERNAL_ASSERT(!devices.empty(), "data_parallel_forward needs at least one device");
  return torch::nn::parallel::data_parallel(model, input, devices, devices.front());
#else
  (void)model;
  (void)input;
  (void)devices;
  throw Error("DataParallel is not available: " + data_parallel_unavailable_reason());
#endif
}

} // namespace dkit
