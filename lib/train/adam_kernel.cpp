#include <dkit/train/adam_kernel.h>

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>

// Compiled with -ffp-contract=off: every fused multiply-add below is written out, so that the rounding is the one
// LibTorch's kernels use and not the compiler's choice.

namespace dkit::detail::CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;

template <bool kFma>
Vec multiply_add(const Vec& a, const Vec& b, const Vec& c) {
  if constexpr (!kFma) {
    return a * b + c;
  } else {
#if defined(CPU_CAPABILITY_DEFAULT)
    // The generic Vectorized<float>'s fmadd() rounds the product and the sum separately.
    float x[Vec::size()];
    float y[Vec::size()];
    float z[Vec::size()];
    a.store(x);
    b.store(y);
    c.store(z);
    for (int i = 0; i < Vec::size(); ++i) {
      x[i] = std::fma(x[i], y[i], z[i]);
    }
    return Vec::loadu(x);
#else
    return at::vec::fmadd(a, b, c);
#endif
  }
}

template <bool kFma>
void update(const AdamSlot& s, int64_t begin, int64_t end) {
  const AdamConstants& c = s.constants;
  const Vec beta1(c.beta1);
  const Vec one_minus_beta1(c.one_minus_beta1);
  const Vec beta2(c.beta2);
  const Vec one_minus_beta2(c.one_minus_beta2);
  const Vec bias_correction2_sqrt(c.bias_correction2_sqrt);
  const Vec eps(c.eps);
  const Vec neg_step_size(c.neg_step_size);
  const Vec weight_decay(c.weight_decay);
  const Vec decay(c.decay);
  const auto update_vector = [&](int64_t i, int count) {
    Vec param = Vec::loadu(s.param + i, count);
    if (c.decoupled) {
      param = param * decay;
    }
    Vec grad = Vec::loadu(s.grad + i, count);
    if (c.l2) {
      grad = multiply_add<kFma>(param, weight_decay, grad);
    }
    const Vec exp_avg = multiply_add<kFma>(grad, one_minus_beta1, Vec::loadu(s.exp_avg + i, count) * beta1);
    const Vec exp_avg_sq =
        multiply_add<kFma>(one_minus_beta2 * grad, grad, Vec::loadu(s.exp_avg_sq + i, count) * beta2);
    const Vec denom = exp_avg_sq.sqrt() / bias_correction2_sqrt + eps;
    param = param + neg_step_size * exp_avg / denom;
    param.store(s.param + i, count);
    exp_avg.store(s.exp_avg + i, count);
    exp_avg_sq.store(s.exp_avg_sq + i, count);
  };
  int64_t i = begin;
  for (; i + Vec::size() <= end; i += Vec::size()) {
    update_vector(i, Vec::size());
  }
  if (i < end) {
    update_vector(i, static_cast<int>(end - i));
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
