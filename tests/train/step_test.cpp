#include <dkit/train/step.h>

#include <dkit/config.h>
#include <dkit/core/compat.h>
#include <dkit/device/device.h>
#include <dkit/train/amp.h>
#include <dkit/train/optim.h>

#include "../support.h"

#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <thread>

namespace dkit {
namespace {

class TrainStepTest : public test::SeedingFixture {
 protected:
  static Mlp model(Activation activation = Activation::kReLU, double dropout = 0.0) {
    torch::manual_seed(3);
    return Mlp(MlpOptions(12, {32, 16}, 5).activation(activation).dropout(dropout));
  }

  /// TrainStep against the loop PyTorch's tutorials write, with torch::optim::Adam: bitwise the same.
  void expect_textbook_steps(Activation activation, double dropout, int threads, bool direct) {
    const int previous_threads = at::get_num_threads();
    at::set_num_threads(threads);
    Mlp reference = model(activation, dropout);
    Mlp stepped = model(activation, dropout);
    torch::optim::Adam reference_optimizer(reference->parameters(), torch::optim::AdamOptions(1e-2));
    FusedAdam optimizer(stepped->parameters(), torch::optim::AdamOptions(1e-2));
    TrainStep step(stepped, optimizer);
    EXPECT_EQ(step.direct(), direct);
    const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
    int64_t index = 0;
    for (const auto& [x, y] : batches(6, 29)) {
      const int64_t global_samples = 2 * x.size(0);
      const at::Tensor rows_x = x.narrow(0, 0, index % 2 == 0 ? 29 : 17);
      const at::Tensor rows_y = y.narrow(0, 0, rows_x.size(0));
      ++index;
      torch::manual_seed(100 + index);
      reference_optimizer.zero_grad();
      const at::Tensor logits = reference->forward(rows_x);
      const at::Tensor loss_sum = torch::nn::functional::cross_entropy(logits, rows_y, sum);
      (loss_sum / static_cast<double>(global_samples)).backward();
      reference_optimizer.step();

      torch::manual_seed(100 + index);
      testing::internal::CaptureStderr();
      const StepOutput out = step.run(rows_x, rows_y, global_samples);
      EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "a batch of " << rows_x.size(0) << " rows";
      EXPECT_TRUE(torch::equal(out.loss_sum, loss_sum.detach())) << "step " << index;
      EXPECT_EQ(out.correct.item<int64_t>(), logits.argmax(1).eq(rows_y).sum().item<int64_t>());
      EXPECT_FALSE(out.loss_sum.requires_grad());
      EXPECT_EQ(out.loss_sum.dim(), 0);
    }
    at::set_num_threads(previous_threads);
    expect_equal_parameters(reference, stepped);
  }

  static std::vector<std::pair<at::Tensor, at::Tensor>> batches(int64_t count, int64_t rows) {
    std::vector<std::pair<at::Tensor, at::Tensor>> out;
    for (int64_t i = 0; i < count; ++i) {
      out.emplace_back(torch::randn({rows, 12}), torch::randint(0, 5, {rows}));
    }
    return out;
  }

  static void expect_equal_parameters(const Mlp& a, const Mlp& b) {
    const auto pa = a->parameters();
    const auto pb = b->parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
    }
  }
};

TEST_F(TrainStepTest, WrittenOutBackwardIsBitwiseTheTextbookLoop) {
  expect_textbook_steps(Activation::kReLU, 0.0, /*threads=*/1, /*direct=*/true);
}

TEST_F(TrainStepTest, WrittenOutBackwardIsBitwiseTheTextbookLoopOnTwoThreads) {
  expect_textbook_steps(Activation::kReLU, 0.0, /*threads=*/2, /*direct=*/true);
}

TEST_F(TrainStepTest, WrittenOutBackwardOfTanhAndGeluIsBitwiseTheTextbookLoop) {
  expect_textbook_steps(Activation::kTanh, 0.0, /*threads=*/1, /*direct=*/true);
  expect_textbook_steps(Activation::kGELU, 0.0, /*threads=*/1, /*direct=*/true);
}

TEST_F(TrainStepTest, DropoutIsWrittenOutAndBitwiseTheTextbookLoop) {
  for (const Activation activation : {Activation::kReLU, Activation::kTanh, Activation::kGELU}) {
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << to_string(activation) << ", " << threads << " thread(s)");
      expect_textbook_steps(activation, 0.25, threads, /*direct=*/true);
    }
  }
}

