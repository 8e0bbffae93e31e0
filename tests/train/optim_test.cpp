#include <dkit/train/optim.h>

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/config.h>
#include <dkit/core/compat.h>
#include <dkit/device/report.h>
#include <dkit/train/detail/optim_kernels.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "../support.h"

namespace dkit {
namespace {

class FusedOptimizerTest : public test::SeedingFixture {
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

  /// Runs `steps` steps of both optimizers with the same random gradients; every parameter must stay bitwise
  /// equal, and `same_state` is asked about each parameter's state in both.
  template <typename Reference, typename Fused, typename Options, typename SameState>
  static void expect_same_steps(const Options& options, int64_t steps, int threads, SameState same_state) {
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
    ASSERT_EQ(reference.state().size(), fused.state().size());
    for (size_t i = 0; i < reference_params.size(); ++i) {
      EXPECT_TRUE(torch::equal(reference_params[i], fused_params[i])) << "parameter " << i;
      using Key = typename std::decay_t<decltype(reference.state())>::key_type;
      const auto a = reference.state().find(compat::optimizer_state_key<Key>(reference_params[i]));
      const auto b = fused.state().find(compat::optimizer_state_key<Key>(fused_params[i]));
      ASSERT_EQ(a == reference.state().end(), b == fused.state().end()) << "state of parameter " << i;
      if (a != reference.state().end()) {
        SCOPED_TRACE(::testing::Message() << "state of parameter " << i);
        same_state(*a->second, *b->second);
      }
    }
  }

  template <typename Reference, typename Fused, typename Options>
  static void expect_same_adam_steps(const Options& options, int64_t steps, int threads) {
    using State = std::conditional_t<std::is_same_v<Options, torch::optim::AdamOptions>, torch::optim::AdamParamState,
                                     torch::optim::AdamWParamState>;
    expect_same_steps<Reference, Fused>(options, steps, threads, [](const auto& x, const auto& y) {
      const auto& a = static_cast<const State&>(x);
      const auto& b = static_cast<const State&>(y);
      EXPECT_EQ(a.step(), b.step());
      EXPECT_TRUE(torch::equal(a.exp_avg(), b.exp_avg())) << "exp_avg";
      EXPECT_TRUE(torch::equal(a.exp_avg_sq(), b.exp_avg_sq())) << "exp_avg_sq";
    });
  }

