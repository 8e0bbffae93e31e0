#pragma once

#include <dkit/checkpoint/pickle_value.h>
#include <dkit/core/enum_names.h>
#include <dkit/data/loader.h>
#include <dkit/train/amp.h>
#include <dkit/train/schedule.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dkit {

class GradientReducer;
struct TrainingCheckpoint;

/// What a training or validation step measured on one batch, left on the device: nothing is read back.
struct StepResult {
  /// The loss: a 0-d floating-point tensor, the mean over the batch's rows (as LibTorch's losses reduce by
  /// default). A training step's loss carries the graph that backward() runs through.
  at::Tensor loss;
  /// The task's metrics in the order of Task::metric_names(): 0-d tensors on the device, each a mean over the batch's
  /// rows (an accuracy is the fraction of rows right), so that the Trainer can weigh batches of any size.
  std::vector<at::Tensor> metrics;
};

/// When a learning-rate scheduler steps.
enum class SchedulerInterval {
  /// After each epoch, as PyTorch's examples step `StepLR`.
  kEpoch,
  /// After each optimizer step.
  kStep,
};

/// The name of each SchedulerInterval.
inline constexpr EnumNames<SchedulerInterval, 2> kSchedulerIntervalNames = {{
    {SchedulerInterval::kEpoch, "epoch"},
    {SchedulerInterval::kStep, "step"},
}};

/// A learning-rate scheduler and when the Trainer steps it (Task::configure_scheduler()).
struct Scheduler {
  /// Any of LibTorch's schedulers (`torch::optim::StepLR`, or a subclass of `torch::optim::LRScheduler`); null for
  /// none. Its position is saved in each checkpoint and restored on resume.
  std::unique_ptr<torch::optim::LRScheduler> scheduler;
  /// When it steps.
  SchedulerInterval interval = SchedulerInterval::kEpoch;
};

/// What the Trainer knows of a run before its first step, for a scheduler that needs the run's length.
struct TrainingPlan {
  /// The optimizer steps the run ends at, counting from the very first (TrainerOptions::max_steps caps them).
  int64_t total_steps = 0;
  /// Optimizer steps per epoch: the loader's batches over TrainerOptions::accumulate_grad_batches, rounded up.
  int64_t steps_per_epoch = 0;
  /// Passes over the training data.
  int64_t epochs = 0;
};

/// What the Trainer hands a task that takes its own steps (Task::take_step()): everything a step needs besides the
/// batch. The pointers stay valid for the whole run.
struct StepContext {
  /// The optimizer Task::configure_optimizer() made.
  torch::optim::Optimizer* optimizer = nullptr;
  /// The precision of the forward pass.
  Precision precision = Precision::kFloat32;
  /// The loss scaler of an fp16 run; null otherwise.
  GradScaler* scaler = nullptr;
  /// The reducer that sums gradients over the ranks of a multi-process run; null in one process.
  GradientReducer* reducer = nullptr;
  /// Writes an info line to the run's log (`train.log`, and TrainerOptions::on_log).
  std::function<void(const std::string&)> log;
  /// The global norm the Trainer clips gradients to (TrainerOptions::clip_grad_norm); 0: none.
  double clip_grad_norm = 0;
  /// Batches whose gradients make one optimizer step (TrainerOptions::accumulate_grad_batches).
  int64_t accumulate_grad_batches = 1;
};

/// What a Trainer trains, in the spirit of Lightning's `LightningModule`: a module, its training and validation
/// steps, its optimizer and scheduler, and state of its own to checkpoint. A task only computes; the Trainer places
/// the module, runs backward and the optimizer, sums gradients over processes, keeps metrics on the device,
/// validates, checkpoints and resumes. Example:
/// ```
/// struct Regression : dkit::Task {
///   torch::nn::Linear net{4, 1};
///   torch::nn::Module& module() override { return *net; }
///   dkit::StepResult training_step(const dkit::Batch& batch) override {
///     return {torch::mse_loss(net(batch.features), batch.labels), {}};
///   }
/// };
/// ```
class Task {
 public:
  virtual ~Task() = default;