// A model in eval mode trains without dropout on both paths, and the step draws nothing from the generator.
TEST_F(TrainStepTest, InEvalModeDropoutIsOffAndDrawsNothing) {
  Mlp reference = model(Activation::kReLU, 0.5);
  Mlp stepped = model(Activation::kReLU, 0.5);
  reference->eval();
  stepped->eval();
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD optimizer(stepped->parameters(), torch::optim::SGDOptions(0.1));
  TrainStep step(stepped, optimizer);
  ASSERT_TRUE(step.direct());
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  for (const auto& [x, y] : batches(3, 9)) {
    reference_optimizer.zero_grad();
    const at::Tensor loss = torch::nn::functional::cross_entropy(reference->forward(x), y, sum);
    (loss / 9.0).backward();
    reference_optimizer.step();
    torch::manual_seed(11);
    const StepOutput out = step.run(x, y, 9);
    const at::Tensor next = torch::rand({4});
    torch::manual_seed(11);
    EXPECT_TRUE(torch::equal(next, torch::rand({4}))) << "the step drew from the generator";
    EXPECT_TRUE(torch::equal(out.loss_sum, loss.detach()));
  }
  expect_equal_parameters(reference, stepped);
}

TEST_F(TrainStepTest, AStridedBiasTakesAddmmsOwnCopyAndIsBitwiseTheTextbookLoop) {
  Mlp reference = model();
  Mlp stepped = model();
  for (const Mlp& net : {reference, stepped}) {
    at::Tensor bias = net->layers()[1]->bias;
    const at::NoGradGuard no_grad;
    bias.set_data(at::stack({bias.detach(), at::zeros_like(bias)}, 1).select(1, 0));
    ASSERT_FALSE(bias.is_contiguous());
  }
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD optimizer(stepped->parameters(), torch::optim::SGDOptions(0.1));
  TrainStep step(stepped, optimizer);
  ASSERT_TRUE(step.direct());
  for (const auto& [x, y] : batches(3, 9)) {
    reference_optimizer.zero_grad();
    const at::Tensor loss = torch::nn::functional::cross_entropy(
        reference->forward(x), y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    (loss / 9.0).backward();
    reference_optimizer.step();
    const StepOutput out = step.run(x, y, 9);
    EXPECT_TRUE(torch::equal(out.loss_sum, loss.detach()));
  }
  expect_equal_parameters(reference, stepped);
}

TEST_F(TrainStepTest, GradientsAreTheParametersOwnAfterAStep) {
  Mlp net = model();
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.0));
  TrainStep step(net, optimizer);
  const auto [x, y] = batches(1, 8).front();
  step.run(x, y, 8);
  Mlp copy = model();
  const at::Tensor loss = torch::nn::functional::cross_entropy(
      copy->forward(x), y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  (loss / 8.0).backward();
  const auto mine = net->parameters();
  const auto theirs = copy->parameters();
  for (size_t i = 0; i < mine.size(); ++i) {
    ASSERT_TRUE(mine[i].grad().defined()) << "parameter " << i;
    EXPECT_TRUE(torch::equal(mine[i].grad(), theirs[i].grad())) << "parameter " << i;
  }
}

