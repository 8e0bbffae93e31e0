#pragma once

#include <dkit/device/device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
} // namespace torch::nn

namespace dkit {
class ProcessGroupContext;
} // namespace dkit

namespace dkit::detail {

/// A number every rank of a run must agree on before the first step.
struct StartFact {
  /// What it is, for the error: `step`, `data checksum`.
  const char* name;
  /// Its value on this rank.
  int64_t value;
  /// Whether `value` is a fingerprint() rather than a number people read.
  bool hashed = false;
};

/// Makes every rank start from rank 0's weights (one broadcast of the parameters and buffers of `model`), then
/// checks that every rank's `facts` equal rank 0's (one broadcast); the error names this rank and the first fact
/// that differs.
void agree_on_start(ProcessGroupContext& group, torch::nn::Module& model, const std::vector<StartFact>& facts,
                    const Device& device);

/// A 63-bit FNV-1a hash of `text`, for a StartFact.
int64_t fingerprint(const std::string& text);

} // namespace dkit::detail
