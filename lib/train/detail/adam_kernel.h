#pragma once

// Internal to dkit (FusedAdam's update kernel and its dispatch); not one of the installed headers.

#include <cstdint>
#include <vector>

namespace dkit::detail {

/// The per-parameter constants of one Adam or AdamW step, rounded to float as LibTorch's kernels use them.
struct AdamConstants {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float bias_correction2_sqrt = 1;
  float eps = 0;
  float neg_step_size = 0;
  bool l2 = false;
  float weight_decay = 0;
  bool decoupled = false;
  float decay = 1;
};

/// One float32 parameter to update: its elements, its gradient, both moments (all contiguous, `numel` long) and
/// the step's constants.
struct AdamSlot {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t numel;
  AdamConstants constants;
};

// adam_kernel.cpp is compiled once per instruction set, as ATen compiles its CPU kernels (lib/train/CMakeLists.txt):
// each build puts adam_update() in the namespace its CPU_CAPABILITY names.

namespace DEFAULT {
/// Updates elements [begin, end) of `slot`; `fused_multiply_add` rounds each multiply-add once (as LibTorch's
/// AVX2 and AVX-512 kernels do) rather than twice. Built for any CPU.
void adam_update(const AdamSlot& slot, int64_t begin, int64_t end, bool fused_multiply_add);
} // namespace DEFAULT

namespace AVX2 {
/// DEFAULT::adam_update() built for AVX2 and FMA.
void adam_update(const AdamSlot& slot, int64_t begin, int64_t end, bool fused_multiply_add);
} // namespace AVX2

namespace AVX512 {
/// DEFAULT::adam_update() built for AVX-512 (F, BW, VL, DQ) and FMA.
void adam_update(const AdamSlot& slot, int64_t begin, int64_t end, bool fused_multiply_add);
} // namespace AVX512

/// One build of adam_update().
struct AdamKernelBuild {
  /// `default`, `avx2` or `avx512`.
  const char* name;
  /// That build's adam_update().
  void (*update)(const AdamSlot& slot, int64_t begin, int64_t end, bool fused_multiply_add);
};

/// The builds of adam_update() compiled into dkit that this CPU runs, the baseline first and the widest, which
/// FusedAdam uses, last.
std::vector<AdamKernelBuild> adam_kernel_builds();

} // namespace dkit::detail