// The hand-written backward takes only the models it implements: no bias, or any module, parameter or buffer
// beyond the Linear layers sends the step to autograd, which still trains the model as written.
TEST_F(TrainStepTest, TheHandWrittenBackwardRefusesModelsItDoesNotKnow) {
  const auto direct_for = [](Mlp net) {
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
    return TrainStep(net, optimizer).direct();
  };
  EXPECT_TRUE(direct_for(model()));
  EXPECT_TRUE(direct_for(model(Activation::kReLU, 0.1)));
  EXPECT_FALSE(direct_for(Mlp(MlpOptions(12, {32, 16}, 5).bias(false))));
  Mlp extra_module = model();
  extra_module->register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({5})));
  EXPECT_FALSE(direct_for(extra_module));
  Mlp extra_parameter = model();
  extra_parameter->register_parameter("scale", torch::ones({1}));
  EXPECT_FALSE(direct_for(extra_parameter));
  Mlp extra_buffer = model();
  extra_buffer->register_buffer("running", torch::zeros({5}));
  EXPECT_FALSE(direct_for(extra_buffer));
}

// The written-out backward pass with a fused optimizer on two threads, by default at the benchmark's shapes (where
// two threads split OpenBLAS's products): bitwise the textbook loop with LibTorch's own optimizer.
template <typename Reference, typename Fused, typename Options>
void expect_fused_steps(const Options& options, int64_t rows, const MlpOptions& shape = MlpOptions(64, {256, 256}, 10)) {
  const int previous_threads = at::get_num_threads();
  at::set_num_threads(2);
  const auto make = [&] {
    torch::manual_seed(5);
    return Mlp(shape);
  };
  Mlp reference = make();
  Mlp stepped = make();
  Reference reference_optimizer(reference->parameters(), options);
  Fused optimizer(stepped->parameters(), options);
  TrainStep step(stepped, optimizer);
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  for (int index = 0; index < 4; ++index) {
    const at::Tensor x = torch::randn({rows, shape.in_features()});
    const at::Tensor y = torch::randint(0, shape.out_features(), {rows});
    reference_optimizer.zero_grad();
    torch::manual_seed(50 + index);
    const at::Tensor logits = reference->forward(x);
    const at::Tensor loss_sum = torch::nn::functional::cross_entropy(logits, y, sum);
    (loss_sum / static_cast<double>(rows)).backward();
    reference_optimizer.step();
    torch::manual_seed(50 + index);
    const StepOutput out = step.run(x, y, rows);
    EXPECT_TRUE(torch::equal(out.loss_sum, loss_sum.detach())) << "step " << index;
    EXPECT_EQ(out.correct.item<int64_t>(), logits.argmax(1).eq(y).sum().item<int64_t>()) << "step " << index;
  }
  at::set_num_threads(previous_threads);
  const auto pa = reference->parameters();
  const auto pb = stepped->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
  }
}

TEST_F(TrainStepTest, FusedStepsOnTwoThreadsAreBitwiseTheTextbookLoopForEveryOptimizer) {
  using torch::optim::SGDOptions;
  for (const int64_t rows : {64, 37}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    expect_fused_steps<torch::optim::SGD, FusedSGD>(SGDOptions(0.05), rows);
    expect_fused_steps<torch::optim::SGD, FusedSGD>(SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(5e-4),
                                                    rows);
    expect_fused_steps<torch::optim::SGD, FusedSGD>(SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(5e-4),
                                                    rows);
    expect_fused_steps<torch::optim::Adam, FusedAdam>(torch::optim::AdamOptions(1e-3).weight_decay(1e-2), rows);
    expect_fused_steps<torch::optim::AdamW, FusedAdamW>(torch::optim::AdamWOptions(1e-3).weight_decay(1e-2), rows);
  }
}

