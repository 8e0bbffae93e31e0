#include <dkit/train/detail/bernoulli.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>

namespace dkit::detail {
namespace {

constexpr int kStateSize = at::MERSENNE_STATE_N;
constexpr int kShift = at::MERSENNE_STATE_M;

uint32_t twist(uint32_t u, uint32_t v) {
  return (((u & at::UMASK) | (v & at::LMASK)) >> 1) ^ (-(v & 1U) & at::MATRIX_A);
}

// at::mt19937_engine::next_state, in loops a compiler can vectorize.
void regenerate(uint32_t* s) {
  for (int i = 0; i < kStateSize - kShift; ++i) {
    s[i] = s[i + kShift] ^ twist(s[i], s[i + 1]);
  }
  for (int i = kStateSize - kShift; i < kStateSize - 1; ++i) {
    s[i] = s[i + kShift - kStateSize] ^ twist(s[i], s[i + 1]);
  }
  s[kStateSize - 1] = s[kShift - 1] ^ twist(s[kStateSize - 1], s[0]);
}

uint32_t temper(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

// The next `count` outputs of the engine whose data is `pod`, as count calls of at::mt19937_engine::operator()
// would give them and leave `pod`.
void draw(at::mt19937_data_pod& pod, uint32_t* out, int64_t count) {
  while (count > 0) {
    int64_t available = pod.left_ - 1;
    if (available == 0) {
      regenerate(pod.state_.data());
      pod.left_ = kStateSize + 1;
      pod.next_ = 0;
      available = kStateSize;
    }
    const int64_t take = std::min(available, count);
    const uint32_t* from = pod.state_.data() + pod.next_;
    for (int64_t i = 0; i < take; ++i) {
      out[i] = temper(from[i]);
    }
    pod.next_ += static_cast<uint32_t>(take);
    pod.left_ -= static_cast<int>(take);
    out += take;
    count -= take;
  }
}

// at::bernoulli_distribution<double>(p) on the CPU generator's random64(): two outputs, the first the high word,
// 53 bits of them scaled to [0, 1) by at::transformation::uniform_real, compared with p.
template <typename T>
void fill(T* out, int64_t count, double p, at::mt19937_data_pod& pod) {
  constexpr int64_t kChunk = 2048;
  std::array<uint32_t, 2 * kChunk> words{};
  constexpr uint64_t kMask = (uint64_t{1} << 53) - 1;
  constexpr double kDivisor = 1.0 / static_cast<double>(uint64_t{1} << 53);
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t n = std::min(kChunk, count - begin);
    draw(pod, words.data(), 2 * n);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t value = (static_cast<uint64_t>(words[2 * i]) << 32) | words[2 * i + 1];
      const double uniform = static_cast<double>(value & kMask) * kDivisor;
      out[begin + i] = static_cast<T>(static_cast<double>(uniform < p));
    }
  }
}

bool fill_unchecked(at::Tensor& out, double p, const at::Generator& generator) {
  const at::Generator& source = generator.defined() ? generator : at::detail::getDefaultCPUGenerator();
  if (!out.device().is_cpu() || !out.is_contiguous() || source.device().type() != at::kCPU) {
    return false;
  }
  const auto type = out.scalar_type();
  if (type != at::kFloat && type != at::kDouble && type != at::kBFloat16) {
    return false;
  }
  auto* impl = source.get<at::CPUGeneratorImpl>();
  const std::lock_guard<std::mutex> lock(impl->mutex_);
  at::mt19937 engine = impl->engine();
  at::mt19937_data_pod pod = engine.data();
  if (pod.left_ < 1 || pod.next_ + static_cast<uint32_t>(pod.left_) - 1 > static_cast<uint32_t>(kStateSize)) {
    return false;
  }
  const int64_t count = out.numel();
  switch (type) {
    case at::kFloat: fill(out.data_ptr<float>(), count, p, pod); break;
    case at::kDouble: fill(out.data_ptr<double>(), count, p, pod); break;
    default: fill(out.data_ptr<at::BFloat16>(), count, p, pod); break;
  }
  engine.set_data(pod);
  impl->set_engine(engine);
  return true;
}

bool check_against_bernoulli() {
  for (const auto type : {at::kFloat, at::kDouble, at::kBFloat16}) {
    for (const double p : {0.9, 0.5, 0.25}) {
      for (const int64_t size : {1, 311, 623, 624, 625, 1000, 5000}) {
        at::Generator theirs = at::detail::createCPUGenerator(1234 + size);
        at::Generator mine = at::detail::createCPUGenerator(1234 + size);
        // A draw first, so that the fills start inside a block rather than at its start.
        theirs.get<at::CPUGeneratorImpl>()->random();
        mine.get<at::CPUGeneratorImpl>()->random();
        at::Tensor expected = at::empty({size}, at::TensorOptions().dtype(type));
        at::Tensor actual = at::empty({size}, at::TensorOptions().dtype(type));
        expected.bernoulli_(p, theirs);
        if (!fill_unchecked(actual, p, mine) || !at::equal(expected, actual) ||
            theirs.get<at::CPUGeneratorImpl>()->random64() != mine.get<at::CPUGeneratorImpl>()->random64()) {
          return false;
        }
      }
    }
  }
  return true;
}

} // namespace

bool bernoulli_matches() {
  static const bool matches = check_against_bernoulli();
  return matches;
}

bool fill_bernoulli(at::Tensor& out, double p, const at::Generator& generator) {
  return bernoulli_matches() && fill_unchecked(out, p, generator);
}

} // namespace dkit::detail
