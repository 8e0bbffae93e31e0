#pragma once

// The differences between the LibTorch versions dkit builds against (Debian's 1.13, the PyTorch wheels' 2.x)
// live here, so that the rest of the code is written once.

#include <dkit/config.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>

namespace c10d {
class Backend;
class ProcessGroup;
} // namespace c10d

/// 1 when the LibTorch being compiled against is at least MAJOR.MINOR.
#define DKIT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace dkit::compat {

/// Index of the aggregate entry in the caching allocator's per-pool statistic arrays: `StatType::AGGREGATE`
/// moved from `c10::cuda::CUDACachingAllocator` (1.13) to `c10::CachingAllocator` (2.x), its value did not.
constexpr size_t kAggregateStat = 0;

/// The key under which `torch::optim::Optimizer::state()` keeps a parameter's state: the address of the
/// parameter's TensorImpl printed to a string in 1.13 (`c10::guts::to_string`, an ostream's `0x…`, which `%p`
/// prints without the stream's cost), the address itself in 2.x. `Key` is the state map's `key_type`.
template <typename Key, typename TensorType>
Key optimizer_state_key(const TensorType& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", static_cast<const void*>(param.unsafeGetTensorImpl()));
    return text;
  } else {
    return param.unsafeGetTensorImpl();
  }
}

/// The class c10d's ProcessGroupGloo and ProcessGroupNCCL derive from, whose virtual collectives (`allreduce`,
/// `broadcast`, each returning a `c10::intrusive_ptr<c10d::Work>`) lib/distributed calls: `c10d::ProcessGroup` in
/// 1.13; from 2.0 on `c10d::Backend`, ProcessGroup having become a front that dispatches to backends.
#if DKIT_TORCH_AT_LEAST(2, 0)
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

/// Whether `Options` (c10d::TCPStoreOptions) has the `useLibUV` field of LibTorch 2.3 and later.
template <typename Options, typename = void>
struct HasUseLibUV : std::false_type {};
template <typename Options>
struct HasUseLibUV<Options, std::void_t<decltype(std::declval<Options&>().useLibUV)>> : std::true_type {};

/// `c10d::TCPStoreOptions` for dkit's rendezvous (`Options` is that type, named here without its header). The
/// fields set are the same in every version; 2.x adds `masterListenFd`, left at its default, and `useLibUV`, the
/// libuv server, on by default from 2.4 even in builds without libuv (Debian's 2.6 and later), where the store then
/// refuses to start ("use_libuv was requested but PyTorch was build without libuv support"). dkit asks for the
/// classic server, which every build has: its store carries a few keys per step at most. `waitWorkers` is off:
/// dkit waits for the ranks itself, so that it can say which ones are missing.
template <typename Options>
Options tcp_store_options(uint16_t port, bool is_server, std::chrono::milliseconds timeout) {
  Options options;
  options.port = port;
  options.isServer = is_server;
  options.waitWorkers = false;
  options.timeout = timeout;
  if constexpr (HasUseLibUV<Options>::value) {
    options.useLibUV = false;
  }
  return options;
}

// lib/distributed uses these c10d APIs, which are the same in both versions: `TCPStore(host, options)`,
// `Store::set/get/add/check/wait(keys, timeout)`, `PrefixStore`, `ProcessGroupGloo::Options::create(timeout)` with
// `devices` and `threads`, `ProcessGroupGloo::createDeviceForHostname/ForInterface`, `ProcessGroupNCCL::Options::
// create()` with the `timeout` of its base, `AllreduceOptions`/`BroadcastOptions`, `c10d::Work::wait(timeout)`,
// `c10::intrusive_ptr::release()`. The timeouts mean the same too: Gloo's bounds each send and receive of a
// collective; the TCPStore's bounds connecting and `wait` (and the wait inside `get`), while `add`, `set`, `check`
// and the read of a `get` have no receive timeout in either version (the client socket gets none), which is why
// once the ranks have joined only the heartbeat thread makes store calls that wait for an answer.

/// Whether ATen's gradient-scaler kernels (`_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`) have
/// a CPU implementation: CUDA-only in 1.13, CPU too from 2.3 (`torch.amp.GradScaler("cpu")`). Where they do not,
/// dkit::GradScaler computes the same results with plain tensor operations.
constexpr bool kAmpScalerKernelsOnCpu = DKIT_TORCH_AT_LEAST(2, 3);

/// Whether CPU autocast can run in float16: 1.13 autocasts the CPU to bfloat16 only (Python warns and disables
/// autocast for float16 there); float16 came with 2.2 (pytorch/pytorch#112484).
constexpr bool kCpuAutocastFloat16 = DKIT_TORCH_AT_LEAST(2, 2);

// Autocast's thread-local state, per device type. 2.4 made it one API over the device type
// (`set_autocast_enabled(device_type, …)`, `set_autocast_dtype(device_type, …)`) and deprecated the per-device
// functions that 1.13 has (`set_cpu_enabled`/`set_autocast_cpu_dtype` for the CPU, `set_enabled`/
// `set_autocast_gpu_dtype` for CUDA). `increment_nesting`, `decrement_nesting`, `clear_cache` and
// `is/set_autocast_cache_enabled` are the same in both. Only the CPU and CUDA are handled (the caller checks).

/// Whether autocast is on for `device_type` (kCPU or kCUDA) in this thread.
inline bool autocast_enabled(c10::DeviceType device_type) {
#if DKIT_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device_type);
#else
  return device_type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

/// Turns autocast on or off for `device_type` (kCPU or kCUDA) in this thread.
inline void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
#if DKIT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device_type, enabled);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

/// The dtype autocast runs eligible ops in on `device_type` (kCPU or kCUDA) in this thread.
inline c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
#if DKIT_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device_type);
#else
  return device_type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                             : at::autocast::get_autocast_gpu_dtype();
#endif
}

/// Sets the dtype autocast runs eligible ops in on `device_type` (kCPU or kCUDA) in this thread.
inline void set_autocast_dtype(c10::DeviceType device_type, c10::ScalarType dtype) {
#if DKIT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device_type, dtype);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

// lib/data and lib/metrics use only APIs present in both versions: `at::cuda::CUDAEvent` (record, block,
// synchronize), `c10::cuda::getStreamFromPool(bool, DeviceIndex)`, `c10::cuda::CUDAStreamGuard`,
// `Tensor::record_stream`, pinned `at::empty`, and `c10::cuda::warning_state().set_sync_debug_mode()`. One
// difference is in values, not in the API: dkit::sample_order() is LibTorch's CPU `randperm`, whose algorithm is not
// promised to stay the same between versions, so a run resumed under another LibTorch version may visit the rest of
// an epoch in another order (tests/fixtures/sample_order.txt pins 1.13's).

} // namespace dkit::compat