// Still bitwise at Fashion-MNIST's 784 features, at odd widths, with one row, with one layer, with tanh and GELU,
// whose backward also runs in place, and with dropout (Fashion-MNIST's config).
TEST_F(TrainStepTest, FusedStepsOnTwoThreadsAreBitwiseAtOtherShapesAndActivations) {
  using torch::optim::AdamOptions;
  using torch::optim::SGDOptions;
  expect_fused_steps<torch::optim::SGD, FusedSGD>(SGDOptions(0.05).momentum(0.9), 64, MlpOptions(784, {256}, 10));
  expect_fused_steps<torch::optim::Adam, FusedAdam>(AdamOptions(1e-3), 33, MlpOptions(12, {33, 7}, 5));
  expect_fused_steps<torch::optim::Adam, FusedAdam>(AdamOptions(1e-3), 1, MlpOptions(12, {33, 7}, 5));
  expect_fused_steps<torch::optim::AdamW, FusedAdamW>(torch::optim::AdamWOptions(1e-3), 20, MlpOptions(12, {}, 5));
  expect_fused_steps<torch::optim::SGD, FusedSGD>(SGDOptions(0.05), 64,
                                                  MlpOptions(64, {256, 256}, 10).activation(Activation::kTanh));
  expect_fused_steps<torch::optim::Adam, FusedAdam>(AdamOptions(1e-3), 37,
                                                    MlpOptions(64, {256, 256}, 10).activation(Activation::kGELU));
  expect_fused_steps<torch::optim::AdamW, FusedAdamW>(torch::optim::AdamWOptions(1e-3), 64,
                                                      MlpOptions(784, {512, 256}, 10).dropout(0.1));
  expect_fused_steps<torch::optim::SGD, FusedSGD>(
      SGDOptions(0.05), 37, MlpOptions(64, {256, 256}, 10).activation(Activation::kGELU).dropout(0.5));
}

TEST_F(TrainStepTest, PrepareRefusesANegativeRowCount) {
  Mlp net = model();
  FusedSGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
  TrainStep step(net, optimizer);
  EXPECT_EQ(test::error_message([&] { step.prepare(-1); }), "TrainStep::prepare needs a row count of 0 or more, got -1");
}

// A parameter the optimizer holds besides the model's is updated too.
TEST_F(TrainStepTest, TheFusedStepAlsoUpdatesParametersOutsideTheModel) {
  const int previous_threads = at::get_num_threads();
  at::set_num_threads(2);
  Mlp net = model();
  at::Tensor extra = torch::zeros({5}).set_requires_grad(true);
  extra.mutable_grad() = torch::ones({5});
  auto params = net->parameters();
  params.push_back(extra);
  FusedSGD optimizer(params, torch::optim::SGDOptions(0.5));
  TrainStep step(net, optimizer);
  const auto [x, y] = batches(1, 8).front();
  step.run(x, y, 8);
  at::set_num_threads(previous_threads);
  EXPECT_TRUE(torch::equal(extra, torch::full({5}, -0.5f)));
}

TEST_F(TrainStepTest, CountsCorrectRowsAsArgmaxDoesWithTiesAndNaN) {
  Mlp net = model();
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.0));
  TrainStep step(net, optimizer);
  ASSERT_TRUE(step.direct());
  const at::Tensor x = torch::randn({40, 12});
  const at::Tensor y = torch::randint(0, 5, {40});
  {
    const at::NoGradGuard no_grad;
    net->layers().back()->weight.zero_();
    net->layers().back()->bias.copy_(torch::tensor({1.0f, 3.0f, 3.0f, 0.0f, -2.0f}));
  }
  const int64_t ties = y.eq(1).sum().item<int64_t>();
  EXPECT_EQ(step.run(x, y, 40).correct.item<int64_t>(), ties) << "the first of equal largest logits counts";
  {
    const at::NoGradGuard no_grad;
    net->layers().back()->bias[4] = std::numeric_limits<float>::quiet_NaN();
  }
  const int64_t nans = y.eq(4).sum().item<int64_t>();
  EXPECT_EQ(step.run(x, y, 40).correct.item<int64_t>(), nans) << "a NaN logit counts as the largest";
}

TEST_F(TrainStepTest, RejectsAnEmptyGlobalBatch) {
  Mlp net = model();
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  TrainStep step(net, optimizer);
  EXPECT_EQ(test::error_message([&] { step.run(torch::randn({2, 12}), torch::zeros({2}, torch::kLong), 0); }),
            "TrainStep::run needs a positive global_samples, got 0");
}