  static void expect_same_sgd_steps(const torch::optim::SGDOptions& options, int64_t steps, int threads) {
    expect_same_steps<torch::optim::SGD, FusedSGD>(options, steps, threads, [](const auto& x, const auto& y) {
      const auto& a = static_cast<const torch::optim::SGDParamState&>(x);
      const auto& b = static_cast<const torch::optim::SGDParamState&>(y);
      EXPECT_TRUE(torch::equal(a.momentum_buffer(), b.momentum_buffer())) << "momentum_buffer";
    });
  }
};

using torch::optim::Adam;
using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

TEST_F(FusedOptimizerTest, UsesItsOwnKernelOnThisMachine) {
#if defined(__x86_64__)
  EXPECT_NE(fused_adam_kernel(), FusedKernel::kNone) << "LibTorch's Adam rounds in a way dkit does not know";
  EXPECT_NE(fused_sgd_kernel(), FusedKernel::kNone) << "LibTorch's SGD rounds in a way dkit does not know";
#endif
  EXPECT_EQ(to_string(FusedKernel::kFusedMultiplyAdd), "fma");
  EXPECT_EQ(to_string(FusedKernel::kSeparateRounding), "separate");
  EXPECT_EQ(to_string(FusedKernel::kNone), "none");
}

TEST_F(FusedOptimizerTest, KernelReportSaysWhatTheProbesFound) {
  const FusedKernelReport report = fused_kernel_report();
  EXPECT_EQ(report.instructions, detail::optim_kernel_builds().back().name);
  EXPECT_EQ(fused_kernel_instructions(), report.instructions);
  EXPECT_EQ(report.sgd, fused_sgd_kernel());
  EXPECT_EQ(report.adam, fused_adam_kernel());
  EXPECT_EQ(report.sgd_mismatch.empty(), report.sgd != FusedKernel::kNone) << report.sgd_mismatch;
  EXPECT_EQ(report.adam_mismatch.empty(), report.adam != FusedKernel::kNone) << report.adam_mismatch;
}

TEST_F(FusedOptimizerTest, DeviceReportShowsTheKernelsAndWarnsWhenLibTorchsStepsAreTaken) {
  DeviceReport report;
  report.torch_version = "2.11.0";
  add_to_report({"avx512", FusedKernel::kFusedMultiplyAdd, FusedKernel::kNone, "",
                 "fma kernel: Adam: param 17/1003; separate kernel: AdamW: exp_avg_sq 3/1003"},
                report);
  ASSERT_EQ(report.extras.size(), 1u);
  EXPECT_EQ(report.extras[0].label, "Optim");
  EXPECT_EQ(report.extras[0].key, "fused_updates");
  EXPECT_EQ(report.extras[0].text, "fused CPU updates, avx512 kernels: SGD fma, Adam and AdamW none");
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_EQ(report.warnings[0],
            "LibTorch 2.11.0 updates Adam and AdamW with other bits than either of dkit's kernels (fma kernel: Adam: "
            "param 17/1003; separate kernel: AdamW: exp_avg_sq 3/1003), so FusedAdam and FusedAdamW take LibTorch's "
            "own, slower steps; please report this line");
  EXPECT_NE(report_to_json(report).find(
                R"("fused_updates":{"instructions":"avx512","sgd":"fma","adam":"none","sgd_mismatch":"",)"),
            std::string::npos);

  DeviceReport sgd_report;
  sgd_report.torch_version = "2.11.0";
  add_to_report({"avx2", FusedKernel::kNone, FusedKernel::kSeparateRounding, "fma kernel: SGD: param 2/1003", ""},
                sgd_report);
  EXPECT_EQ(sgd_report.extras.at(0).text, "fused CPU updates, avx2 kernels: SGD none, Adam and AdamW separate");
  EXPECT_EQ(sgd_report.warnings,
            std::vector<std::string>{"LibTorch 2.11.0 updates SGD with other bits than either of dkit's kernels (fma "
                                     "kernel: SGD: param 2/1003), so FusedSGD takes LibTorch's own, slower steps; "
                                     "please report this line"});
}

TEST_F(FusedOptimizerTest, KernelLoopsRunOnEveryIntraOpThreadWhenBuiltWithOpenMp) {
  const int previous = at::get_num_threads();
  at::set_num_threads(2);
  const int used = kernel_threads();
  at::set_num_threads(previous);
  EXPECT_EQ(used, DKIT_WITH_OPENMP ? 2 : 1);
}

TEST_F(FusedOptimizerTest, StepsAreBitwiseThoseOfTorchAdam) {
  expect_same_adam_steps<Adam, FusedAdam>(AdamOptions(1e-3), 25, 1);
}

TEST_F(FusedOptimizerTest, StepsAreBitwiseThoseOfTorchAdamOnTwoThreads) {
  expect_same_adam_steps<Adam, FusedAdam>(AdamOptions(1e-3), 25, 2);
}

TEST_F(FusedOptimizerTest, WeightDecayAndOtherBetasAreBitwiseThoseOfTorchAdam) {
  expect_same_adam_steps<Adam, FusedAdam>(
      AdamOptions(3e-2).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.05), 20, 2);
}

TEST_F(FusedOptimizerTest, AdamWStepsAreBitwiseThoseOfTorchAdamW) {
  expect_same_adam_steps<AdamW, FusedAdamW>(AdamWOptions(1e-3).weight_decay(0.01), 20, 2);
  expect_same_adam_steps<AdamW, FusedAdamW>(AdamWOptions(1e-3).weight_decay(0), 5, 1);
}

TEST_F(FusedOptimizerTest, PlainSgdStepsAreBitwiseThoseOfTorchSgd) {
  expect_same_sgd_steps(torch::optim::SGDOptions(0.05), 20, 1);
  expect_same_sgd_steps(torch::optim::SGDOptions(0.05), 20, 2);
}

TEST_F(FusedOptimizerTest, SgdWithMomentumDampeningAndWeightDecayIsBitwiseTorchSgd) {
  expect_same_sgd_steps(torch::optim::SGDOptions(0.05).momentum(0.9), 20, 2);
  expect_same_sgd_steps(torch::optim::SGDOptions(0.02).momentum(0.8).dampening(0.3).weight_decay(5e-4), 20, 2);
  expect_same_sgd_steps(torch::optim::SGDOptions(0.05).weight_decay(0.01), 10, 1);
}

TEST_F(FusedOptimizerTest, SgdWithNesterovMomentumIsBitwiseTorchSgd) {
  expect_same_sgd_steps(torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true), 20, 2);
  expect_same_sgd_steps(torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3), 20, 1);
}

