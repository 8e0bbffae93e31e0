#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace at {
class Tensor;
} // namespace at

namespace torch::nn {
class Module;
template <typename Contained>
class ModuleHolder;
} // namespace torch::nn

namespace dkit {

/// A LibTorch device (`c10::Device`); dkit's functions always return one with an index for CUDA.
using Device = c10::Device;

/// The CPU device.
Device cpu();

/// The device `cuda:i`. Like d2l's `gpu(i)` it does not check that the GPU exists: use try_gpu() or
/// parse_device() when that matters.
Device gpu(int64_t i = 0);

/// How many CUDA devices this process can use; 0 on a build without CUDA or with no visible GPU.
int64_t num_gpus();

/// `device` with an index: `cuda` without one is `cuda:0`, as parse_device() reads it; any other device is
/// returned as it is.
Device with_index(const Device& device);

/// CPUs this process may run on (its affinity mask), which may be fewer than the machine has; 0 when unknown.
int cpu_count();

/// Sets LibTorch's CPU threads (`at::set_num_threads`), then has each thread of its intra-op pool take that setting
/// at once. LibTorch applies its settings on a pool thread the first time that thread asks for them, and LibTorch
/// 1.13 then starts its pthreadpool's threads afresh, which spin for some tens of milliseconds: without this, the
/// first parallel work pays for it (dkit train's first steps took 4 ms each instead of 0.2 on two CPUs). Sets
/// process-wide state: for applications, as `threads` in a config asks.
void set_cpu_threads(int64_t threads);

/// `cuda:i` if that GPU exists, otherwise the CPU.
Device try_gpu(int64_t i = 0);

/// Every GPU, or `{cpu()}` when there is none. Never empty.
std::vector<Device> try_all_gpus();

/// Whether this process can use `device` (the CPU always; `cuda:i` when `i < num_gpus()`).
bool is_available(const Device& device);

/// Comma-separated names of the devices this process can use, e.g. `cpu, cuda:0, cuda:1`.
std::string available_devices();

/// Reads a device spelled `auto`, `cpu`, `cuda` or `cuda:N` into `out`. Returns false when the text is not one
/// of those spellings; it does not check that the device exists.
bool try_parse_device(std::string_view text, Device& out);

/// Parses `auto | cpu | cuda | cuda:N`. `auto` is try_gpu(0); `cuda` is `cuda:0`. A device that does not exist
/// is an error listing those that do: an explicit choice never falls back to the CPU.
Device parse_device(std::string_view text);

/// `tensor` on `device`. When it is already there the same tensor is returned, sharing its storage and
/// `data_ptr` (d2l's `Z.cuda(0) is Z`); otherwise a copy.
at::Tensor to_device(const at::Tensor& tensor, const Device& device);

/// A tensor and the name to use for it in error messages.
struct NamedTensor {
  /// Name shown in the error, e.g. `input`.
  std::string_view name;
  /// The tensor to check.
  const at::Tensor& tensor;
};

/// Checks that every tensor is on the same device. The error names each tensor and its device, which says
/// more than LibTorch's dispatcher message.
void check_same_device(std::initializer_list<NamedTensor> tensors);

/// Moves every parameter and buffer of `module` to `device` and checks that each one arrived.
void place_module(torch::nn::Module& module, const Device& device);

/// place_module() for a module holder such as `dkit::Mlp`.
template <typename Contained>
void place_module(torch::nn::ModuleHolder<Contained>& module, const Device& device) {
  place_module(*module, device);
}

/// Returns the CUDA caching allocator's unused blocks to the driver (`torch.cuda.empty_cache()`). A no-op on a
/// build without CUDA.
void release_cached_memory();

/// Memory use of this process on one device, in bytes.
struct MemoryStats {
  /// Bytes in live tensors (CUDA); resident set size (CPU).
  int64_t allocated_bytes = 0;
  /// Bytes held by the caching allocator, live or cached (CUDA); resident set size (CPU).
  int64_t reserved_bytes = 0;
  /// Highest allocated_bytes since the start or the last reset_peak_memory_stats() (CUDA); peak resident set
  /// size of the process (CPU).
  int64_t peak_allocated_bytes = 0;
};

/// Memory statistics for `device`. On CUDA they come from the caching allocator, and are zero while CUDA is not yet
/// initialised in this process (as Python's torch.cuda.memory_stats); the CPU has no such allocator, so the
/// process's resident set size stands in.
MemoryStats memory_stats(const Device& device);

/// Starts peak tracking afresh on a CUDA device; a no-op on the CPU.
void reset_peak_memory_stats(const Device& device);

/// Whether this build can run one process on several GPUs with LibTorch's `torch::nn::parallel::data_parallel`:
/// builds against a CUDA LibTorch. A CPU-only LibTorch cannot compile it (its header needs CUDA's) nor link it
/// (its Scatter and Gather functions live in libtorch_cuda).
bool data_parallel_available();

/// Why data_parallel_available() is false, for error messages and `dkit devices`; empty when it is true.
std::string data_parallel_unavailable_reason();

} // namespace dkit