  /// The module trained: the Trainer moves its parameters and buffers to the device, trains its parameters,
  /// switches it between train() and eval(), and saves and restores its state dict.
  virtual torch::nn::Module& module() = 0;

  /// The names of the metrics each step returns besides the loss, e.g. `{"accuracy"}`; none by default. They name
  /// the columns of `metrics.csv`, the TensorBoard scalars and the entries of `summary.json`.
  virtual std::vector<std::string> metric_names() const;

  /// The forward pass and loss of one training batch (the batch's features and labels are on the device). Under
  /// `bf16` or `fp16` the Trainer runs it inside an AutocastGuard.
  virtual StepResult training_step(const Batch& batch) = 0;

  /// The loss and metrics of one validation batch, run without gradients and with the module in eval mode;
  /// training_step() by default.
  virtual StepResult validation_step(const Batch& batch);

  /// The optimizer over module()'s parameters, made once they are on the device. Default: `torch::optim::Adam`
  /// with a learning rate of 1e-3.
  virtual std::unique_ptr<torch::optim::Optimizer> configure_optimizer();

  /// A learning-rate scheduler for `optimizer`, for a run of `plan`'s length; none by default.
  virtual Scheduler configure_scheduler(torch::optim::Optimizer& optimizer, const TrainingPlan& plan);

  /// Called once before the first step, with what every step gets: where a task that takes its own steps prepares
  /// them. Nothing by default.
  virtual void on_train_start(const StepContext& context);

  /// Takes the whole step on `batch` (forward, backward, the reduction over ranks, the optimizer's update) and
  /// returns what it measured, or returns nothing to let the Trainer take the step through training_step(): what
  /// Lightning calls manual optimisation, for a task with a faster step of its own (dkit's MLP takes its written-out
  /// backward pass here). A task's step must leave the module and optimizer as the Trainer's would. Not called when
  /// the run clips or accumulates gradients (StepContext), which the Trainer's own step does. Nothing by default.
  virtual std::optional<StepResult> take_step(const Batch& batch, const StepContext& context);

  /// The task's own state to checkpoint beside the module's and the optimizer's (PickleValue types only: numbers,
  /// strings, lists, dicts, tensors); None, the default, for none.
  virtual PickleValue state_dict() const;

  /// Restores what state_dict() returned; `source` names the checkpoint in errors. Does nothing by default.
  virtual void load_state_dict(const PickleValue& state, const std::string& source);

  /// Adds what a reader of the checkpoint needs to rebuild the model besides its weights (TrainingCheckpoint::model,
  /// `input_mean`, `input_std`); nothing by default.
  virtual void describe(TrainingCheckpoint& checkpoint) const;

  /// The model as the run's log names it; the module's `pretty_print` by default.
  virtual std::string description() const;

 protected:
  Task() = default;
  /// Copies the task's own members; for derived tasks that are copyable.
  Task(const Task&) = default;
  /// Copies the task's own members; for derived tasks that are copyable.
  Task& operator=(const Task&) = default;
};

/// A loss of a module's output and a batch's labels: a 0-d tensor, the mean over the batch.
using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& labels)>;

/// A named metric of a module's output and a batch's labels: a 0-d tensor, the mean over the batch.
struct Metric {
  /// Its name in `metrics.csv`, TensorBoard and `summary.json`, e.g. `accuracy`.
  std::string name;
  /// Computes it.
  std::function<at::Tensor(const at::Tensor& output, const at::Tensor& labels)> compute;
};

/// Cross-entropy between logits `[N, C, ...]` and class indices `[N, ...]`, averaged over the rows
/// (`torch::nn::functional::cross_entropy`).
LossFunction cross_entropy_loss();

/// `accuracy`: the fraction of rows whose largest logit (over dimension 1) is at their class index.
Metric accuracy_metric();

/// Makes a module's optimizer from its parameters, once they are on the device.
using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> parameters)>;

/// An OptimizerFactory of LibTorch's optimizer `Optimizer` with `options`, e.g.
/// `dkit::make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9))`.
template <typename Optimizer, typename Options>
OptimizerFactory make_optimizer(Options options) {
  return [options](std::vector<at::Tensor> parameters) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<Optimizer>(std::move(parameters), options);
  };
}

