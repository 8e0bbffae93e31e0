#include <dkit/train/optim.h>

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/config.h>
#include <dkit/core/compat.h>

#include "../support.h"

namespace dkit {
namespace {

class FusedAdamTest : public test::SeedingFixture {
 protected:
  /// Parameters shaped like the digits MLP's, with sizes that leave partial vectors and blocks.
  static std::vector<at::Tensor> parameters() {
    std::vector<at::Tensor> params;
    for (const auto& shape : std::vector<std::vector<int64_t>>{{256, 64}, {256}, {300, 37}, {10, 256}, {10}, {3}}) {
      params.push_back(torch::randn(shape).set_requires_grad(true));
    }
    return params;
  }

  static std::vector<at::Tensor> copies(const std::vector<at::Tensor>& params) {
    std::vector<at::Tensor> out;
    for (const auto& p : params) {
      out.push_back(p.detach().clone().set_requires_grad(true));
    }
    return out;
  }

  /// Runs `steps` steps of both optimizers with the same random gradients; every parameter and state tensor must
  /// stay bitwise equal.
  template <typename Reference, typename Fused, typename Options, typename State>
  static void expect_same_steps(const Options& options, int64_t steps, int threads) {
    const int previous_threads = at::get_num_threads();
    at::set_num_threads(threads);
    auto reference_params = parameters();
    auto fused_params = copies(reference_params);
    Reference reference(reference_params, options);
    Fused fused(fused_params, options);
    for (int64_t step = 0; step < steps; ++step) {
      for (size_t i = 0; i < reference_params.size(); ++i) {
        const at::Tensor grad = torch::randn_like(reference_params[i]) * (step % 3 == 0 ? 1e-3 : 1.0);
        reference_params[i].mutable_grad() = grad.clone();
        fused_params[i].mutable_grad() = grad.clone();
      }
      reference.step();
      fused.step();
    }
    at::set_num_threads(previous_threads);
    for (size_t i = 0; i < reference_params.size(); ++i) {
      EXPECT_TRUE(torch::equal(reference_params[i], fused_params[i])) << "parameter " << i;
      using Key = typename std::decay_t<decltype(reference.state())>::key_type;
      const auto& a = static_cast<const State&>(*reference.state().at(compat::optimizer_state_key<Key>(reference_params[i])));
      const auto& b = static_cast<const State&>(*fused.state().at(compat::optimizer_state_key<Key>(fused_params[i])));
      EXPECT_EQ(a.step(), b.step());
      EXPECT_TRUE(torch::equal(a.exp_avg(), b.exp_avg())) << "exp_avg " << i;
      EXPECT_TRUE(torch::equal(a.exp_avg_sq(), b.exp_avg_sq())) << "exp_avg_sq " << i;
    }
  }
};

using torch::optim::Adam;
using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

TEST_F(FusedAdamTest, UsesItsOwnKernelOnThisMachine) {
#if defined(__x86_64__)
  EXPECT_NE(fused_adam_kernel(), FusedAdamKernel::kNone) << "LibTorch's Adam rounds in a way dkit does not know";
#endif
  EXPECT_EQ(to_string(FusedAdamKernel::kFusedMultiplyAdd), "fma");
  EXPECT_EQ(to_string(FusedAdamKernel::kSeparateRounding), "separate");
  EXPECT_EQ(to_string(FusedAdamKernel::kNone), "none");
}

TEST_F(FusedAdamTest, KernelLoopsRunOnEveryIntraOpThreadWhenBuiltWithOpenMp) {
  const int previous = at::get_num_threads();
  at::set_num_threads(2);
  const int used = kernel_threads();
  at::set_num_threads(previous);
  EXPECT_EQ(used, DKIT_WITH_OPENMP ? 2 : 1);
}

TEST_F(FusedAdamTest, StepsAreBitwiseThoseOfTorchAdam) {
  expect_same_steps<Adam, FusedAdam, AdamOptions, AdamParamState>(AdamOptions(1e-3), 25, 1);
}

TEST_F(FusedAdamTest, StepsAreBitwiseThoseOfTorchAdamOnTwoThreads) {
  expect_same_steps<Adam, FusedAdam, AdamOptions, AdamParamState>(AdamOptions(1e-3), 25, 2);
}

TEST_F(FusedAdamTest, WeightDecayAndOtherBetasAreBitwiseThoseOfTorchAdam) {
  expect_same_steps<Adam, FusedAdam, AdamOptions, AdamParamState>(
      AdamOptions(3e-2).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.05), 20, 2);
}

TEST_F(FusedAdamTest, AdamWStepsAreBitwiseThoseOfTorchAdamW) {
  expect_same_steps<AdamW, FusedAdamW, AdamWOptions, AdamWParamState>(AdamWOptions(1e-3).weight_decay(0.01), 20, 2);
  expect_same_steps<AdamW, FusedAdamW, AdamWOptions, AdamWParamState>(AdamWOptions(1e-3).weight_decay(0), 5, 1);
}

TEST_F(FusedAdamTest, AmsgradFallsBackToTorchAdam) {
  expect_same_steps<Adam, FusedAdam, AdamOptions, AdamParamState>(AdamOptions(1e-3).amsgrad(true), 10, 1);
}

TEST_F(FusedAdamTest, NonContiguousParameterFallsBackToTorchAdam) {
  const at::Tensor base = torch::randn({6, 8});
  at::Tensor reference_param = base.clone().t().set_requires_grad(true);
  at::Tensor fused_param = base.clone().t().set_requires_grad(true);
  ASSERT_FALSE(fused_param.is_contiguous());
  Adam reference({reference_param}, AdamOptions(1e-2));
  FusedAdam fused({fused_param}, AdamOptions(1e-2));
  for (int step = 0; step < 5; ++step) {
    const at::Tensor grad = torch::randn({8, 6});
    reference_param.mutable_grad() = grad.clone();
    fused_param.mutable_grad() = grad.clone();
    reference.step();
    fused.step();
  }
  EXPECT_TRUE(torch::equal(reference_param, fused_param));
}

TEST_F(FusedAdamTest, SkipsParametersWithoutGradientAndReturnsTheClosuresLoss) {
  at::Tensor a = torch::ones({4}).set_requires_grad(true);
  at::Tensor b = torch::ones({4}).set_requires_grad(true);
  FusedAdam optimizer({a, b}, AdamOptions(0.1));
  const at::Tensor loss = optimizer.step([&] {
    optimizer.zero_grad();
    at::Tensor value = (a * 2).sum();
    value.backward();
    return value;
  });
  EXPECT_EQ(loss.item<float>(), 8.0f);
  EXPECT_TRUE(torch::allclose(a, torch::full({4}, 0.9f)));
  EXPECT_TRUE(torch::equal(b, torch::ones({4})));
  EXPECT_EQ(optimizer.state().size(), 1u);
}

TEST_F(FusedAdamTest, IsATorchAdamWhoseStateRoundTripsThroughATrainingCheckpoint) {
  auto params = parameters();
  FusedAdam optimizer(params, AdamOptions(1e-3));
  for (int step = 0; step < 3; ++step) {
    for (auto& p : params) {
      p.mutable_grad() = torch::randn_like(p);
    }
    optimizer.step();
  }
  const PickleValue saved = optimizer_state_dict(optimizer);
  auto resumed_params = copies(params);
  FusedAdam resumed(resumed_params, AdamOptions(1e-3));
  load_optimizer_state_dict(resumed, saved, "test");
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor grad = torch::randn_like(params[i]);
      params[i].mutable_grad() = grad.clone();
      resumed_params[i].mutable_grad() = grad.clone();
    }
    optimizer.step();
    resumed.step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], resumed_params[i])) << "parameter " << i;
  }
}

} // namespace
} // namespace dkit