// TrainStep in a precision, with or without a scaler, against PyTorch's AMP recipe written out: the forward pass
// under autocast, the loss in float32, backward through the scaler, the scaler's step and update; batches of
// `rows` rows (and one of 1 row), on `threads` threads. bf16 without a scaler takes the written-out step.
void expect_amp_steps(Precision precision, bool with_scaler, Activation activation = Activation::kReLU,
                      int64_t rows = 20, int threads = 0, double dropout = 0.0) {
  const int previous_threads = at::get_num_threads();
  if (threads > 0) {
    at::set_num_threads(threads);
  }
  const MlpOptions options = MlpOptions(12, {32, 16}, 5).activation(activation).dropout(dropout);
  torch::manual_seed(3);
  Mlp reference(options);
  torch::manual_seed(3);
  Mlp stepped(options);
  torch::optim::Adam reference_optimizer(reference->parameters(), torch::optim::AdamOptions(1e-2));
  FusedAdam optimizer(stepped->parameters(), torch::optim::AdamOptions(1e-2));
  std::optional<GradScaler> reference_scaler;
  std::optional<GradScaler> scaler;
  if (with_scaler) {
    reference_scaler.emplace(GradScalerOptions().growth_interval(2));
    scaler.emplace(GradScalerOptions().growth_interval(2));
  }
  TrainStep step(stepped, optimizer,
                 TrainStepOptions().precision(precision).scaler(scaler ? &*scaler : nullptr));
  EXPECT_EQ(step.direct(), precision == Precision::kBFloat16 && !with_scaler);
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  for (int64_t index = 0; index < 5; ++index) {
    const int64_t n = index == 3 ? 1 : rows;
    const at::Tensor x = torch::randn({n, 12});
    const at::Tensor y = torch::randint(0, 5, {n});
    reference_optimizer.zero_grad();
    torch::manual_seed(70 + index);
    at::Tensor logits;
    if (precision == Precision::kFloat32) {
      logits = reference->forward(x);
    } else {
      const AutocastGuard autocast(torch::kCPU, autocast_dtype_of(precision));
      logits = reference->forward(x);
      EXPECT_EQ(logits.scalar_type(), autocast_dtype_of(precision));
    }
    const at::Tensor loss_sum = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y, sum);
    const at::Tensor loss = loss_sum / 40.0;
    if (reference_scaler) {
      reference_scaler->scale(loss).backward();
      reference_scaler->step(reference_optimizer);
      reference_scaler->update();
    } else {
      loss.backward();
      reference_optimizer.step();
    }
    torch::manual_seed(70 + index);
    const StepOutput out = step.run(x, y, 40);
    EXPECT_TRUE(torch::equal(out.loss_sum, loss_sum.detach())) << "step " << index;
    EXPECT_EQ(out.loss_sum.scalar_type(), torch::kFloat);
    EXPECT_EQ(out.correct.item<int64_t>(), logits.to(torch::kFloat).argmax(1).eq(y).sum().item<int64_t>());
  }
  at::set_num_threads(previous_threads);
  EXPECT_FALSE(is_autocast_enabled(torch::kCPU)) << "the step's autocast ended with it";
  if (with_scaler) {
    EXPECT_EQ(scaler->get_scale(), reference_scaler->get_scale());
    EXPECT_EQ(scaler->get_scale(), 65536.0 * 4.0) << "five clean steps at growth interval 2: two growths";
  }
  const auto pa = reference->parameters();
  const auto pb = stepped->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "parameter " << i;
    EXPECT_EQ(pb[i].scalar_type(), torch::kFloat) << "parameter " << i;
  }
}

TEST_F(TrainStepTest, InBf16TheWrittenOutStepIsBitwiseAutocastAndAutogradAsInPyTorchsAmpRecipe) {
  for (const Activation activation : {Activation::kReLU, Activation::kTanh, Activation::kGELU}) {
    for (const int64_t rows : {20, 64, 257}) {
      for (const int threads : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << to_string(activation) << ", " << rows << " rows, " << threads
                                          << " thread(s)");
        expect_amp_steps(Precision::kBFloat16, /*with_scaler=*/false, activation, rows, threads);
      }
    }
    SCOPED_TRACE(::testing::Message() << to_string(activation) << " with dropout");
    expect_amp_steps(Precision::kBFloat16, /*with_scaler=*/false, activation, 64, 2, /*dropout=*/0.25);
  }
}