/// Makes a learning-rate scheduler for the optimizer of a run of the plan's length.
using SchedulerFactory =
    std::function<std::unique_ptr<torch::optim::LRScheduler>(torch::optim::Optimizer&, const TrainingPlan&)>;

/// A SchedulerFactory of dkit::WarmupLR (train/schedule.h) with `options`; a `total_steps` of 0 takes the run's
/// (TrainingPlan::total_steps). Step it each step (SchedulerInterval::kStep).
SchedulerFactory warmup_scheduler(WarmupScheduleOptions options);

/// Scales the gradients of `parameters` so that their global L2 norm is at most `max_norm`, as
/// `torch.nn.utils.clip_grad_norm_` does (the same operations, so the same rounding on the CPU), and returns the norm
/// they had as a 0-d tensor on their device: nothing is read back to the host.
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm);

/// How a ModuleTask trains its module. The defaults make it a classifier.
struct ModuleTaskOptions {
  /// The loss of the module's output and the batch's labels.
  TORCH_ARG(LossFunction, loss) = cross_entropy_loss();
  /// Metrics computed on every batch besides the loss.
  TORCH_ARG(std::vector<Metric>, metrics) = {accuracy_metric()};
  /// The optimizer; null for Task::configure_optimizer()'s default (Adam, lr 1e-3).
  TORCH_ARG(OptimizerFactory, optimizer) = nullptr;
  /// A learning-rate scheduler; null for none.
  TORCH_ARG(SchedulerFactory, scheduler) = nullptr;
  /// When the scheduler steps.
  TORCH_ARG(SchedulerInterval, scheduler_interval) = SchedulerInterval::kEpoch;
};

/// The short way to train any module: its forward pass on each batch's features, a loss of the output and the labels
/// (cross-entropy by default) and named metrics (accuracy by default). Takes a module holder (`LeNet`,
/// `torch::nn::Sequential`) or a `std::shared_ptr` to a module with a `forward(Tensor)`. Example:
/// ```
/// LeNet net;
/// dkit::ModuleTask task(net, dkit::ModuleTaskOptions().optimizer(
///                                dkit::make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.1))));
/// dkit::Trainer(dkit::TrainerOptions("runs/lenet").epochs(10)).fit(task, train, val);
/// ```
class ModuleTask : public Task {
 public:
  /// Trains the module `module` holds.
  template <typename Impl>
  explicit ModuleTask(torch::nn::ModuleHolder<Impl> module, ModuleTaskOptions options = {})
      : ModuleTask(module.ptr(), forward_of(module.ptr()), std::move(options)) {}

  /// Trains `*module`.
  template <typename Impl>
  explicit ModuleTask(std::shared_ptr<Impl> module, ModuleTaskOptions options = {})
      : ModuleTask(module, forward_of(module), std::move(options)) {}

  /// Trains `module`, whose output for a batch's features `forward` computes.
  ModuleTask(std::shared_ptr<torch::nn::Module> module, std::function<at::Tensor(const at::Tensor&)> forward,
             ModuleTaskOptions options = {});

  torch::nn::Module& module() override;
  std::vector<std::string> metric_names() const override;
  StepResult training_step(const Batch& batch) override;
  std::unique_ptr<torch::optim::Optimizer> configure_optimizer() override;
  Scheduler configure_scheduler(torch::optim::Optimizer& optimizer, const TrainingPlan& plan) override;

  /// The module's output for `features`.
  at::Tensor forward(const at::Tensor& features);

 private:
  template <typename Impl>
  static std::function<at::Tensor(const at::Tensor&)> forward_of(const std::shared_ptr<Impl>& module) {
    Impl* impl = module.get();
    return [impl](const at::Tensor& features) -> at::Tensor { return impl->forward(features); };
  }

  std::shared_ptr<torch::nn::Module> module_;
  std::function<at::Tensor(const at::Tensor&)> forward_;
  ModuleTaskOptions options_;
};

} // namespace dkit
