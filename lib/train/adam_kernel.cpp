#include <dkit/train/detail/adam_kernel.h>

#include <ATen/cpu/vec/vec.h>

#include <cmath>

// Compiled with -ffp-contract=off: every fused multiply-add below is written out, so that the rounding is the one
// LibTorch's kernels use and not the compiler's choice.

namespace dkit::detail::CPU_CAPABILITY {
namespace {

template <bool kFma>
float multiply_add(float a, float b, float c) {
  if constexpr (kFma) {
    return std::fma(a, b, c);
  } else {
    return a * b + c;
  }
}

float square_root(float x) {
  return std::sqrt(x);
}

// The baseline build runs the scalar loop alone: the generic Vectorized<float> is a loop over an array whose
// fmadd() rounds twice, and the compiler vectorizes the scalar loop better.
#if !defined(CPU_CAPABILITY_DEFAULT)
using Vec = at::vec::Vectorized<float>;

template <bool kFma>
Vec multiply_add(const Vec& a, const Vec& b, const Vec& c) {
  if constexpr (kFma) {
    return at::vec::fmadd(a, b, c);
  } else {
    return a * b + c;
  }
}

Vec square_root(const Vec& x) {
  return x.sqrt();
}
#endif

// One Adam update of an element (T = float) or of a vector of them (T = Vectorized<float>).
template <bool kFma, typename T>
void update_values(const AdamConstants& c, T& param, T grad, T& exp_avg, T& exp_avg_sq) {
  if (c.decoupled) {
    param = param * T(c.decay);
  }
  if (c.l2) {
    grad = multiply_add<kFma>(param, T(c.weight_decay), grad);
  }
  exp_avg = multiply_add<kFma>(grad, T(c.one_minus_beta1), exp_avg * T(c.beta1));
  exp_avg_sq = multiply_add<kFma>(T(c.one_minus_beta2) * grad, grad, exp_avg_sq * T(c.beta2));
  const T denom = square_root(exp_avg_sq) / T(c.bias_correction2_sqrt) + T(c.eps);
  param = param + T(c.neg_step_size) * exp_avg / denom;
}

template <bool kFma>
void update(const AdamSlot& s, int64_t begin, int64_t end) {
  int64_t i = begin;
#if !defined(CPU_CAPABILITY_DEFAULT)
  for (; i + Vec::size() <= end; i += Vec::size()) {
    Vec param = Vec::loadu(s.param + i);
    Vec exp_avg = Vec::loadu(s.exp_avg + i);
    Vec exp_avg_sq = Vec::loadu(s.exp_avg_sq + i);
    update_values<kFma>(s.constants, param, Vec::loadu(s.grad + i), exp_avg, exp_avg_sq);
    param.store(s.param + i);
    exp_avg.store(s.exp_avg + i);
    exp_avg_sq.store(s.exp_avg_sq + i);
  }
#endif
  for (; i < end; ++i) {
    update_values<kFma>(s.constants, s.param[i], s.grad[i], s.exp_avg[i], s.exp_avg_sq[i]);
  }
}

} // namespace

void adam_update(const AdamSlot& slot, int64_t begin, int64_t end, bool fused_multiply_add) {
  if (fused_multiply_add) {
    update<true>(slot, begin, end);
  } else {
    update<false>(slot, begin, end);
  }
}

} // namespace dkit::detail::CPU_CAPABILITY