TEST_F(TrainStepTest, InBf16TheStepTrainsOtherwiseThanInFp32) {
  Mlp fp32 = model();
  Mlp bf16 = model();
  torch::optim::SGD fp32_optimizer(fp32->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD bf16_optimizer(bf16->parameters(), torch::optim::SGDOptions(0.1));
  const at::Tensor x = torch::randn({16, 12});
  const at::Tensor y = torch::randint(0, 5, {16});
  TrainStep(fp32, fp32_optimizer).run(x, y, 16);
  TrainStep(bf16, bf16_optimizer, TrainStepOptions().precision(Precision::kBFloat16)).run(x, y, 16);
  EXPECT_FALSE(torch::equal(fp32->parameters()[0], bf16->parameters()[0])) << "bf16 did not autocast";
}

TEST_F(TrainStepTest, AFloat64ModelTrainsInFloat64OnBothPaths) {
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "bias " << bias);
    const auto make = [bias] {
      torch::manual_seed(3);
      return Mlp(MlpOptions(12, {32, 16}, 5).dropout(0.5).bias(bias));
    };
    Mlp reference = make();
    Mlp stepped = make();
    reference->to(torch::kDouble);
    stepped->to(torch::kDouble);
    torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD optimizer(stepped->parameters(), torch::optim::SGDOptions(0.1));
    TrainStep step(stepped, optimizer);
    EXPECT_EQ(step.direct(), bias);
    const at::Tensor x = torch::randn({16, 12}, torch::kDouble);
    const at::Tensor y = torch::randint(0, 5, {16});
    torch::manual_seed(7);
    reference_optimizer.zero_grad();
    const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
    const at::Tensor loss_sum = torch::nn::functional::cross_entropy(reference->forward(x), y, sum);
    (loss_sum / 16.0).backward();
    reference_optimizer.step();
    torch::manual_seed(7);
    const StepOutput out = step.run(x, y, 16);
    EXPECT_EQ(out.loss_sum.scalar_type(), torch::kDouble);
    EXPECT_TRUE(torch::equal(out.loss_sum, loss_sum.detach()));
    expect_equal_parameters(reference, stepped);
  }
}

TEST_F(TrainStepTest, WithAScalerTheLossIsScaledAndTheScalerSteps) {
  expect_amp_steps(Precision::kFloat32, /*with_scaler=*/true);
}

TEST_F(TrainStepTest, InFp16WithAScalerOrAClearErrorWhereThisLibTorchCannotAutocastToIt) {
  if (compat::kCpuAutocastFloat16) {
    expect_amp_steps(Precision::kFloat16, /*with_scaler=*/true);
    return;
  }
  Mlp net = model();
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_EQ(test::error_message([&] {
              TrainStep step(net, optimizer, TrainStepOptions().precision(Precision::kFloat16));
            }),
            std::string("autocast in float16 on the cpu needs LibTorch 2.2 or later (this is ") + TORCH_VERSION +
                "): use bfloat16 on the cpu");
}

TEST_F(TrainStepTest, BeforeUpdateRunsOnceBetweenTheBackwardPassAndTheUpdate) {
  Mlp reference = model();
  Mlp stepped = model();
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  FusedSGD optimizer(stepped->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  int calls = 0;
  std::vector<at::Tensor> before;
  TrainStep step(stepped, optimizer, TrainStepOptions().before_update([&] {
    ++calls;
    const auto params = stepped->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(params[i].grad().defined()) << "parameter " << i;
      EXPECT_TRUE(torch::equal(params[i], before[i])) << "parameter " << i << " was updated before the hook";
      params[i].mutable_grad().mul_(0.5);
    }
  }));
  EXPECT_FALSE(step.direct()) << "the written-out step updates during its backward pass";
  const auto sum = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
  for (int64_t index = 1; index <= 3; ++index) {
    const at::Tensor x = torch::randn({16, 12});
    const at::Tensor y = torch::randint(0, 5, {16});
    reference_optimizer.zero_grad();
    (torch::nn::functional::cross_entropy(reference->forward(x), y, sum) / 16.0).backward();
    for (auto& param : reference->parameters()) {
      param.mutable_grad().mul_(0.5);
    }
    reference_optimizer.step();
    before.clear();
    for (const auto& param : stepped->parameters()) {
      before.push_back(param.detach().clone());
    }
    step.run(x, y, 16);
    EXPECT_EQ(calls, index);
  }
  expect_equal_parameters(reference, stepped);
}

