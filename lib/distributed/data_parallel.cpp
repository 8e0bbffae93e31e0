#include <dkit/distributed/data_parallel.h>

#include <dkit/config.h>
#include <dkit/core/error.h>

#if DKIT_WITH_CUDA && DKIT_WITH_DATA_PARALLEL
#include <torch/nn/parallel/data_parallel.h>
#endif

#include <torch/torch.h>

namespace dkit {

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
