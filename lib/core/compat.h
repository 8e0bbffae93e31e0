#pragma once

// The differences between the LibTorch versions dkit builds against (Debian's 1.13, the PyTorch wheels' 2.x)
// live here, so that the rest of the code is written once.

#include <dkit/config.h>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <sstream>
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
/// parameter's TensorImpl printed to a string in 1.13 (`c10::guts::to_string`), the address itself in 2.x. `Key`
/// is the state map's `key_type`.
template <typename Key, typename TensorType>
Key optimizer_state_key(const TensorType& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << param.unsafeGetTensorImpl();
    return out.str();
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
// create()` with the `timeout` of its base, `AllreduceOptions`/`BroadcastOptions`, `c10d::Work::wait(timeout)`.

// lib/data and lib/metrics use only APIs present in both versions: `at::cuda::CUDAEvent` (record, block,
// synchronize), `c10::cuda::getStreamFromPool(bool, DeviceIndex)`, `c10::cuda::CUDAStreamGuard`,
// `Tensor::record_stream`, pinned `at::empty`, and `c10::cuda::warning_state().set_sync_debug_mode()`. One
// difference is in values, not in the API: dkit::sample_order() is LibTorch's CPU `randperm`, whose algorithm is not
// promised to stay the same between versions, so a run resumed under another LibTorch version may visit the rest of
// an epoch in another order (tests/fixtures/sample_order.txt pins 1.13's).

} // namespace dkit::compat