TEST_F(FusedOptimizerTest, NonContiguousParameterFallsBackToTorchSgd) {
  const at::Tensor base = torch::randn({6, 8});
  at::Tensor reference_param = base.clone().t().set_requires_grad(true);
  at::Tensor fused_param = base.clone().t().set_requires_grad(true);
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  torch::optim::SGD reference({reference_param}, options);
  FusedSGD fused({fused_param}, options);
  for (int step = 0; step < 5; ++step) {
    const at::Tensor grad = torch::randn({8, 6});
    reference_param.mutable_grad() = grad.clone();
    fused_param.mutable_grad() = grad.clone();
    reference.step();
    fused.step();
  }
  EXPECT_TRUE(torch::equal(reference_param, fused_param));
}

TEST_F(FusedOptimizerTest, SgdStateRoundTripsThroughATrainingCheckpointAndResumesBitwise) {
  auto params = parameters();
  const auto options = torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-4);
  FusedSGD optimizer(params, options);
  for (int step = 0; step < 3; ++step) {
    for (auto& p : params) {
      p.mutable_grad() = torch::randn_like(p);
    }
    optimizer.step();
  }
  const PickleValue saved = optimizer_state_dict(optimizer);
  auto resumed_params = copies(params);
  FusedSGD resumed(resumed_params, torch::optim::SGDOptions(0.05));
  load_optimizer_state_dict(resumed, saved, "test");
  const auto& loaded = static_cast<const torch::optim::SGDOptions&>(resumed.param_groups().front().options());
  EXPECT_TRUE(loaded.nesterov());
  EXPECT_EQ(loaded.weight_decay(), 1e-4);
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

TEST_F(FusedOptimizerTest, AmsgradFallsBackToTorchAdam) {
  expect_same_adam_steps<Adam, FusedAdam>(AdamOptions(1e-3).amsgrad(true), 10, 1);
}

TEST_F(FusedOptimizerTest, NonContiguousParameterFallsBackToTorchAdam) {
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

TEST_F(FusedOptimizerTest, SkipsParametersWithoutGradientAndReturnsTheClosuresLoss) {
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

TEST_F(FusedOptimizerTest, IsATorchAdamWhoseStateRoundTripsThroughATrainingCheckpoint) {
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

// A step taken a parameter at a time, in another order and in pieces, leaves the parameters and the state bitwise
// where step() leaves them.
template <typename Fused, typename Options>
void expect_split_steps_equal_step(const Options& options) {
  torch::manual_seed(11);
  std::vector<at::Tensor> whole_params;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{256, 64}, {256}, {300, 37}, {10}}) {
    whole_params.push_back(torch::randn(shape).set_requires_grad(true));
  }
  std::vector<at::Tensor> split_params;
  for (const auto& p : whole_params) {
    split_params.push_back(p.detach().clone().set_requires_grad(true));
  }
  Fused whole(whole_params, options);
  Fused split(split_params, options);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < whole_params.size(); ++i) {
      const at::Tensor grad = torch::randn_like(whole_params[i]);
      whole_params[i].mutable_grad() = grad.clone();
      split_params[i].mutable_grad() = grad.clone();
    }
    whole.step();
    std::optional<FusedStep> updates = split.begin_step();
    ASSERT_TRUE(updates.has_value());
    ASSERT_EQ(updates->size(), split_params.size());
    for (size_t i = updates->size(); i-- > 0;) {
      const int64_t half = updates->numel(i) / 2;
      updates->update(i, half, updates->numel(i));
      updates->update(i, 0, half);
    }
  }
  for (size_t i = 0; i < whole_params.size(); ++i) {
    EXPECT_TRUE(torch::equal(whole_params[i], split_params[i])) << "parameter " << i;
  }
  ASSERT_EQ(whole.state().size(), split.state().size());
  for (size_t i = 0; i < whole_params.size(); ++i) {
    using Key = typename std::decay_t<decltype(whole.state())>::key_type;
    const auto a = whole.state().find(compat::optimizer_state_key<Key>(whole_params[i]));
    const auto b = split.state().find(compat::optimizer_state_key<Key>(split_params[i]));
    ASSERT_EQ(a == whole.state().end(), b == split.state().end()) << "state of parameter " << i;
    if (a == whole.state().end()) {
      continue;
    }
    std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
    if (const auto* x = dynamic_cast<const torch::optim::SGDParamState*>(a->second.get())) {
      pairs.emplace_back(x->momentum_buffer(),
                         dynamic_cast<const torch::optim::SGDParamState&>(*b->second).momentum_buffer());
    } else if (const auto* y = dynamic_cast<const AdamParamState*>(a->second.get())) {
      const auto& z = dynamic_cast<const AdamParamState&>(*b->second);
      EXPECT_EQ(y->step(), z.step());
      pairs = {{y->exp_avg(), z.exp_avg()}, {y->exp_avg_sq(), z.exp_avg_sq()}};
    } else {
      const auto& y2 = dynamic_cast<const AdamWParamState&>(*a->second);
      const auto& z2 = dynamic_cast<const AdamWParamState&>(*b->second);
      EXPECT_EQ(y2.step(), z2.step());
      pairs = {{y2.exp_avg(), z2.exp_avg()}, {y2.exp_avg_sq(), z2.exp_avg_sq()}};
    }
    for (const auto& [x, y] : pairs) {
      EXPECT_TRUE(torch::equal(x, y)) << "state of parameter " << i;
    }
  }
}

