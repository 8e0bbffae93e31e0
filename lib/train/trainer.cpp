#include <dkit/train/trainer.h>

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/device/device.h>
#include <dkit/device/report.h>
#include <dkit/distributed/data_parallel.h>
#include <dkit/distributed/gradient_reducer.h>
#include <dkit/distributed/process_group.h>
#include <dkit/metrics/metrics.h>
#include <dkit/model/mlp.h>
#include <dkit/model/mlp_file.h>
#include <dkit/train/detail/checkpoint_policy.h>
#include <dkit/train/detail/rank_agreement.h>
#include <dkit/train/detail/run_folder.h>
#include <dkit/train/amp.h>
#include <dkit/train/detail/training_data.h>
#include <dkit/train/optim.h>
#include <dkit/train/step.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>

namespace dkit {
namespace {

using Clock = std::chrono::steady_clock;
using detail::RunFolder;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const FullTrainConfig& c,
                                                        const std::vector<torch::Tensor>& params) {
  switch (c.optimizer) {
    case OptimizerKind::kSgd:
      return std::make_unique<FusedSGD>(
          params,
          torch::optim::SGDOptions(c.lr).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay));
    case OptimizerKind::kAdam:
      return std::make_unique<FusedAdam>(params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
    case OptimizerKind::kAdamW:
      return std::make_unique<FusedAdamW>(params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled OptimizerKind ", static_cast<int>(c.optimizer));
}

std::string model_description(const Mlp& model) {
  std::ostringstream out;
  model->pretty_print(out);
  return out.str();
}

class OptionalSyncCheck {
 public:
  explicit OptionalSyncCheck(bool on) {
#if DKIT_WITH_CUDA
    if (on) {
      check_.emplace();
    }
#else
    (void)on;
#endif
  }

 private:
#if DKIT_WITH_CUDA
  std::optional<ScopedSyncCheck> check_;
#endif
};

} // namespace

TrainerOptions::TrainerOptions(std::string out_dir) : out_dir_(std::move(out_dir)) {}

struct Trainer::Impl {
  class Stopwatch {
   public:
    void start() {
      running_ = true;
      started_ = Clock::now();
    }
    void stop() {
      if (running_) {
        total_ += std::chrono::duration<double>(Clock::now() - started_).count();
        running_ = false;
      }
    }
    double seconds() const {
      return total_ + (running_ ? std::chrono::duration<double>(Clock::now() - started_).count() : 0.0);
    }

   private:
    bool running_ = false;
    Clock::time_point started_;
    double total_ = 0;
  };

  FullTrainConfig config;
  TrainerOptions options;
  std::shared_ptr<ProcessGroupContext> group;
  int64_t world_size = 1;
  std::optional<RunFolder> run;
  Device device = cpu();
  std::optional<detail::TrainingData> data;
  Mlp model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::optional<CheckpointFolder> folder;
  std::unique_ptr<GradientReducer> reducer;
  std::vector<Device> data_parallel_devices;
  std::optional<GradScaler> scaler;

  int64_t step = 0;
  int64_t epoch = 0;
  int64_t epoch_step = 0;
  int64_t total_steps = 0;
  double window_start = 0;
  int64_t window_samples = 0;
  int64_t window_local_samples = 0;
  int64_t saved_step = -1;
  TrainSummary summary;
  Stopwatch train_clock;

  Impl(FullTrainConfig c, TrainerOptions o)
      : config(std::move(c)), options(std::move(o)), group(options.process_group()),
        world_size(group ? group->world_size() : 1) {}

  bool main() const {
    return group == nullptr || group->is_main();
  }

  int stop_requested() const {
    return options.stop() ? options.stop()->reason() : 0;
  }

  void info(const std::string& text, bool headline = false) {
    run->log(LogLevel::kInfo, text, headline);
  }

  void apply_process_settings() {
    const int64_t cpus = std::max<int64_t>(cpu_count(), 1);
    const int64_t share = group ? std::max<int64_t>(1, cpus / group->launch().local_world_size) : cpus;
    set_cpu_threads(config.threads > 0 ? config.threads : share);
    torch::manual_seed(static_cast<uint64_t>(config.seed));
  }

  void setup_data() {
    data.emplace(config, device, group ? group->rank() : 0, world_size);
    const Loader& loader = *data->loader;
    info(fmt::format("data: {} ({})", data->description, data->checksum));
    if (loader.placement() == Placement::kPinned && !loader.pinned()) {
      info(fmt::format("loader: pinned memory needs a CUDA device; batches for {} are assembled by the prefetch "
                       "thread in reused ordinary host buffers instead",
                       device.str()));
    }
    info(group ? fmt::format("split: {} training, {} validation samples; {} global batches of {} per epoch ({} "
                             "processes of {}), loader placement {}",
                             data->train_size, data->val_size, loader.batches_per_epoch(),
                             config.batch_size * world_size, world_size, config.batch_size,
                             to_string(loader.placement()))
               : fmt::format("split: {} training, {} validation samples; {} batches of {} per epoch, loader "
                             "placement {}",
                             data->train_size, data->val_size, loader.batches_per_epoch(), config.batch_size,
                             to_string(loader.placement())));
  }

  void setup_model() {
    model = Mlp(MlpOptions(data->in_features, config.hidden, data->num_classes)
                    .activation(config.activation)
                    .dropout(config.dropout));
    place_module(model, device);
    optimizer = make_optimizer(config, model->parameters());
    info(fmt::format("model: {} on {}, optimizer {} lr {}", model_description(model), device.str(),
                     to_string(config.optimizer), config.lr));
  }

  void setup_precision() {
    if (config.precision == Precision::kFloat32) {
      return;
    }
    try {
      check_autocast(device.type(), autocast_dtype_of(config.precision));
    } catch (const Error& e) {
      throw Error(fmt::format("train.precision {} on {}: {}", to_string(config.precision), device.str(), e.what()));
    }
    if (config.precision == Precision::kFloat16) {
      scaler.emplace();
    }
    info(fmt::format("precision: the forward pass under autocast to {}{}; parameters, gradients and optimizer "
                     "state float32",
                     dtype_name(autocast_dtype_of(config.precision)),
                     scaler ? ", the loss scaled by a GradScaler" : ""));
    if (config.precision == Precision::kFloat16 && device.is_cpu() && !cpu_has_float16_arithmetic()) {
      run->log(LogLevel::kWarning,
               "train.precision fp16 on cpu: this CPU has neither AVX512_FP16 nor AMX-FP16, so LibTorch's float16 "
               "products run many times slower than float32 ones (24-32x on a Zen 5); bf16 is the fast low "
               "precision of CPUs");
    }
  }

  void setup_data_parallel() {
    if (!config.dist_data_parallel) {
      return;
    }
    DKIT_CHECK(data_parallel_available(), "dist.data_parallel is not available: ", data_parallel_unavailable_reason(),
               " (see `dkit devices`); set dist.data_parallel: false");
    DKIT_CHECK(group == nullptr, "dist.data_parallel runs one process on every GPU, but this is process ",
               group ? group->rank() : 0, " of a ", world_size,
               "-process run: with torchrun use one process per GPU and dist.data_parallel: false");
    DKIT_CHECK(device.is_cuda(), "dist.data_parallel needs device cuda, but the device is ", device.str());
    DKIT_CHECK(config.precision == Precision::kFloat32, "dist.data_parallel trains in fp32 only (train.precision is ",
               to_string(config.precision), "): autocast is set per thread and DataParallel's replicas run on ",
               "threads of their own; set train.precision: fp32, or run one process per GPU with torchrun");
    data_parallel_devices.push_back(device);
    for (int64_t i = 0; i < num_gpus(); ++i) {
      if (gpu(i) != device) {
        data_parallel_devices.push_back(gpu(i));
      }
    }
    info(fmt::format("DataParallel over {} GPUs", data_parallel_devices.size()));
  }

  void join_ranks() {
    FullTrainConfig without_path = config;
    without_path.data_path.clear();
    detail::agree_on_start(*group, *model,
                           {{"step", step},
                            {"epoch", epoch},
                            {"batch in epoch", epoch_step},
                            {"train.batch_size", config.batch_size},
                            {"data checksum", detail::fingerprint(data->checksum), /*hashed=*/true},
                            {"config", detail::fingerprint(to_yaml(without_path)), /*hashed=*/true}},
                           device);
    reducer = std::make_unique<GradientReducer>(model->parameters(), group);
    info(fmt::format("{} processes over {} ({}:{}): gradients summed in {} bucket(s)", world_size, group->backend(),
                     group->launch().master_addr, group->launch().master_port, reducer->buckets().size()));
  }

  void restore(const ResumePoint& point) {
    const TrainingCheckpoint& checkpoint = *point.checkpoint;
    DKIT_CHECK(checkpoint.data_checksum == data->checksum, "cannot resume from ", point.source,
               ": the training data changed since it was written (checksum ", checkpoint.data_checksum, ", now ",
               data->checksum, "); start a new run instead");
    load_state_dict(*model, checkpoint.model_state_dict, LoadStateDictOptions().source(point.source));
    load_optimizer_state_dict(*optimizer, checkpoint.optimizer_state_dict, point.source);
    if (scaler && !checkpoint.scaler_state_dict.is_none()) {
      scaler->load_state_dict(checkpoint.scaler_state_dict);
    }
    restore_rng_state(checkpoint.rng);
    step = checkpoint.step;
    epoch = checkpoint.epoch;
    saved_step = step;
    detail::BatchPosition position;
    position.epoch = epoch;
    position.epoch_step = checkpoint.epoch_step;
    position.saved_batch_size = point.saved_batch_size;
    position.saved_world_size = checkpoint.world_size;
    position.batch_size = config.batch_size;
    position.world_size = world_size;
    epoch_step = detail::resumed_epoch_step(position, point.source);
    if (epoch_step != checkpoint.epoch_step) {
      run->log(LogLevel::kWarning,
               fmt::format("the global batch changed from {} to {}: epoch {} continues at batch {} (after sample {})",
                           point.saved_batch_size * checkpoint.world_size, config.batch_size * world_size,
                           epoch + 1, epoch_step, checkpoint.epoch_step * point.saved_batch_size * checkpoint.world_size));
    }
    info(fmt::format("resumed from {} at step {} (epoch {}, batch {})", point.source, step, epoch + 1, epoch_step));
  }

  /// Logs the window's metrics. In a multi-process run the sums of every rank are added up in one allreduce,
  /// which also carries the stop requests: returns the reason that stops every rank, or 0.
  int flush_metrics(MetricBuffer& metrics) {
    if (metrics.empty()) {
      return 0;
    }
    const MetricRows rows = metrics.flush();
    const double seconds = train_clock.seconds() - window_start;
    double loss_sum = rows.sum("loss_sum");
    double correct = rows.sum("correct");
    double samples = static_cast<double>(window_local_samples);
    int stop = 0;
    if (group) {
      const int reason = stop_requested();
      const auto total = group->allreduce_sum(
          {loss_sum, correct, samples, reason != 0 ? 1.0 : 0.0, static_cast<double>(reason)},
          "the metrics allreduce at step " + std::to_string(step));
      loss_sum = total[0];
      correct = total[1];
      samples = total[2];
      if (total[3] > 0) {
        stop = reason != 0 ? reason : static_cast<int>(std::lround(total[4] / total[3]));
      }
    }
    const double loss = loss_sum / samples;
    const double accuracy = correct / samples;
    DKIT_CHECK(std::isfinite(loss), "training diverged: the loss is ", loss, " at step ", step, " (epoch ",
               epoch + 1, "); no checkpoint was written after it, the last good one is in '",
               (run->path() / "checkpoints").string(), "'; lower train.lr");
    const double rate = seconds > 0 ? window_samples / seconds : 0.0;
    summary.final_loss = loss;
    const double lr = optimizer->param_groups().front().options().get_lr();
    run->add_train_row(step, epoch + 1, loss, accuracy, lr, rate);
    const std::string text = fmt::format("epoch {}/{} loss {} acc {} {} samples/s", epoch + 1, config.epochs,
                                         format_fixed(loss, 4), format_fixed(accuracy, 4), format_rate(rate));
    info(fmt::format("step {}/{} {}", step, total_steps, text));
    if (options.on_progress()) {
      options.on_progress()(ProgressUpdate{step, total_steps, text});
    }
    window_start = train_clock.seconds();
    window_samples = 0;
    window_local_samples = 0;
    return stop;
  }

  // Whether the run holds out validation rows (over all ranks; a rank's own slice may be empty).
  bool has_validation() const {
    return data->val_size > 0;
  }

  std::pair<double, double> validate() {
    if (!has_validation()) {
      return {std::nan(""), std::nan("")};
    }
    torch::NoGradGuard no_grad;
    model->eval();
    constexpr int64_t kChunk = 8192;
    auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
    const int64_t n = data->val_features.size(0);
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t length = std::min(kChunk, n - start);
      const auto x = data->val_features.narrow(0, start, length);
      const auto y = data->val_labels.narrow(0, start, length);
      const auto logits = model->forward(x);
      loss_sum += torch::nn::functional::cross_entropy(
                      logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                      .to(torch::kFloat64);
      correct += logits.argmax(1).eq(y).sum();
    }
    model->train();
    const auto host = torch::stack({loss_sum, correct.to(torch::kFloat64)}).to(torch::kCPU);
    note_host_sync();
    const auto* values = host.data_ptr<double>();
    std::vector<double> sums{values[0], values[1]};
    if (group) {
      sums = group->allreduce_sum(sums, "the validation allreduce at step " + std::to_string(step));
    }
    const auto total = static_cast<double>(data->val_size);
    return {sums[0] / total, sums[1] / total};
  }

  void end_epoch() {
    const auto [val_loss, val_accuracy] = validate();
    summary.val_accuracy = val_accuracy;
    run->add_val_row(step, epoch + 1, val_loss, val_accuracy);
    std::string validation = " (no validation part)";
    if (has_validation()) {
      validation = fmt::format(": val loss {} val acc {}", format_fixed(val_loss, 4), format_fixed(val_accuracy, 4));
    }
    info(fmt::format("epoch {}/{} done at step {}{}", epoch + 1, config.epochs, step, validation),
         /*headline=*/true);
  }

  void save_checkpoint() {
    saved_step = step;
    if (!main()) {
      return;
    }
    TrainingCheckpoint checkpoint;
    checkpoint.model_state_dict = module_state_dict(*model);
    checkpoint.model = mlp_description(model->options);
    checkpoint.input_mean = data->normalization.mean;
    checkpoint.input_std = data->normalization.std;
    checkpoint.optimizer_state_dict = optimizer_state_dict(*optimizer);
    checkpoint.step = step;
    checkpoint.epoch = epoch;
    checkpoint.epoch_step = epoch_step;
    checkpoint.rng = capture_rng_state();
    checkpoint.config = to_yaml(config);
    checkpoint.data_checksum = data->checksum;
    checkpoint.world_size = world_size;
    if (scaler) {
      checkpoint.scaler_state_dict = scaler->state_dict();
    }
    summary.checkpoint = folder->save(checkpoint);
    info("checkpoint " + summary.checkpoint);
  }

  TrainSummary run_logged() {
    device = group ? group->device() : parse_device(config.device);
    run.emplace(options.out_dir(), main(), options.on_log());
    try {
      return train();
    } catch (const std::exception& e) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      const std::string message = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
      run->log_error(message);
      if (group) {
        group->publish_failure(message);
      }
      throw;
    }
  }

  void start() {
    if (options.process_settings()) {
      apply_process_settings();
    }
    summary.device = device.str();
    if (options.check_syncs()) {
      DKIT_CHECK(DKIT_WITH_CUDA, "check_syncs (dkit train --check-syncs) needs a CUDA build; this one is CPU only");
      DKIT_CHECK(device.is_cuda(), "check_syncs (dkit train --check-syncs) needs a CUDA device; the run's device is ",
                 device.str());
      DKIT_CHECK(config.precision != Precision::kFloat16,
                 "check_syncs (dkit train --check-syncs) cannot check train.precision=fp16: its loss scaler reads "
                 "the device every step");
    }
    info(fmt::format("dkit train: device {}, {} CPU threads, out {}", device.str(), at::get_num_threads(),
                     run->path().string()));
    run->write_config(to_yaml(config));
    setup_data();
    setup_model();
    setup_precision();
    setup_data_parallel();
    if (main()) {
      folder.emplace(run->path().string(), CheckpointFolderOptions().keep(config.keep_checkpoints));
    }
    if (options.resume()) {
      restore(*options.resume());
    }
    if (group) {
      join_ranks();
    }
    run->open_metrics(/*append=*/options.resume() != nullptr);
    if (config.tensorboard) {
      run->open_events(step);
    }
    run->echo();
    const std::string processes = group ? fmt::format(" x {} processes ({}, global batch {})", world_size,
                                                      group->backend(), config.batch_size * world_size)
                                        : std::string();
    info(fmt::format("training {} on {} ({} CPU threads){}: {}; {} batches of {} per epoch; run folder {}",
                     model_description(model), device.str(), at::get_num_threads(), processes, data->description,
                     data->loader->batches_per_epoch(), config.batch_size, run->path().string()),
         /*headline=*/true);
    total_steps = step + (config.epochs - epoch) * data->loader->batches_per_epoch() - epoch_step;
    if (config.max_steps > 0) {
      total_steps = std::min(total_steps, config.max_steps);
    }
  }

  // How each step runs: its backward pass, and whose updates of the parameters.
  std::string step_description(bool written_out) const {
    const FusedKernel kernel = config.optimizer == OptimizerKind::kSgd ? fused_sgd_kernel() : fused_adam_kernel();
    std::string updates;
    if (!device.is_cpu()) {
      updates = "LibTorch's optimizer (dkit's one-pass updates are for CPU parameters)";
    } else if (kernel == FusedKernel::kNone) {
      updates = "LibTorch's optimizer (this LibTorch rounds it otherwise than dkit's kernels: see dkit devices)";
    } else {
      updates = fmt::format("dkit's one-pass updates ({} kernels, {} rounding)", fused_kernel_instructions(),
                            to_string(kernel));
    }
    return fmt::format("each step: {}, {}", written_out ? "dkit's written-out backward pass" : "autograd", updates);
  }

  void take_step(const Batch& batch, std::optional<TrainStep>& train_step, MetricBuffer& metrics) {
    if (train_step) {
      const StepOutput out = train_step->run(batch.features, batch.labels, batch.global_samples);
      metrics.add({out.loss_sum, out.correct});
    } else {
      for (auto& param : model->parameters()) {
        param.mutable_grad() = at::Tensor();
      }
      const auto logits = data_parallel_forward(model, batch.features, data_parallel_devices);
      const auto loss_sum = torch::nn::functional::cross_entropy(
          logits, batch.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      (loss_sum / static_cast<double>(batch.global_samples)).backward();
      optimizer->step();
      metrics.add({loss_sum.detach(), logits.detach().argmax(1).eq(batch.labels).sum()});
    }
    ++step;
    ++epoch_step;
    window_samples += batch.global_samples;
    window_local_samples += batch.size();
    summary.samples += batch.global_samples;
  }

  /// Takes the loader's next batch and trains on it, under the sync check when asked; false at the epoch's end.
  bool take_next_step(Loader& loader, std::optional<TrainStep>& train_step, MetricBuffer& metrics) {
    const OptionalSyncCheck check(options.check_syncs());
    auto batch = loader.next();
    if (!batch) {
      return false;
    }
    take_step(*batch, train_step, metrics);
    return true;
  }

  /// Flushes, checks for a stop and saves as the policy says; true when the run ends here.
  bool end_step(const detail::CheckpointPolicy& policy, MetricBuffer& metrics) {
    const detail::StepPlan plan = policy.after_step(step, metrics.full());
    int stop = plan.flush ? flush_metrics(metrics) : 0;
    if (plan.poll_stop) {
      stop = stop_requested();
    }
    if (plan.save || stop != 0) {
      flush_metrics(metrics);
      train_clock.stop();
      save_checkpoint();
      if (stop != 0) {
        summary.stopped_by_signal = stop;
        run->log(LogLevel::kWarning,
                 fmt::format("stopped by signal {} after step {}; checkpoint {}", stop, step, summary.checkpoint));
        return true;
      }
      train_clock.start();
    }
    return plan.last;
  }

  TrainSummary train() {
    start();
    reset_peak_memory_stats(device);
    Loader& loader = *data->loader;
    const detail::CheckpointPolicy policy(config.checkpoint_every, total_steps, /*collective=*/group != nullptr);
    MetricBuffer metrics({"loss_sum", "correct"}, device, config.log_every);
    const int64_t syncs_before = host_sync_count();
    std::optional<TrainStep> train_step;
    if (data_parallel_devices.empty()) {
      TrainStepOptions step_options;
      step_options.precision(config.precision).scaler(scaler ? &*scaler : nullptr);
      step_options.reducer(reducer.get());
      train_step.emplace(model, *optimizer, std::move(step_options));
      train_step->prepare(loader.batch_rows(0));
      train_step->prepare(loader.batch_rows(loader.batches_per_epoch() - 1));
    }
    info(step_description(train_step.has_value() && train_step->direct()));
    int64_t last_validated_step = -1;
    bool finished = step >= total_steps;
    model->train();
    train_clock.start();
    window_start = train_clock.seconds();
    while (!finished && epoch < config.epochs) {
      loader.start_epoch(epoch, epoch_step);
      while (take_next_step(loader, train_step, metrics)) {
        if (end_step(policy, metrics)) {
          finished = true;
          break;
        }
      }
      train_clock.stop();
      if (summary.stopped_by_signal != 0) {
        break;
      }
      if (epoch_step >= loader.batches_per_epoch()) {
        end_epoch();
        last_validated_step = step;
        ++epoch;
        epoch_step = 0;
      }
      train_clock.start();
    }
    train_clock.stop();
    flush_metrics(metrics);
    if (last_validated_step != step) {
      summary.val_accuracy = validate().second;
    }
    if (saved_step != step) {
      save_checkpoint();
    }
    if (group) {
      group->barrier("the final barrier, after rank 0 wrote its checkpoint");
    }
    return finish(syncs_before);
  }

  TrainSummary finish(int64_t syncs_before) {
    summary.steps = step;
    summary.train_seconds = train_clock.seconds();
    summary.samples_per_second = summary.train_seconds > 0 ? summary.samples / summary.train_seconds : 0.0;
    summary.peak_memory_bytes = memory_stats(device).peak_allocated_bytes;
    summary.host_syncs = host_sync_count() - syncs_before;
    run->write_summary(summary);
    info(fmt::format("done: {} steps, {} samples in {} s of training ({} samples/s), final loss {}{}", summary.steps,
                     summary.samples, format_fixed(summary.train_seconds, 3),
                     format_rate(summary.samples_per_second), format_fixed(summary.final_loss, 4),
                     has_validation() ? ", val acc " + format_fixed(summary.val_accuracy, 4) : ""));
    return summary;
  }
};

Trainer::Trainer(FullTrainConfig config, TrainerOptions options)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(options))) {}

Trainer::~Trainer() = default;

TrainSummary Trainer::run() {
  return impl_->run_logged();
}

std::string summary_to_json(const TrainSummary& s) {
  const nlohmann::ordered_json json = {{"device", s.device},
                                       {"steps", s.steps},
                                       {"samples", s.samples},
                                       {"train_seconds", s.train_seconds},
                                       {"samples_per_second", s.samples_per_second},
                                       {"final_loss", s.final_loss},
                                       {"val_accuracy", s.val_accuracy},
                                       {"peak_memory_bytes", s.peak_memory_bytes},
                                       {"host_syncs", s.host_syncs},
                                       {"stopped_by_signal", s.stopped_by_signal},
                                       {"checkpoint", s.checkpoint}};
  return json.dump(/*indent=*/-1, /*indent_char=*/' ', /*ensure_ascii=*/false,
                   nlohmann::ordered_json::error_handler_t::replace) +
         "\n";
}

} // namespace dkit
