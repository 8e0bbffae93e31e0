#include <dkit/train/detail/optim_kernels.h>

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

// The baseline build runs the scalar loops alone: the generic Vectorized<float> is a loop over an array whose
// fmadd() rounds twice, and the compiler vectorizes the scalar loops better.
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

// Whether every element of x is +0 or lies in [low, high] (a NaN does not).
bool all_positive_zero_or_within(const Vec& x, float low, float high) {
#if defined(CPU_CAPABILITY_AVX512)
  const __mmask16 positive_zero = _mm512_cmpeq_epi32_mask(_mm512_castps_si512(x), _mm512_setzero_si512());
  return ((_mm512_cmp_ps_mask(x, _mm512_set1_ps(low), _CMP_GE_OQ) &
           _mm512_cmp_ps_mask(x, _mm512_set1_ps(high), _CMP_LE_OQ)) |
          positive_zero) == 0xffff;
#else
  const Vec positive_zero =
      _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_castps_si256(x), _mm256_setzero_si256()));
  return (((x >= Vec(low)) & (x <= Vec(high))) | positive_zero).zero_mask() == 0;
#endif
}
#endif

// x / c for a constant c, rounded as the division rounds it.
class ConstantDivisor {
 public:
  explicit ConstantDivisor(float c)
      : c_(c)
#if !defined(CPU_CAPABILITY_DEFAULT)
        ,
        by_reciprocal_(c >= 0x1p-20f && c <= 1.0f),
        vec_c_(c),
        neg_c_(-c),
        reciprocal_(1.0f / c)
#endif
  {
  }

  float operator()(float x) const {
    return x / c_;
  }

#if !defined(CPU_CAPABILITY_DEFAULT)
  // Without a division, from the reciprocal r = 1/c rounded: q = x * r is within two ulps of x / c; a first
  // correction, fma(fma(-c, q, x), r, q), brings it within one; a second, whose remainder fma(-c, q, x) is then
  // exact, is the correctly rounded quotient (Markstein's theorem). That holds while nothing under- or overflows,
  // which c in [2^-20, 1] and x in [2^-60, 2^100] guarantee; +0 comes out +0, and a vector with any other element
  // (-0, a subnormal, an infinity, a NaN) divides.
  Vec operator()(const Vec& x) const {
    if (!by_reciprocal_ || !all_positive_zero_or_within(x, 0x1p-60f, 0x1p100f)) {
      return x / vec_c_;
    }
    const Vec estimate = x * reciprocal_;
    const Vec within_one_ulp = at::vec::fmadd(at::vec::fmadd(neg_c_, estimate, x), reciprocal_, estimate);
    return at::vec::fmadd(at::vec::fmadd(neg_c_, within_one_ulp, x), reciprocal_, within_one_ulp);
  }
#endif

 private:
  float c_;
#if !defined(CPU_CAPABILITY_DEFAULT)
  bool by_reciprocal_;
  Vec vec_c_;
  Vec neg_c_;
  Vec reciprocal_;
#endif
};

// One Adam update of an element (T = float) or of a vector of them (T = Vectorized<float>), as
// torch::optim::Adam's and AdamW's operations compute it.
template <bool kFma, typename T>
void adam_values(const AdamConstants& c, const ConstantDivisor& divide, T& param, T grad, T& exp_avg, T& exp_avg_sq) {
  if (c.decoupled) {
    param = param * T(c.decay);
  }
  if (c.l2) {
    grad = multiply_add<kFma>(param, T(c.weight_decay), grad);
  }
  exp_avg = multiply_add<kFma>(grad, T(c.one_minus_beta1), exp_avg * T(c.beta1));
  exp_avg_sq = multiply_add<kFma>(T(c.one_minus_beta2) * grad, grad, exp_avg_sq * T(c.beta2));
  const T denom = divide(square_root(exp_avg_sq)) + T(c.eps);
  param = param + T(c.neg_step_size) * exp_avg / denom;
}