TEST_F(FusedOptimizerTest, AStepTakenAParameterAtATimeIsBitwiseStep) {
  expect_split_steps_equal_step<FusedSGD>(torch::optim::SGDOptions(0.1));
  expect_split_steps_equal_step<FusedSGD>(torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01));
  expect_split_steps_equal_step<FusedSGD>(torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  expect_split_steps_equal_step<FusedAdam>(AdamOptions(1e-2).weight_decay(0.01));
  expect_split_steps_equal_step<FusedAdamW>(AdamWOptions(1e-2).weight_decay(0.01));
}

TEST_F(FusedOptimizerTest, AStepKnowsItsParametersAndRejectsElementsOutsideThem) {
  at::Tensor a = torch::ones({4, 4}).set_requires_grad(true);
  at::Tensor b = torch::ones({3}).set_requires_grad(true);
  at::Tensor unrelated = torch::ones({4, 4});
  FusedSGD optimizer({a, b}, torch::optim::SGDOptions(0.5));
  b.mutable_grad() = torch::ones({3});
  std::optional<FusedStep> updates = optimizer.begin_step();
  ASSERT_TRUE(updates.has_value());
  EXPECT_EQ(updates->size(), 1u) << "a parameter without a gradient is not updated";
  EXPECT_EQ(updates->index_of(b), 0);
  EXPECT_EQ(updates->index_of(a), -1);
  EXPECT_EQ(updates->index_of(unrelated), -1);
  EXPECT_EQ(updates->numel(0), 3);
  EXPECT_EQ(test::error_message([&] { updates->update(0, 1, 4); }),
            "FusedStep::update: elements [1, 4) of parameter 0, which has 3");
  EXPECT_EQ(test::error_message([&] { updates->numel(1); }), "FusedStep::numel: no parameter 1 in a step of 1");
  updates->update(0, 0, 3);
  EXPECT_TRUE(torch::equal(b, torch::full({3}, 0.5f)));
}

TEST_F(FusedOptimizerTest, BeginStepDeclinesWhatStepLeavesToLibTorchAndChangesNothing) {
  at::Tensor p = torch::ones({4}).set_requires_grad(true);
  p.mutable_grad() = torch::ones({4});
  FusedAdam amsgrad({p}, AdamOptions(0.1).amsgrad(true));
  EXPECT_FALSE(amsgrad.begin_step().has_value());
  EXPECT_TRUE(amsgrad.state().empty());
  at::Tensor wide = torch::ones({4}, torch::kDouble).set_requires_grad(true);
  wide.mutable_grad() = torch::ones({4}, torch::kDouble);
  FusedSGD sgd({wide}, torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_FALSE(sgd.begin_step().has_value());
  EXPECT_TRUE(sgd.state().empty());
}

} // namespace
} // namespace dkit
