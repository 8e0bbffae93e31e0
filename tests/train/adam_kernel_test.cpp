#include <dkit/train/detail/adam_kernel.h>

#include "../support.h"

namespace dkit {
namespace {

using detail::AdamConstants;
using detail::AdamSlot;

/// Adam's constants at step 3 with betas (0.9, 0.999); `mode` 1 adds an L2 penalty, 2 decoupled weight decay.
AdamConstants constants(int mode) {
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

// The baseline build is a scalar loop; every wider build this CPU runs must update bitwise
// as it does, over ranges that start and end in the middle of a vector.
TEST(AdamKernelTest, EveryBuildUpdatesBitwiseAsTheBaseline) {
  const auto builds = detail::adam_kernel_builds();
  ASSERT_FALSE(builds.empty());
  EXPECT_STREQ(builds.front().name, "default");
  constexpr int64_t kSize = 1003;
  torch::manual_seed(0);
  const at::Tensor param = torch::randn({kSize});
  const at::Tensor grad = torch::randn({kSize}) * 0.1;
  const at::Tensor exp_avg = torch::randn({kSize}) * 0.01;
  const at::Tensor exp_avg_sq = torch::rand({kSize}) * 0.001;
  for (const bool fma : {true, false}) {
    for (const int mode : {0, 1, 2}) {
      std::vector<std::vector<at::Tensor>> results;
      for (const auto& build : builds) {
        std::vector<at::Tensor> state = {param.clone(), exp_avg.clone(), exp_avg_sq.clone()};
        const AdamSlot slot{state[0].data_ptr<float>(), grad.data_ptr<float>(), state[1].data_ptr<float>(),
                            state[2].data_ptr<float>(), kSize, constants(mode)};
        build.update(slot, /*begin=*/0, /*end=*/517, fma);
        build.update(slot, /*begin=*/517, /*end=*/kSize, fma);
        results.push_back(std::move(state));
      }
      for (size_t b = 1; b < builds.size(); ++b) {
        SCOPED_TRACE(::testing::Message() << builds[b].name << ", fma " << fma << ", mode " << mode);
        EXPECT_FALSE(at::equal(results[b][0], param));
        for (size_t t = 0; t < results[b].size(); ++t) {
          EXPECT_TRUE(at::equal(results[b][t], results[0][t])) << "tensor " << t;
        }
      }
    }
  }
}

} // namespace
} // namespace dkit
