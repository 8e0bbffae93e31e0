#pragma once

// The differences between the LibTorch versions dkit builds against (Debian's 1.13, the PyTorch wheels' 2.x)
// live here, so that the rest of the code is written once.

#include <dkit/config.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>

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

// lib/data and lib/metrics use only APIs present in both versions: `at::cuda::CUDAEvent` (record, block,
// synchronize), `c10::cuda::getStreamFromPool(bool, DeviceIndex)`, `c10::cuda::CUDAStreamGuard`,
// `Tensor::record_stream`, pinned `at::empty`, and `c10::cuda::warning_state().set_sync_debug_mode()`. One
// difference is in values, not in the API: dkit::sample_order() is LibTorch's CPU `randperm`, whose algorithm is not
// promised to stay the same between versions, so a run resumed under another LibTorch version may visit the rest of
// an epoch in another order (tests/fixtures/sample_order.txt pins 1.13's).

} // namespace dkit::compat
