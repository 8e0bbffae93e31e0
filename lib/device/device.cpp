#include <dkit/device/device.h>

#include <dkit/config.h>
#include <dkit/core/compat.h>
#include <dkit/core/error.h>
#include <dkit/device/report.h>

#include <torch/torch.h>

#include <sched.h>
#include <sys/resource.h>

#include <charconv>
#include <fstream>
#include <unistd.h>

#if DKIT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dkit {
namespace {

int64_t resident_set_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0;
  int64_t resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) {
    return 0;
  }
  return resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t peak_resident_set_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      return std::max<int64_t>(std::stoll(line.substr(6)) * 1024, resident_set_bytes());
    }
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return std::max(static_cast<int64_t>(usage.ru_maxrss) * 1024, resident_set_bytes());
}

#if DKIT_WITH_CUDA
// Whether CUDA's caching allocator has been set up in this process (CUDA's lazy initialisation): before that it
// holds nothing, and LibTorch 2.11 asserts when asked about it.
bool cuda_allocator_initialized() {
  return c10::cuda::CUDACachingAllocator::get()->initialized();
}
#endif

} // namespace

Device cpu() {
  return Device(c10::DeviceType::CPU);
}

Device gpu(int64_t i) {
  TORCH_CHECK(i >= 0 && i < std::numeric_limits<c10::DeviceIndex>::max(), "invalid GPU index ", i);
  return Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(i));
}

Device with_index(const Device& device) {
  return device.is_cuda() && !device.has_index() ? gpu(0) : device;
}

int64_t num_gpus() {
  return static_cast<int64_t>(torch::cuda::device_count());
}

int cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return 0;
  }
  return CPU_COUNT(&set);
}

Device try_gpu(int64_t i) {
  if (i >= 0 && i < num_gpus()) {
    return gpu(i);
  }
  return cpu();
}

std::vector<Device> try_all_gpus() {
  std::vector<Device> devices;
  const int64_t n = num_gpus();
  devices.reserve(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (int64_t i = 0; i < n; ++i) {
    devices.push_back(gpu(i));
  }
  if (devices.empty()) {
    devices.push_back(cpu());
  }
  return devices;
}

bool is_available(const Device& device) {
  if (device.is_cpu()) {
    return true;
  }
  if (device.is_cuda()) {
    return with_index(device).index() < num_gpus();
  }
  return false;
}

std::string available_devices() {
  std::string names = "cpu";
  for (int64_t i = 0; i < num_gpus(); ++i) {
    names += ", " + gpu(i).str();
  }
  return names;
}

bool try_parse_device(std::string_view text, Device& out) {
  if (text == "auto") {
    out = try_gpu(0);
    return true;
  }
  if (text == "cpu") {
    out = cpu();
    return true;
  }
  if (text == "cuda") {
    out = gpu(0);
    return true;
  }
  constexpr std::string_view prefix = "cuda:";
  if (text.substr(0, prefix.size()) != prefix || text.size() == prefix.size()) {
    return false;
  }
  const std::string_view digits = text.substr(prefix.size());
  int64_t index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (ec != std::errc() || end != digits.data() + digits.size() || index < 0 ||
      index >= std::numeric_limits<c10::DeviceIndex>::max()) {
    return false;
  }
  out = gpu(index);
  return true;
}

Device parse_device(std::string_view text) {
  Device device = cpu();
  DKIT_CHECK(try_parse_device(text, device), "invalid device '", text, "': expected auto, cpu, cuda or cuda:N");
  if (is_available(device)) {
    return device;
  }
  const int64_t n = num_gpus();
  if (n == 0) {
    throw Error(detail::concat("device '", text, "' is not available: ", cuda_unavailable_reason(),
                               "; available devices: ", available_devices()));
  }
  throw Error(detail::concat("device '", text, "' is not available: this process can use ", n,
                             n == 1 ? " GPU" : " GPUs", "; available devices: ", available_devices()));
}

at::Tensor to_device(const at::Tensor& tensor, const Device& device) {
  const Device target = with_index(device);
  if (tensor.device() == target) {
    return tensor;
  }
  return tensor.to(target);
}

void check_same_device(std::initializer_list<NamedTensor> tensors) {
  if (tensors.size() < 2) {
    return;
  }
  const Device first = tensors.begin()->tensor.device();
  bool same = true;
  for (const auto& named : tensors) {
    same = same && named.tensor.device() == first;
  }
  if (same) {
    return;
  }
  std::string listing;
  for (const auto& named : tensors) {
    listing += (listing.empty() ? "" : ", ") + std::string(named.name) + " on " + named.tensor.device().str();
  }
  throw Error("expected all tensors on the same device, got " + listing);
}

void place_module(torch::nn::Module& module, const Device& device) {
  const Device target = with_index(device);
  DKIT_CHECK(is_available(target), "cannot place module on '", target.str(),
             "': not available; available devices: ", available_devices());
  module.to(target);
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    TORCH_INTERNAL_ASSERT(item.value().device() == target, "parameter '", item.key(), "' is on ",
                          item.value().device().str(), " after moving the module to ", target.str());
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    TORCH_INTERNAL_ASSERT(item.value().device() == target, "buffer '", item.key(), "' is on ",
                          item.value().device().str(), " after moving the module to ", target.str());
  }
}

void release_cached_memory() {
#if DKIT_WITH_CUDA
  if (num_gpus() > 0 && cuda_allocator_initialized()) {
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
#endif
}

MemoryStats memory_stats(const Device& device) {
  MemoryStats stats;
  if (device.is_cpu()) {
    stats.allocated_bytes = resident_set_bytes();
    stats.reserved_bytes = stats.allocated_bytes;
    stats.peak_allocated_bytes = peak_resident_set_bytes();
    return stats;
  }
  const Device target = with_index(device);
  DKIT_CHECK(is_available(target), "no memory statistics for '", target.str(),
             "': not available; available devices: ", available_devices());
#if DKIT_WITH_CUDA
  if (!cuda_allocator_initialized()) {
    return stats;
  }
  const auto cuda_stats = c10::cuda::CUDACachingAllocator::getDeviceStats(target.index());
  stats.allocated_bytes = cuda_stats.allocated_bytes[compat::kAggregateStat].current;
  stats.reserved_bytes = cuda_stats.reserved_bytes[compat::kAggregateStat].current;
  stats.peak_allocated_bytes = cuda_stats.allocated_bytes[compat::kAggregateStat].peak;
#endif
  return stats;
}

void reset_peak_memory_stats(const Device& device) {
  if (!device.is_cuda()) {
    return;
  }
#if DKIT_WITH_CUDA
  const Device target = with_index(device);
  if (is_available(target) && cuda_allocator_initialized()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(target.index());
  }
#endif
}

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

} // namespace dkit