// One SGD update, as torch::optim::SGD's operations compute it: `d = grad.add(param, weight_decay)`,
// `buffer.mul_(momentum).add_(d, 1 - dampening)` (a copy of d on the first step), `d = d.add(buffer, momentum)`
// with Nesterov or `d = buffer` without, `param.add_(d, -lr)`; each add with a factor is a multiply-add.
template <bool kFma, typename T>
void sgd_values(const SgdConstants& c, T& param, T grad, T* buffer) {
  if (c.l2) {
    grad = multiply_add<kFma>(param, T(c.weight_decay), grad);
  }
  if (c.momentum) {
    *buffer = c.first ? grad : multiply_add<kFma>(grad, T(c.one_minus_dampening), *buffer * T(c.momentum_factor));
    grad = c.nesterov ? multiply_add<kFma>(*buffer, T(c.momentum_factor), grad) : *buffer;
  }
  param = multiply_add<kFma>(grad, T(c.neg_lr), param);
}

template <bool kFma>
void adam_range(const AdamSlot& slot, int64_t begin, int64_t end) {
  // A copy: the compiler reloads the pointers of `slot` after every store otherwise.
  const AdamSlot s = slot;
  const ConstantDivisor divide(s.constants.bias_correction2_sqrt);
  int64_t i = begin;
#if !defined(CPU_CAPABILITY_DEFAULT)
  for (; i + Vec::size() <= end; i += Vec::size()) {
    Vec param = Vec::loadu(s.param + i);
    Vec exp_avg = Vec::loadu(s.exp_avg + i);
    Vec exp_avg_sq = Vec::loadu(s.exp_avg_sq + i);
    adam_values<kFma>(s.constants, divide, param, Vec::loadu(s.grad + i), exp_avg, exp_avg_sq);
    param.store(s.param + i);
    exp_avg.store(s.exp_avg + i);
    exp_avg_sq.store(s.exp_avg_sq + i);
  }
#endif
  for (; i < end; ++i) {
    adam_values<kFma>(s.constants, divide, s.param[i], s.grad[i], s.exp_avg[i], s.exp_avg_sq[i]);
  }
}

template <bool kFma>
void sgd_range(const SgdSlot& slot, int64_t begin, int64_t end) {
  // A copy: the compiler reloads the pointers of `slot` after every store otherwise.
  const SgdSlot s = slot;
  int64_t i = begin;
#if !defined(CPU_CAPABILITY_DEFAULT)
  for (; i + Vec::size() <= end; i += Vec::size()) {
    Vec param = Vec::loadu(s.param + i);
    Vec buffer = s.constants.momentum && !s.constants.first ? Vec::loadu(s.momentum_buffer + i) : Vec(0);
    sgd_values<kFma>(s.constants, param, Vec::loadu(s.grad + i), &buffer);
    param.store(s.param + i);
    if (s.constants.momentum) {
      buffer.store(s.momentum_buffer + i);
    }
  }
#endif
  float unused = 0;
  for (; i < end; ++i) {
    sgd_values<kFma>(s.constants, s.param[i], s.grad[i], s.constants.momentum ? &s.momentum_buffer[i] : &unused);
  }
}

void adam_update(const AdamSlot& slot, int64_t begin, int64_t end, bool fused_multiply_add) {
  if (fused_multiply_add) {
    adam_range<true>(slot, begin, end);
  } else {
    adam_range<false>(slot, begin, end);
  }
}

void sgd_update(const SgdSlot& slot, int64_t begin, int64_t end, bool fused_multiply_add) {
  if (fused_multiply_add) {
    sgd_range<true>(slot, begin, end);
  } else {
    sgd_range<false>(slot, begin, end);
  }
}

} // namespace

OptimKernelBuild build() {
#if defined(CPU_CAPABILITY_AVX512)
  const char* name = "avx512";
#elif defined(CPU_CAPABILITY_AVX2)
  const char* name = "avx2";
#else
  const char* name = "default";
#endif
  return {name, &adam_update, &sgd_update};
}

} // namespace dkit::detail::CPU_CAPABILITY
