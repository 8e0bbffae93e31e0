#pragma once

// Internal to dkit (the update kernels of FusedSGD, FusedAdam and FusedAdamW, and their dispatch); not one of the
// installed headers.

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

/// One float32 parameter for Adam to update: its elements, its gradient, both moments (all contiguous, `numel`
/// long) and the step's constants.
struct AdamSlot {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t numel;
  AdamConstants constants;
};

/// The constants of one SGD step of a parameter group, rounded to float as LibTorch's kernels use them.
struct SgdConstants {
  /// Adds `weight_decay * param` to the gradient first.
  bool l2 = false;
  float weight_decay = 0;
  /// Keeps a momentum buffer: `buffer = momentum * buffer + one_minus_dampening * gradient`.
  bool momentum = false;
  float momentum_factor = 0;
  float one_minus_dampening = 1;
  /// The buffer is new: this step sets it to the gradient (LibTorch's first step clones it).
  bool first = false;
  /// Steps along `gradient + momentum * buffer` rather than along the buffer.
  bool nesterov = false;
  float neg_lr = 0;
};

/// One float32 parameter for SGD to update: its elements, its gradient and its momentum buffer (null without
/// momentum), all contiguous and `numel` long, and the step's constants.
struct SgdSlot {
  float* param;
  const float* grad;
  float* momentum_buffer;
  int64_t numel;
  SgdConstants constants;
};

// optim_kernels.cpp is compiled once per instruction set, as ATen compiles its CPU kernels
// (lib/train/CMakeLists.txt): each build puts its functions in the namespace its CPU_CAPABILITY names.

/// The update functions of one build. Each updates elements [begin, end) of a slot; `fused_multiply_add` rounds
/// each multiply-add once (as LibTorch's AVX2 and AVX-512 kernels do) rather than twice.
struct OptimKernelBuild {
  /// `default`, `avx2` or `avx512`.
  const char* name;
  /// Adam's and AdamW's update.
  void (*adam_update)(const AdamSlot& slot, int64_t begin, int64_t end, bool fused_multiply_add);
  /// SGD's update.
  void (*sgd_update)(const SgdSlot& slot, int64_t begin, int64_t end, bool fused_multiply_add);
};

namespace DEFAULT {
/// This build's functions, for any CPU.
OptimKernelBuild build();
} // namespace DEFAULT

namespace AVX2 {
/// This build's functions, for AVX2 and FMA.
OptimKernelBuild build();
} // namespace AVX2

namespace AVX512 {
/// This build's functions, for AVX-512 (F, BW, VL, DQ) and FMA.
OptimKernelBuild build();
} // namespace AVX512

/// The builds compiled into dkit that this CPU runs, the baseline first and the widest, which the fused
/// optimizers use, last.
std::vector<OptimKernelBuild> optim_kernel_builds();

} // namespace dkit::detail
