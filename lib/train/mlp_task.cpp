#include <dkit/train/mlp_task.h>

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/distributed/data_parallel.h>
#include <dkit/distributed/launch.h>
#include <dkit/distributed/process_group.h>
#include <dkit/model/mlp_file.h>
#include <dkit/train/detail/training_data.h>
#include <dkit/train/optim.h>
#include <dkit/train/step.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <sstream>

namespace dkit {

namespace {

// A batch of raw rows as the network takes it: float32 inputs scaled by `normalization`, int64 class indices.
Batch scaled(const Batch& batch, const Normalization& normalization) {
  Batch out = batch;
  out.features = normalization.apply(batch.features.to(at::kFloat));
  if (out.labels.defined()) {
    out.labels = batch.labels.to(at::kLong);
  }
  return out;
}

} // namespace

MlpTask::MlpTask(const FullTrainConfig& config, int64_t in_features, int64_t classes, Normalization normalization,
                 bool scale_batches)
    : config_(config),
      model_(MlpOptions(in_features, config.hidden, classes).activation(config.activation).dropout(config.dropout)),
      normalization_(std::move(normalization)),
      scale_batches_(scale_batches) {}

MlpTask::~MlpTask() = default;

torch::nn::Module& MlpTask::module() {
  return *model_;
}

std::vector<std::string> MlpTask::metric_names() const {
  return {"accuracy"};
}

StepResult MlpTask::training_step(const Batch& given) {
  const Batch batch = scale_batches_ ? scaled(given, normalization_) : given;
  const at::Tensor logits = model_->forward(batch.features);
  StepResult result;
  result.loss = torch::nn::functional::cross_entropy(logits.to(at::kFloat), batch.labels);
  result.metrics.push_back(logits.detach().argmax(1).eq(batch.labels).to(at::kFloat).mean());
  return result;
}

std::unique_ptr<torch::optim::Optimizer> MlpTask::configure_optimizer() {
  const auto params = model_->parameters();
  const FullTrainConfig& c = config_;
  switch (c.optimizer) {
    case OptimizerKind::kSgd:
      return std::make_unique<FusedSGD>(
          params,
          torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay));
    case OptimizerKind::kAdam:
      return std::make_unique<FusedAdam>(params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
    case OptimizerKind::kAdamW:
      return std::make_unique<FusedAdamW>(params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
    case OptimizerKind::kRmsprop:
      return std::make_unique<torch::optim::RMSprop>(
          params, torch::optim::RMSpropOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
    case OptimizerKind::kAdagrad:
      return std::make_unique<torch::optim::Adagrad>(params,
                                                     torch::optim::AdagradOptions(c.lr).weight_decay(c.weight_decay));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled OptimizerKind ", static_cast<int>(c.optimizer));
}

Scheduler MlpTask::configure_scheduler(torch::optim::Optimizer& optimizer, const TrainingPlan& plan) {
  Scheduler scheduler;
  if (config_.lr_schedule == LrDecay::kConstant && config_.warmup_steps == 0) {
    return scheduler;
  }
  scheduler.scheduler = std::make_unique<WarmupLR>(optimizer, WarmupScheduleOptions(plan.total_steps)
                                                                  .warmup_steps(config_.warmup_steps)
                                                                  .decay(config_.lr_schedule)
                                                                  .min_factor(config_.lr_min_factor)
                                                                  .step_size(config_.lr_step_size)
                                                                  .gamma(config_.lr_gamma));
  scheduler.interval = SchedulerInterval::kStep;
  return scheduler;
}

void MlpTask::on_train_start(const StepContext& context) {
  const Device device = model_->layers().front()->weight.device();
  if (config_.dist_data_parallel) {
    DKIT_CHECK(context.accumulate_grad_batches == 1 && context.clip_grad_norm == 0,
               "dist.data_parallel takes its own steps, which neither accumulate nor clip gradients; set "
               "train.accumulate_grad_batches: 1 and train.clip_grad_norm: 0, or run one process per GPU with "
               "torchrun");
    DKIT_CHECK(data_parallel_available(), "dist.data_parallel is not available: ", data_parallel_unavailable_reason(),
               " (see `dkit devices`); set dist.data_parallel: false");
    DKIT_CHECK(context.reducer == nullptr, "dist.data_parallel runs one process on every GPU, but this is one "
               "process of a multi-process run: with torchrun use one process per GPU and dist.data_parallel: false");
    DKIT_CHECK(device.is_cuda(), "dist.data_parallel needs device cuda, but the device is ", device.str());
    DKIT_CHECK(context.precision == Precision::kFloat32, "dist.data_parallel trains in fp32 only (train.precision is ",
               to_string(context.precision), "): autocast is set per thread and DataParallel's replicas run on ",
               "threads of their own; set train.precision: fp32, or run one process per GPU with torchrun");
    data_parallel_devices_.push_back(device);
    for (int64_t i = 0; i < num_gpus(); ++i) {
      if (gpu(i) != device) {
        data_parallel_devices_.push_back(gpu(i));
      }
    }
    context.log(fmt::format("DataParallel over {} GPUs", data_parallel_devices_.size()));
    context.log("each step: autograd, LibTorch's optimizer (DataParallel's replicas)");
    return;
  }
  TrainStepOptions options;
  options.precision(context.precision).scaler(context.scaler).reducer(context.reducer);
  step_ = std::make_unique<TrainStep>(model_, *context.optimizer, std::move(options));
  step_->prepare(1);
  const bool fused_kind = config_.optimizer == OptimizerKind::kSgd || config_.optimizer == OptimizerKind::kAdam ||
                          config_.optimizer == OptimizerKind::kAdamW;
  const FusedKernel kernel = config_.optimizer == OptimizerKind::kSgd ? fused_sgd_kernel() : fused_adam_kernel();
  std::string updates;
  if (!fused_kind) {
    updates = "LibTorch's optimizer (dkit's one-pass updates are for SGD, Adam and AdamW)";
  } else if (!device.is_cpu()) {
    updates = "LibTorch's optimizer (dkit's one-pass updates are for CPU parameters)";
  } else if (kernel == FusedKernel::kNone) {
    updates = "LibTorch's optimizer (this LibTorch rounds it otherwise than dkit's kernels: see dkit devices)";
  } else {
    updates = fmt::format("dkit's one-pass updates ({} kernels, {} rounding)", fused_kernel_instructions(),
                          to_string(kernel));
  }
  if (context.accumulate_grad_batches > 1 || context.clip_grad_norm > 0) {
    context.log("each step: autograd, as the Trainer accumulates or clips the gradients");
    return;
  }
  context.log(fmt::format("each step: {}, {}", step_->direct() ? "dkit's written-out backward pass" : "autograd",
                          updates));
}

std::optional<StepResult> MlpTask::take_step(const Batch& given, const StepContext& context) {
  const Batch batch = scale_batches_ ? scaled(given, normalization_) : given;
  StepResult result;
  const auto rows = static_cast<double>(std::max<int64_t>(batch.size(), 1));
  if (!data_parallel_devices_.empty()) {
    for (auto& parameter : model_->parameters()) {
      parameter.mutable_grad() = at::Tensor();
    }
    const auto logits = data_parallel_forward(model_, batch.features, data_parallel_devices_);
    const auto loss_sum = torch::nn::functional::cross_entropy(
        logits, batch.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    (loss_sum / static_cast<double>(batch.global_samples)).backward();
    context.optimizer->step();
    const at::NoGradGuard no_grad;
    result.loss = loss_sum.detach() / rows;
    result.metrics.push_back(logits.detach().argmax(1).eq(batch.labels).sum().to(at::kFloat) / rows);
    return result;
  }
  const StepOutput out = step_->run(batch.features, batch.labels, batch.global_samples);
  result.loss = out.loss_sum / rows;
  result.metrics.push_back(out.correct.to(at::kFloat) / rows);
  return result;
}

void MlpTask::describe(TrainingCheckpoint& checkpoint) const {
  checkpoint.model = mlp_description(model_->options);
  checkpoint.input_mean = normalization_.mean;
  checkpoint.input_std = normalization_.std;
}

std::string MlpTask::description() const {
  std::ostringstream out;
  model_->pretty_print(out);
  return out.str();
}

TrainSummary train_from_config(const FullTrainConfig& config, TrainerOptions options) {
  std::shared_ptr<ProcessGroupContext> group = options.process_group();
  if (!group && options.join_launch()) {
    group = join_launched_run(options);
    options.process_group(group);
  }
  if (options.process_settings()) {
    const int64_t cpus = std::max<int64_t>(cpu_count(), 1);
    const int64_t share = group ? std::max<int64_t>(1, cpus / group->launch().local_world_size) : cpus;
    set_cpu_threads(config.threads > 0 ? config.threads : share);
    torch::manual_seed(static_cast<uint64_t>(config.seed));
    options.process_settings(false);
  }
  std::optional<detail::TrainingData> data;
  try {
    data.emplace(config);
  } catch (const Error& e) {
    if (group) {
      group->publish_failure(e.what());
    }
    throw;
  }
  MlpTask task(config, data->in_features, data->num_classes, data->normalization, data->scale_batches);
  options.config_yaml(to_yaml(config)).data_checksum(data->checksum);
  return Trainer(std::move(options)).fit(task, std::move(data->train), std::move(data->val));
}

} // namespace dkit
