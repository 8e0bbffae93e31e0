#pragma once

#include <dkit/config.h>
#include <dkit/model/mlp.h>
#include <dkit/train/amp.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch::optim {
class Adam;
class Optimizer;
} // namespace torch::optim

namespace dkit {

class GradientReducer;

/// What one training step leaves on the device for a MetricBuffer; nothing is read back.
struct StepOutput {
  /// The batch's summed cross-entropy: a float32 0-d tensor without gradient.
  at::Tensor loss_sum;
  /// How many rows have their largest logit at their label: an int64 0-d tensor.
  at::Tensor correct;
};

/// How a TrainStep trains beyond its model and optimizer.
struct TrainStepOptions {
  /// The precision of the forward pass: kBFloat16 and kFloat16 run it under an AutocastGuard on the model's device
  /// type (bfloat16 on the CPU: written out, bitwise the same), as dkit train's `train.precision` does;
  /// parameters, gradients and the loss stay float32.
  TORCH_ARG(Precision, precision) = Precision::kFloat32;
  /// A pointer to a GradScaler (spelt so for TORCH_ARG, which adds `const &` to the type's text).
  using ScalerPointer = GradScaler*;
  /// A loss scaler (for float16), which must outlive the step: the loss is scaled before backward, and the
  /// scaler's step() and update() take the optimizer's place. Null: `optimizer.step()`.
  TORCH_ARG(ScalerPointer, scaler) = nullptr;
  /// A pointer to a GradientReducer (spelt so for TORCH_ARG).
  using ReducerPointer = GradientReducer*;
  /// A GradientReducer over the model's parameters, which must outlive the step: each step sums its gradients over
  /// the ranks before the update. The written-out backward pass hands the reducer each gradient as soon as it is
  /// final (GradientReducer::mark_ready), so that buckets start while the pass goes on, as autograd's hooks start
  /// them on autograd's path. Null: each process keeps its own gradients.
  TORCH_ARG(ReducerPointer, reducer) = nullptr;
  /// Called between the backward pass (and the reducer's sum) and the optimizer's step, e.g. to clip gradients;
  /// the step is then autograd's, whose hooks (Tensor::register_hook) the written-out pass would not run.
  TORCH_ARG(std::function<void()>, before_update) = nullptr;
};

/// One optimizer step of an Mlp classifier, as dkit::Trainer and the `train` benchmark run it: forward, summed
/// cross-entropy, backward with the gradient of the mean over the global batch (so that the ranks' gradients add
/// up to that of the global mean), optimizer step. It never waits for the device.
///
/// For an Mlp in float32 (with dropout: on the CPU), without a scaler or a `before_update` (TrainStepOptions; a
/// `reducer` is fine), the backward pass is written out, layer by layer, as the LibTorch operations that autograd would
/// run for it (addmm's, log_softmax's, nll_loss's, the activation's and dropout's backward formulas; dropout's noise
/// drawn as at::dropout draws it, from the default generator), into buffers reused from step to step: the same values
/// bit for bit, without building and walking an autograd graph and without allocating each step. The parameters'
/// gradients are then those buffers. In bfloat16 on the CPU the same holds for the step autocast and autograd would
/// make: the casts autocast makes (weights, biases, features), the layers in bfloat16, the loss in float32, the casts'
/// backward, bit for bit. Otherwise, or with inputs that require gradients, the step is autograd's (gradients set to
/// none, the forward pass under autocast in bf16 and fp16, `backward()`). Example:
/// ```
/// dkit::TrainStep step(model, optimizer);
/// const dkit::StepOutput out = step.run(batch.features, batch.labels, batch.global_samples);
/// metrics.add({out.loss_sum, out.correct});
/// ```
class TrainStep {
 public:
  /// A step of `model` by `optimizer`, which must be over the model's parameters; both must outlive the step.
  /// An error when `options` ask for autocast that this LibTorch lacks on the model's device (see AutocastGuard),
  /// or name a reducer over other parameters than the model's.
  TrainStep(Mlp model, torch::optim::Optimizer& optimizer, TrainStepOptions options = {});

  /// Trains on one batch: `features` `[rows, in_features]`, `labels` `[rows]` (int64), where the whole batch over
  /// all processes has `global_samples` rows.
  StepOutput run(const at::Tensor& features, const at::Tensor& labels, int64_t global_samples);

  /// Does now what the first run() on batches of `rows` rows would otherwise do once in this process: with dropout,
  /// the check of dkit's noise against bernoulli_, some milliseconds. Optional: run() makes it when it is missing.
  /// dkit::Trainer calls it before it starts timing steps.
  void prepare(int64_t rows);

  /// Whether run() takes the written-out backward pass (rather than autograd's) for this model.
  bool direct() const;

  /// Releases the step's buffers; the parameters keep their last gradients.
  ~TrainStep();
  /// Moves the step; the moved-from one may only be destroyed.
  TrainStep(TrainStep&&) noexcept;
  /// Moves the step; the moved-from one may only be destroyed.
  TrainStep& operator=(TrainStep&&) noexcept;

 private:
  struct Direct;

  StepOutput run_autograd(const at::Tensor& features, const at::Tensor& labels, int64_t global_samples);

  Mlp model_;
  torch::optim::Optimizer* optimizer_;
  TrainStepOptions options_;
  std::vector<at::Tensor> parameters_;
  std::unique_ptr<Direct> direct_;
};

#if DKIT_WITH_CUDA
/// TrainStep as one CUDA graph, after PyTorch's "whole network capture" recipe: zero_grad, forward, loss,
/// backward and the Adam update are captured once on a side stream, with static input buffers, and each later
/// step copies its batch into them and replays the graph, one launch instead of dozens of kernel launches. The
/// Adam update reads its bias corrections from device scalars set before each replay, since a captured host
/// value would be frozen at the capture's step; the update's state stays torch::optim::Adam's. The first
/// `warmup_steps` calls run the same update eagerly on the side stream (the recipe's warm-up, which also creates
/// the optimizer state); the next call captures and replays. Steps are numerically those of torch::optim::Adam
/// (within float rounding: the bias correction is a device division rather than LibTorch's host scalar), and
/// bitwise the same whether captured or not. CUDA builds only.
class CudaGraphStep {
 public:
  /// A step of `model` (on a GPU) by `optimizer` (an Adam without amsgrad, over the model's parameters) for
  /// batches of exactly `batch_size` rows of `num_features` features.
  CudaGraphStep(Mlp model, torch::optim::Adam& optimizer, int64_t batch_size, int64_t num_features,
                int64_t warmup_steps = 3);
  /// Releases the graph and its memory pool.
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  /// Trains on one batch of `batch_size` rows (on the model's GPU) and returns the graph's static outputs, which
  /// the next run() overwrites: copy them (a MetricBuffer does) before calling it again.
  StepOutput run(const at::Tensor& features, const at::Tensor& labels);

  /// Whether the graph has been captured (after `warmup_steps` calls).
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
#endif

} // namespace dkit