#if DKIT_WITH_CUDA
TEST_F(TrainStepTest, CudaGraphStepEqualsTheEagerStep_CUDA) {
  Mlp eager = model();
  Mlp graphed = model();
  place_module(eager, gpu(0));
  place_module(graphed, gpu(0));
  torch::optim::Adam eager_optimizer(eager->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam graph_optimizer(graphed->parameters(), torch::optim::AdamOptions(1e-2));
  TrainStep eager_step(eager, eager_optimizer);
  CudaGraphStep graph_step(graphed, graph_optimizer, /*batch_size=*/29, /*num_features=*/12, /*warmup_steps=*/2);
  for (const auto& [x, y] : batches(8, 29)) {
    const at::Tensor gx = x.to(gpu(0));
    const at::Tensor gy = y.to(gpu(0));
    const StepOutput a = eager_step.run(gx, gy, 29);
    const StepOutput b = graph_step.run(gx, gy);
    EXPECT_TRUE(torch::allclose(a.loss_sum, b.loss_sum, /*rtol=*/1e-5, /*atol=*/1e-6));
    EXPECT_EQ(a.correct.item<int64_t>(), b.correct.item<int64_t>());
  }
  EXPECT_TRUE(graph_step.captured());
  const auto pa = eager->parameters();
  const auto pb = graphed->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::allclose(pa[i], pb[i], /*rtol=*/1e-5, /*atol=*/1e-6))
        << "parameter " << i << ": max difference " << (pa[i] - pb[i]).abs().max().item<float>();
  }
}

TEST_F(TrainStepTest, CudaGraphReplayIsBitwiseItsOwnEagerWarmUp_CUDA) {
  // The same batches through a graph step that never captures (a warm-up longer than the run) and one that
  // captures after one step: the captured update must be the eager one exactly.
  Mlp never = model();
  Mlp early = model();
  place_module(never, gpu(0));
  place_module(early, gpu(0));
  torch::optim::Adam never_optimizer(never->parameters(), torch::optim::AdamOptions(1e-2));
  torch::optim::Adam early_optimizer(early->parameters(), torch::optim::AdamOptions(1e-2));
  CudaGraphStep never_step(never, never_optimizer, 29, 12, /*warmup_steps=*/100);
  CudaGraphStep early_step(early, early_optimizer, 29, 12, /*warmup_steps=*/1);
  for (const auto& [x, y] : batches(6, 29)) {
    never_step.run(x.to(gpu(0)), y.to(gpu(0)));
    early_step.run(x.to(gpu(0)), y.to(gpu(0)));
  }
  EXPECT_FALSE(never_step.captured());
  EXPECT_TRUE(early_step.captured());
  expect_equal_parameters(never, early);
}

TEST_F(TrainStepTest, CudaGraphStepRejectsAnotherBatchSize_CUDA) {
  Mlp net = model();
  place_module(net, gpu(0));
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(1e-2));
  CudaGraphStep step(net, optimizer, 8, 12);
  const std::string message = test::error_message(
      [&] { step.run(torch::randn({4, 12}, gpu(0)), torch::zeros({4}, torch::TensorOptions(gpu(0)).dtype(torch::kLong))); });
  EXPECT_EQ(message, "a CUDA graph step was made for batches of 8 rows, got features [4, 12] and labels [4]");
}
#endif

} // namespace
} // namespace dkit
