#pragma once

// The differences between the LibTorch versions dkit builds against (Debian's 1.13, the PyTorch wheels' 2.x)
// live here, so that the rest of the code is written once.

#include <dkit/config.h>
#include <torch/version.h>

/// 1 when the LibTorch being compiled against is at least MAJOR.MINOR.
#define DKIT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace dkit::compat {

/// Index of the aggregate entry in the caching allocator's per-pool statistic arrays: `StatType::AGGREGATE`
/// moved from `c10::cuda::CUDACachingAllocator` (1.13) to `c10::CachingAllocator` (2.x), its value did not.
constexpr size_t kAggregateStat = 0;

} // namespace dkit::compat
