#include <dkit/train/detail/optim_kernels.h>

#include "../support.h"

#include <cmath>
#include <limits>

namespace dkit {
namespace {

using detail::AdamConstants;
using detail::AdamSlot;
using detail::SgdConstants;
using detail::SgdSlot;

constexpr int64_t kSize = 1003;

/// Adam's constants at step 3 with betas (0.9, 0.999); `mode` 1 adds an L2 penalty, 2 decoupled weight decay.
AdamConstants adam_constants(int mode) {
  AdamConstants c;
  c.beta1 = 0.9F;
  c.one_minus_beta1 = 0.1F;
  c.beta2 = 0.999F;
  c.one_minus_beta2 = 0.001F;
  c.bias_correction2_sqrt = 0.0547449F;
  c.eps = 1e-8F;
  c.neg_step_size = -0.0036900369F;
  c.l2 = mode == 1;
  c.weight_decay = mode == 1 ? 0.01F : 0.0F;
  c.decoupled = mode == 2;
  c.decay = mode == 2 ? 0.99999F : 1.0F;
  return c;
}

/// SGD's constants: `mode` 0 plain, 1 momentum with dampening and weight decay, 2 Nesterov with weight decay, 3
/// the first step with momentum.
SgdConstants sgd_constants(int mode) {
  SgdConstants c;
  c.neg_lr = -0.05F;
  c.l2 = mode != 0;
  c.weight_decay = mode != 0 ? 0.01F : 0.0F;
  c.momentum = mode != 0;
  c.momentum_factor = mode != 0 ? 0.9F : 0.0F;
  c.one_minus_dampening = mode == 1 ? 0.9F : 1.0F;
  c.nesterov = mode == 2;
  c.first = mode == 3;
  return c;
}

/// Runs `update` of every build over [0, 517) then [517, kSize), ranges that start and end in the middle of a
/// vector, on copies of `state`; the results of each build, in the order of the builds.
template <typename Update>
std::vector<std::vector<at::Tensor>> run_builds(const std::vector<at::Tensor>& state, Update update) {
  std::vector<std::vector<at::Tensor>> results;
  for (const auto& build : detail::optim_kernel_builds()) {
    std::vector<at::Tensor> copy;
    for (const auto& tensor : state) {
      copy.push_back(tensor.clone());
    }
    update(build, copy, 0, 517);
    update(build, copy, 517, kSize);
    results.push_back(std::move(copy));
  }
  return results;
}

void expect_same_as_baseline(const std::vector<std::vector<at::Tensor>>& results, const at::Tensor& param) {
  const auto builds = detail::optim_kernel_builds();
  for (size_t b = 1; b < results.size(); ++b) {
    SCOPED_TRACE(::testing::Message() << builds[b].name);
    EXPECT_FALSE(at::equal(results[b][0], param));
    for (size_t t = 0; t < results[b].size(); ++t) {
      EXPECT_TRUE(at::equal(results[b][t], results[0][t])) << "tensor " << t;
    }
  }
}

// The baseline build is a scalar loop; every wider build this CPU runs must update bitwise as it does.
TEST(OptimKernelsTest, EveryBuildUpdatesAdamBitwiseAsTheBaseline) {
  const auto builds = detail::optim_kernel_builds();
  ASSERT_FALSE(builds.empty());
  EXPECT_STREQ(builds.front().name, "default");
  torch::manual_seed(0);
  const at::Tensor param = torch::randn({kSize});
  const at::Tensor grad = torch::randn({kSize}) * 0.1;
  const std::vector<at::Tensor> state = {param, torch::randn({kSize}) * 0.01, torch::rand({kSize}) * 0.001};
  for (const bool fma : {true, false}) {
    for (const int mode : {0, 1, 2}) {
      SCOPED_TRACE(::testing::Message() << "fma " << fma << ", mode " << mode);
      expect_same_as_baseline(
          run_builds(state,
                     [&](const detail::OptimKernelBuild& build, std::vector<at::Tensor>& t, int64_t begin,
                         int64_t end) {
                       const AdamSlot slot{t[0].data_ptr<float>(), grad.data_ptr<float>(), t[1].data_ptr<float>(),
                                           t[2].data_ptr<float>(), kSize, adam_constants(mode)};
                       build.adam_update(slot, begin, end, fma);
                     }),
          param);
    }
  }
}

// The wider builds divide by the bias correction through its reciprocal where that rounds as the division does;
// every second moment from zero (among others in range, and alone) through subnormals and the bounds of that range
// to infinity and NaN, and divisors inside and outside it, must still give the baseline's bits.
TEST(OptimKernelsTest, EveryBuildDividesByTheBiasCorrectionAsTheBaselineAtEveryScale) {
  torch::manual_seed(0);
  const at::Tensor exponents = torch::randint(-149, 128, {kSize}).to(at::kFloat);
  at::Tensor exp_avg_sq = torch::exp2(exponents) * (1 + torch::rand({kSize}));
  exp_avg_sq.narrow(0, 0, 512).copy_(torch::exp2(torch::randint(-120, 127, {512}).to(at::kFloat)) *
                                     (1 + torch::rand({512})));
  exp_avg_sq.narrow(0, 0, 512).masked_fill_(torch::rand({512}) < 0.2, 0.0);
  const std::vector<float> edges = {-0.0F,     std::numeric_limits<float>::denorm_min(),
                                    0x1p-120F, 0x1p-121F,
                                    0x1p127F,  std::numeric_limits<float>::max(),
                                    INFINITY,  std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < edges.size(); ++i) {
    exp_avg_sq[static_cast<int64_t>(600 + 37 * i)] = edges[i];
  }
  const at::Tensor param = torch::randn({kSize});
  const at::Tensor grad = torch::zeros({kSize});
  const std::vector<at::Tensor> state = {param, torch::randn({kSize}), exp_avg_sq};
  for (const float divisor : {0.0316227F, 0.0547449F, 0.99999994F, 1.0F, 0x1p-20F, 0x1.fffffep-21F, 1e-7F}) {
    SCOPED_TRACE(::testing::Message() << "bias_correction2_sqrt " << divisor);
    AdamConstants c = adam_constants(0);
    c.bias_correction2_sqrt = divisor;
    c.beta2 = 1.0F;
    c.one_minus_beta2 = 0.0F;
    const auto results = run_builds(state, [&](const detail::OptimKernelBuild& build, std::vector<at::Tensor>& t,
                                               int64_t begin, int64_t end) {
      const AdamSlot slot{t[0].data_ptr<float>(), grad.data_ptr<float>(), t[1].data_ptr<float>(),
                          t[2].data_ptr<float>(), kSize, c};
      build.adam_update(slot, begin, end, true);
    });
    for (size_t b = 1; b < results.size(); ++b) {
      EXPECT_TRUE(at::equal(results[b][0].view(at::kInt), results[0][0].view(at::kInt)))
          << detail::optim_kernel_builds()[b].name;
    }
    EXPECT_EQ(at::isnan(results[0][0]).sum().item<int64_t>(), 1) << "the NaN moment alone";
  }
}

TEST(OptimKernelsTest, EveryBuildUpdatesSgdBitwiseAsTheBaseline) {
  torch::manual_seed(0);
  const at::Tensor param = torch::randn({kSize});
  const at::Tensor grad = torch::randn({kSize}) * 0.1;
  const std::vector<at::Tensor> state = {param, torch::randn({kSize}) * 0.01};
  for (const bool fma : {true, false}) {
    for (const int mode : {0, 1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "fma " << fma << ", mode " << mode);
      const auto results = run_builds(state, [&](const detail::OptimKernelBuild& build, std::vector<at::Tensor>& t,
                                                 int64_t begin, int64_t end) {
        const SgdConstants c = sgd_constants(mode);
        const SgdSlot slot{t[0].data_ptr<float>(), grad.data_ptr<float>(),
                           c.momentum ? t[1].data_ptr<float>() : nullptr, kSize, c};
        build.sgd_update(slot, begin, end, fma);
      });
      expect_same_as_baseline(results, param);
      if (mode == 0) {
        EXPECT_TRUE(at::equal(results[0][1], state[1])) << "no momentum: the buffer is not touched";
      }
      if (mode == 3) {
        EXPECT_TRUE(torch::allclose(results[0][1], grad + param * 0.01)) << "the first step's buffer is the gradient";
      }
    }
  }
}

} // namespace
} // namespace dkit
