#include <dkit/checkpoint/training_checkpoint.h>

#include <dkit/core/error.h>
#include <dkit/device/device.h>

#include <torch/torch.h>

#include <algorithm>
#include <mutex>

namespace dkit {
namespace {

// LibTorch checks the `left` and `next` counters of a CPU generator state (torch.get_rng_state()'s layout: uint64
// seed, int32 left, int32 seeded, uint64 next, then the Mersenne Twister's 624 words) each on its own; a state with
// both near 624 makes it read past the end of its array. Drawing reads words next .. next + left - 2.
void check_cpu_generator_state(const at::Tensor& saved) {
  const at::Tensor bytes = saved.to(at::kCPU).contiguous();
  if (bytes.scalar_type() != at::kByte || bytes.numel() < 24) {
    return;  // the size check in restore_rng_state() explains it
  }
  const auto* data = bytes.data_ptr<uint8_t>();
  int32_t left = 0;
  uint64_t next = 0;
  std::memcpy(&left, data + 8, sizeof(left));
  std::memcpy(&next, data + 16, sizeof(next));
  DKIT_CHECK(left >= 1 && left <= 624 && next <= 624 && next + static_cast<uint64_t>(left) <= 625,
             "cannot restore the CPU random generator: its saved state is inconsistent (left ", left, ", next ",
             next, ")");
}

} // namespace

RngState capture_rng_state() {
  RngState state;
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    state.cpu = generator.get_state();
  }
  const auto gpus = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < gpus; ++i) {
    auto generator = at::globalContext().defaultGenerator(gpu(i));
    std::lock_guard<std::mutex> lock(generator.mutex());
    state.cuda.push_back(generator.get_state());
  }
  return state;
}

void restore_rng_state(const RngState& state) {
  const auto restore = [](at::Generator generator, const at::Tensor& saved, const std::string& name) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    const at::Tensor current = generator.get_state();
    DKIT_CHECK(saved.scalar_type() == at::kByte && saved.numel() == current.numel(), "cannot restore the ", name,
               " random generator: its saved state is ", saved.numel(), " ", dtype_name(saved.scalar_type()),
               " values, expected ", current.numel(), " uint8");
    generator.set_state(saved.to(at::kCPU).contiguous());
  };
  if (state.cpu.defined()) {
    check_cpu_generator_state(state.cpu);
    restore(at::detail::getDefaultCPUGenerator(), state.cpu, "CPU");
  }
  const auto gpus = std::min(state.cuda.size(), static_cast<size_t>(torch::cuda::device_count()));
  for (size_t i = 0; i < gpus; ++i) {
    const Device device = gpu(static_cast<int64_t>(i));
    restore(at::globalContext().defaultGenerator(device), state.cuda[i], device.str());
  }
}

} // namespace dkit
