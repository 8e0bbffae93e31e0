#include <dkit/train/trainer.h>

#include <dkit/checkpoint/state_dict.h>
#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/device/device.h>
#include <dkit/device/host_sync.h>
#include <dkit/device/report.h>
#include <dkit/distributed/gradient_reducer.h>
#include <dkit/distributed/launch.h>
#include <dkit/distributed/process_group.h>
#include <dkit/metrics/metrics.h>
#include <dkit/train/detail/checkpoint_policy.h>
#include <dkit/train/detail/rank_agreement.h>
#include <dkit/train/detail/run_folder.h>
#include <dkit/train/detail/training_data.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

namespace dkit {
namespace {

using Clock = std::chrono::steady_clock;
using detail::RunFolder;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// The stop reason of a spent max_time; a StopRequest's reasons are positive.
constexpr int kOutOfTime = -1;

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

// The name `module` gives `parameter` (the same tensor), or empty when it is not one of its parameters.
std::string parameter_name(const torch::nn::Module& module, const at::Tensor& parameter) {
  for (const auto& item : module.named_parameters()) {
    if (item.value().is_same(parameter)) {
      return item.key();
    }
  }
  return "";
}

std::string optimizer_name(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) {
    return "sgd";
  }
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) {
    return "adam";
  }
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) {
    return "adamw";
  }
  if (dynamic_cast<const torch::optim::RMSprop*>(&optimizer) != nullptr) {
    return "rmsprop";
  }
  if (dynamic_cast<const torch::optim::Adagrad*>(&optimizer) != nullptr) {
    return "adagrad";
  }
  return "a custom optimizer";
}

// The recorded configuration without its `path:` lines (`data.path`): ranks on different hosts may reach the same
// data through different paths.
std::string without_paths(const std::string& yaml) {
  std::istringstream in(yaml);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(' ') == std::string::npos || line.compare(line.find_first_not_of(' '), 6, "path: ") != 0) {
      kept += line + "\n";
    }
  }
  return kept;
}

} // namespace

TrainerOptions::TrainerOptions(std::string out_dir) : out_dir_(std::move(out_dir)) {}

double TrainSummary::val_metric(std::string_view name) const {
  for (const auto& [metric, value] : val_metrics) {
    if (metric == name) {
      return value;
    }
  }
  return kNaN;
}

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
  
  // The data of a fit: a Dataset in memory, or samples read one at a time.
  struct FitData {
    std::optional<Dataset> tensors;
    std::optional<SampleSource> samples;
  
    int64_t size() const {
      if (tensors) {
        return tensors->features.defined() ? tensors->size() : 0;
      }
      return samples ? samples->size : 0;
    }
  
    Loader loader(const Device& device, const LoaderOptions& options) const {
      return tensors ? Loader(*tensors, device, options) : Loader(*samples, device, options);
    }
  };

  TrainerOptions options;
  Task* task = nullptr;
  FitData train_data;
  FitData val_data;
  std::shared_ptr<ProcessGroupContext> group;
  int64_t world_size = 1;
  Device device = cpu();
  std::optional<RunFolder> run;
  std::shared_ptr<const ResumePoint> resume;
  std::optional<Loader> loader;
  std::optional<Loader> val_loader;
  int64_t val_local_samples = 0;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  Scheduler scheduler;
  std::optional<GradScaler> scaler;
  std::unique_ptr<GradientReducer> reducer;
  std::optional<CheckpointFolder> folder;
  std::vector<std::string> metric_names;
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> buffers;
  std::string data_checksum;
  std::string config_yaml;
  StepContext context;
  std::vector<at::Tensor> zero_row;

  Clock::time_point started = Clock::now();
  int64_t accumulate = 1;
  bool own_steps = true;
  TrainingPlan training_plan;
  int monitor_column = -1;
  struct Kept {
    double value = 0;
    std::string file;
  };
  std::vector<Kept> best;
  double early_best = kNaN;
  int64_t bad_validations = 0;
  bool stopped_early = false;

  int64_t step = 0;
  int64_t epoch = 0;
  int64_t epoch_step = 0;
  int64_t total_steps = 0;
  double window_start = 0;
  int64_t window_samples = 0;
  std::vector<int64_t> window_rows;
  int64_t saved_step = -1;
  TrainSummary summary;
  Stopwatch train_clock;

  explicit Impl(TrainerOptions o) : options(std::move(o)) {}

  bool main() const {
    return group == nullptr || group->is_main();
  }

  // A StopRequest's reason, or kOutOfTime when max_time is spent, or 0.
  int stop_requested() const {
    const int reason = options.stop() ? options.stop()->reason() : 0;
    if (reason != 0) {
      return reason;
    }
    if (options.max_time() > 0 &&
        std::chrono::duration<double>(Clock::now() - started).count() >= options.max_time()) {
      return kOutOfTime;
    }
    return 0;
  }

  void info(const std::string& text, bool headline = false) {
    run->log(LogLevel::kInfo, text, headline);
  }

  torch::nn::Module& module() {
    return task->module();
  }

  TrainSummary fit(Task& fitted, FitData training, FitData validation) {
    started = Clock::now();
    task = &fitted;
    train_data = std::move(training);
    val_data = std::move(validation);
    group = options.process_group();
    if (!group && options.join_launch()) {
      group = join_launched_run(options);
    }
    world_size = group ? group->world_size() : 1;
    device = group ? group->device() : parse_device(options.device());
    run.emplace(options.out_dir(), main(), main() ? options.on_log() : nullptr);
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

  void apply_process_settings() {
    const int64_t cpus = std::max<int64_t>(cpu_count(), 1);
    const int64_t share = group ? std::max<int64_t>(1, cpus / group->launch().local_world_size) : cpus;
    set_cpu_threads(options.threads() > 0 ? options.threads() : share);
    torch::manual_seed(static_cast<uint64_t>(options.seed()));
  }

  void check_options() {
    DKIT_CHECK(options.epochs() >= 1, "TrainerOptions::epochs must be at least 1, got ", options.epochs());
    DKIT_CHECK(options.max_steps() >= 0, "TrainerOptions::max_steps must be at least 0 (0: no limit), got ",
               options.max_steps());
    DKIT_CHECK(options.log_every() >= 1, "TrainerOptions::log_every must be at least 1, got ", options.log_every());
    DKIT_CHECK(options.checkpoint_every() >= 0, "TrainerOptions::checkpoint_every must be at least 0, got ",
               options.checkpoint_every());
    DKIT_CHECK(options.accumulate_grad_batches() >= 1,
               "TrainerOptions::accumulate_grad_batches must be at least 1, got ", options.accumulate_grad_batches());
    DKIT_CHECK(options.clip_grad_norm() >= 0 && std::isfinite(options.clip_grad_norm()),
               "TrainerOptions::clip_grad_norm must be at least 0 (0: no clipping), got ", options.clip_grad_norm());
    DKIT_CHECK(options.max_time() >= 0 && std::isfinite(options.max_time()),
               "TrainerOptions::max_time must be at least 0 seconds (0: no limit), got ", options.max_time());
    DKIT_CHECK(options.save_top_k() >= 0, "TrainerOptions::save_top_k must be at least 0, got ", options.save_top_k());
    DKIT_CHECK(options.early_stopping_patience() >= 0,
               "TrainerOptions::early_stopping_patience must be at least 0 (0: never), got ",
               options.early_stopping_patience());
    DKIT_CHECK(options.early_stopping_min_delta() >= 0 && std::isfinite(options.early_stopping_min_delta()),
               "TrainerOptions::early_stopping_min_delta must be at least 0, got ", options.early_stopping_min_delta());
    accumulate = options.accumulate_grad_batches();
    own_steps = accumulate == 1 && options.clip_grad_norm() == 0;
    if (options.check_syncs()) {
      DKIT_CHECK(DKIT_WITH_CUDA, "check_syncs (dkit train --check-syncs) needs a CUDA build; this one is CPU only");
      DKIT_CHECK(device.is_cuda(), "check_syncs (dkit train --check-syncs) needs a CUDA device; the run's device is ",
                 device.str());
      DKIT_CHECK(options.precision() != Precision::kFloat16,
                 "check_syncs (dkit train --check-syncs) cannot check train.precision=fp16: its loss scaler reads "
                 "the device every step");
    }
  }

  LoaderOptions loader_options(bool training) const {
    return LoaderOptions(options.batch_size())
        .shuffle(training && options.shuffle())
        .shuffle_block(options.shuffle_block())
        .drop_last(training && options.drop_last())
        .placement(options.placement())
        .prefetch(options.prefetch())
        .seed(static_cast<uint64_t>(options.seed()))
        .rank(group ? group->rank() : 0)
        .world_size(world_size)
        .features_dtype(options.features_dtype())
        .features_divisor(options.features_divisor());
  }

  void setup_data() {
    DKIT_CHECK(train_data.size() > 0, "Trainer::fit needs training data, got an empty data set");
    loader.emplace(train_data.loader(device, loader_options(/*training=*/true)));
    if (val_data.size() > 0) {
      val_loader.emplace(val_data.loader(device, loader_options(/*training=*/false)));
      for (int64_t b = 0; b < val_loader->batches_per_epoch(); ++b) {
        val_local_samples += val_loader->batch_rows(b);
      }
    }
    data_checksum = options.data_checksum();
    if (data_checksum.empty() && train_data.tensors) {
      data_checksum = detail::data_checksum(*train_data.tensors);
    }
    info(fmt::format("data: {}{}", loader->description(), data_checksum.empty() ? "" : " (" + data_checksum + ")"));
    if (loader->placement() == Placement::kPinned && !loader->pinned()) {
      info(fmt::format("loader: pinned memory needs a CUDA device; batches for {} are assembled by the prefetch "
                       "thread in reused ordinary host buffers instead",
                       device.str()));
    }
    training_plan.epochs = options.epochs();
    training_plan.steps_per_epoch = (loader->batches_per_epoch() + accumulate - 1) / accumulate;
    training_plan.total_steps = training_plan.epochs * training_plan.steps_per_epoch;
    if (options.max_steps() > 0) {
      training_plan.total_steps = std::min(training_plan.total_steps, options.max_steps());
    }
    const int64_t val_size = val_loader ? val_loader->size() : 0;
    info(group ? fmt::format("split: {} training, {} validation samples; {} global batches of {} per epoch ({} "
                             "processes of {}), loader placement {}",
                             loader->size(), val_size, loader->batches_per_epoch(),
                             options.batch_size() * world_size, world_size, options.batch_size(),
                             to_string(loader->placement()))
               : fmt::format("split: {} training, {} validation samples; {} batches of {} per epoch, loader "
                             "placement {}",
                             loader->size(), val_size, loader->batches_per_epoch(), options.batch_size(),
                             to_string(loader->placement())));
  }

  void check_on_device(const at::Tensor& tensor, const std::string& what) const {
    DKIT_CHECK(tensor.device() == device, what, " is on ", tensor.device().str(), " but the run's device is ",
               device.str(), ": every parameter must be on one device (Task::module() and its optimizer)");
  }

  void setup_model() {
    place_module(module(), device);
    metric_names = task->metric_names();
    parameters = module().parameters();
    buffers = module().buffers();
    optimizer = task->configure_optimizer();
    DKIT_CHECK(optimizer != nullptr, "Task::configure_optimizer() returned no optimizer");
    for (const auto& group_params : optimizer->param_groups()) {
      for (const auto& parameter : group_params.params()) {
        const std::string name = parameter_name(module(), parameter);
        check_on_device(parameter, name.empty() ? std::string("a parameter of the optimizer (not the module's)")
                                                : "parameter '" + name + "'");
      }
    }
    optimizer_state_dict(*optimizer);
    scheduler = task->configure_scheduler(*optimizer, training_plan);
    if (scheduler.scheduler) {
      load_scheduler_state_dict(*scheduler.scheduler, PickleValue::dict({{"step_count", int64_t{0}}}));
    }
    info(fmt::format("model: {} on {}, optimizer {} lr {}", task->description(), device.str(),
                     optimizer_name(*optimizer), format_number(optimizer->param_groups().front().options().get_lr())));
    setup_monitor();
  }

  bool monitoring() const {
    return options.save_top_k() > 0 || options.early_stopping_patience() > 0;
  }

  void setup_monitor() {
    if (!monitoring()) {
      return;
    }
    std::vector<std::string> figures{"val_loss"};
    for (const auto& name : metric_names) {
      figures.push_back("val_" + name);
    }
    const auto found = std::find(figures.begin(), figures.end(), options.monitor());
    std::string names;
    for (const auto& figure : figures) {
      names += (names.empty() ? "" : ", ") + figure;
    }
    DKIT_CHECK(found != figures.end(), "TrainerOptions::monitor (train.monitor) is '", options.monitor(),
               "', which is none of this task's validation figures: ", names);
    DKIT_CHECK(val_loader.has_value(), "save_top_k and early stopping watch ", options.monitor(),
               ", but the run has no validation data");
    monitor_column = static_cast<int>(found - figures.begin());
    summary.monitor = options.monitor();
    summary.best_value = kNaN;
  }

  void setup_precision() {
    if (options.precision() == Precision::kFloat32) {
      return;
    }
    try {
      check_autocast(device.type(), autocast_dtype_of(options.precision()));
    } catch (const Error& e) {
      throw Error(fmt::format("train.precision {} on {}: {}", to_string(options.precision()), device.str(), e.what()));
    }
    if (options.precision() == Precision::kFloat16) {
      scaler.emplace();
    }
    info(fmt::format("precision: the forward pass under autocast to {}{}; parameters, gradients and optimizer "
                     "state float32",
                     dtype_name(autocast_dtype_of(options.precision())),
                     scaler ? ", the loss scaled by a GradScaler" : ""));
    if (options.precision() == Precision::kFloat16 && device.is_cpu() && !cpu_has_float16_arithmetic()) {
      run->log(LogLevel::kWarning,
               "train.precision fp16 on cpu: this CPU has neither AVX512_FP16 nor AMX-FP16, so LibTorch's float16 "
               "products run many times slower than float32 ones (24-32x on a Zen 5); bf16 is the fast low "
               "precision of CPUs");
    }
  }

  void join_ranks() {
    detail::agree_on_start(*group, module(),
                           {{"step", step},
                            {"epoch", epoch},
                            {"batch in epoch", epoch_step},
                            {"train.batch_size", options.batch_size()},
                            {"data checksum", detail::fingerprint(data_checksum), /*hashed=*/true},
                            {"config", detail::fingerprint(without_paths(config_yaml)), /*hashed=*/true}},
                           device);
    reducer = std::make_unique<GradientReducer>(parameters, group);
    info(fmt::format("{} processes over {} ({}:{}): gradients summed in {} bucket(s)", world_size, group->backend(),
                     group->launch().master_addr, group->launch().master_port, reducer->buckets().size()));
  }

  void restore(const ResumePoint& point) {
    const TrainingCheckpoint& checkpoint = *point.checkpoint;
    DKIT_CHECK(checkpoint.data_checksum.empty() || data_checksum.empty() || checkpoint.data_checksum == data_checksum,
               "cannot resume from ", point.source, ": the training data changed since it was written (checksum ",
               checkpoint.data_checksum, ", now ", data_checksum, "); start a new run instead");
    load_state_dict(module(), checkpoint.model_state_dict, LoadStateDictOptions().source(point.source));
    load_optimizer_state_dict(*optimizer, checkpoint.optimizer_state_dict, point.source);
    if (scheduler.scheduler && !checkpoint.scheduler_state_dict.is_none()) {
      load_scheduler_state_dict(*scheduler.scheduler, checkpoint.scheduler_state_dict, point.source);
    }
    if (scaler && !checkpoint.scaler_state_dict.is_none()) {
      scaler->load_state_dict(checkpoint.scaler_state_dict);
    }
    if (!checkpoint.task_state.is_none()) {
      task->load_state_dict(checkpoint.task_state, point.source);
    }
    if (!checkpoint.trainer_state.is_none()) {
      load_trainer_state(checkpoint.trainer_state, point.source);
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
    position.batch_size = options.batch_size();
    position.world_size = world_size;
    epoch_step = detail::resumed_epoch_step(position, point.source);
    if (epoch_step != checkpoint.epoch_step) {
      run->log(LogLevel::kWarning,
               fmt::format("the global batch changed from {} to {}: epoch {} continues at batch {} (after sample {})",
                           point.saved_batch_size * checkpoint.world_size, options.batch_size() * world_size,
                           epoch + 1, epoch_step, checkpoint.epoch_step * point.saved_batch_size * checkpoint.world_size));
    }
    info(fmt::format("resumed from {} at step {} (epoch {}, batch {})", point.source, step, epoch + 1, epoch_step));
  }

  PickleValue trainer_state() const {
    if (!monitoring()) {
      return {};
    }
    PickleValue kept = PickleValue::list();
    for (const auto& item : best) {
      kept.push_back(PickleValue::dict({{"value", item.value}, {"file", item.file}}));
    }
    return PickleValue::dict({{"monitor", options.monitor()},
                              {"best", kept},
                              {"early_best", early_best},
                              {"bad_validations", bad_validations},
                              {"stopped_early", stopped_early}});
  }

  void load_trainer_state(const PickleValue& state, const std::string& source) {
    const PickleValue* monitor = state.find("monitor");
    if (!monitoring() || monitor == nullptr) {
      return;
    }
    DKIT_CHECK(monitor->to_string() == options.monitor(), "cannot resume from ", source, ": it watched ",
               monitor->to_string(), " for its best checkpoints and early stopping, this run watches ",
               options.monitor());
    best.clear();
    for (const auto& item : state.find("best")->items()) {
      best.push_back({item.find("value")->to_double(), item.find("file")->to_string()});
    }
    early_best = state.find("early_best")->to_double();
    bad_validations = state.find("bad_validations")->to_int();
    stopped_early = state.find("stopped_early")->to_bool();
    if (!best.empty()) {
      summary.best_value = best.front().value;
      summary.best_checkpoint = (run->path() / "checkpoints" / best.front().file).string();
    }
  }

  void start() {
    check_options();
    if (options.process_settings()) {
      apply_process_settings();
    }
    summary.device = device.str();
    config_yaml = options.config_yaml().empty() ? to_yaml(options) : options.config_yaml();
    resume = options.resume();
    if (!resume && options.auto_resume()) {
      if (std::optional<ResumePoint> found = try_resume_run(options.out_dir())) {
        for (const auto& skipped : found->skipped) {
          run->log(LogLevel::kWarning, "skipped an unreadable checkpoint: " + skipped);
        }
        resume = std::make_shared<const ResumePoint>(std::move(*found));
      }
    }
    info(fmt::format("dkit train: device {}, {} CPU threads, out {}", device.str(), at::get_num_threads(),
                     run->path().string()));
    run->write_config(config_yaml);
    setup_data();
    setup_model();
    setup_precision();
    if (main()) {
      folder.emplace(run->path().string(), CheckpointFolderOptions().keep(options.keep_checkpoints()));
    }
    if (resume) {
      restore(*resume);
    }
    if (group) {
      join_ranks();
    }
    run->open_metrics(metric_names, resume ? std::optional<int64_t>(step) : std::nullopt);
    if (options.tensorboard()) {
      run->open_events(step);
    }
    run->echo();
    const std::string processes = group ? fmt::format(" x {} processes ({}, global batch {})", world_size,
                                                      group->backend(), options.batch_size() * world_size)
                                        : std::string();
    info(fmt::format("training {} on {} ({} CPU threads){}: {}; {} batches of {} per epoch; run folder {}",
                     task->description(), device.str(), at::get_num_threads(), processes, loader->description(),
                     loader->batches_per_epoch(), options.batch_size(), run->path().string()),
         /*headline=*/true);
    const int64_t batches = loader->batches_per_epoch();
    total_steps = step;
    if (epoch < options.epochs()) {
      total_steps += (batches - epoch_step + accumulate - 1) / accumulate +
                     (options.epochs() - epoch - 1) * training_plan.steps_per_epoch;
    }
    if (options.max_steps() > 0) {
      total_steps = std::min(total_steps, options.max_steps());
    }
    context.optimizer = optimizer.get();
    context.precision = options.precision();
    context.scaler = scaler ? &*scaler : nullptr;
    context.reducer = reducer.get();
    context.log = [this](const std::string& line) { info(line); };
    context.clip_grad_norm = options.clip_grad_norm();
    context.accumulate_grad_batches = accumulate;
    if (accumulate > 1 || options.clip_grad_norm() > 0) {
      std::string what = accumulate > 1 ? fmt::format("the gradients of {} batches summed", accumulate) : "";
      if (options.clip_grad_norm() > 0) {
        what += fmt::format("{}clipped to a global norm of {}", what.empty() ? "" : ", then ",
                            format_number(options.clip_grad_norm()));
      }
      info(fmt::format("each optimizer step: {}{}", what,
                       group ? ", after the sum over processes" : ""));
    }
    const auto zero = torch::zeros({}, torch::TensorOptions().device(device));
    zero_row.assign(metric_names.size() + 1, zero);
  }

  // The task's step result checked: a 0-d loss, one 0-d metric per name. Metadata only: nothing is read back.
  void check_result(const StepResult& result, const char* step_name) const {
    DKIT_CHECK(result.loss.defined(), step_name, " returned no loss");
    DKIT_CHECK(result.loss.dim() == 0 && result.loss.is_floating_point(), step_name, " returned a loss of shape ",
               format_tensor(result.loss),
               ": a loss must be a 0-d floating-point tensor, the mean over the batch (reduce it, e.g. with .mean())");
    DKIT_CHECK(result.metrics.size() == metric_names.size(), step_name, " returned ", result.metrics.size(),
               " metric(s), but metric_names() names ", metric_names.size());
    for (size_t i = 0; i < metric_names.size(); ++i) {
      DKIT_CHECK(result.metrics[i].defined() && result.metrics[i].dim() == 0, step_name, " returned metric '",
                 metric_names[i], "' of shape ", format_tensor(result.metrics[i]),
                 ": a metric must be a 0-d tensor, the mean over the batch");
    }
  }

  // Runs `step` (the task's training or validation step) under autocast as the precision asks; a LibTorch error in
  // it becomes a dkit::Error that names the batch and the module.
  template <typename Step>
  StepResult run_step(const Batch& batch, const char* step_name, Step&& step_fn) {
    std::optional<AutocastGuard> autocast;
    if (options.precision() != Precision::kFloat32) {
      autocast.emplace(device.type(), autocast_dtype_of(options.precision()));
    }
    try {
      return step_fn();
    } catch (const c10::Error& e) {
      std::string message = e.what_without_backtrace();
      const auto newline = message.find('\n');
      if (newline != std::string::npos) {
        message.resize(newline);
      }
      throw Error(fmt::format("{} failed on a batch of features {} and labels {} in module {}: {}", step_name,
                              format_tensor(batch.features), format_tensor(batch.labels), task->description(), message));
    }
  }

  // Samples over all ranks in global batch `batch` of the epoch.
  int64_t global_rows(int64_t batch) const {
    const int64_t global_batch = options.batch_size() * world_size;
    return std::min(global_batch, loader->samples_per_epoch() - batch * global_batch);
  }

  // Trains on `batch`, the `index`-th of the `length` batches of one optimizer step whose batches hold
  // `step_samples` samples over all ranks: sums its gradients into the step's; after the last, sums them over the
  // ranks, clips them and updates.
  void take_batch(const Batch& batch, MetricBuffer& metrics, int64_t index, int64_t length, int64_t step_samples) {
    const int64_t rows = batch.size();
    const bool last = index + 1 == length;
    std::optional<StepResult> result;
    if (own_steps) {
      result = task->take_step(batch, context);
    }
    if (result) {
      check_result(*result, "Task::take_step");
    } else {
      if (index == 0) {
        for (auto& parameter : parameters) {
          parameter.mutable_grad() = at::Tensor();
        }
      }
      if (reducer && length > 1) {
        reducer->set_enabled(last);
      }
      if (rows > 0) {
        result = run_step(batch, "training_step", [&] { return task->training_step(batch); });
        check_result(*result, "training_step");
        at::Tensor objective = result->loss;
        if (rows != step_samples) {
          objective = objective * (static_cast<double>(rows) / static_cast<double>(step_samples));
        }
        if (scaler) {
          scaler->scale(objective).backward();
        } else {
          objective.backward();
        }
      }
      if (last) {
        update();
      }
    }
    if (last) {
      if (scheduler.scheduler && scheduler.interval == SchedulerInterval::kStep) {
        scheduler.scheduler->step();
      }
      if (group && !buffers.empty()) {
        broadcast_buffers();
      }
      ++step;
    }
    if (rows > 0 && result) {
      std::vector<at::Tensor> row{result->loss.detach()};
      for (const auto& metric : result->metrics) {
        row.push_back(metric.detach());
      }
      metrics.add(row);
    } else {
      metrics.add(zero_row);
    }
    window_rows.push_back(rows);
    ++epoch_step;
    window_samples += batch.global_samples;
    summary.samples += batch.global_samples;
  }

  // The end of the Trainer's own step: the sum over ranks, clipping (of unscaled gradients), the update.
  void update() {
    if (reducer) {
      reducer->synchronize();
    }
    if (options.clip_grad_norm() > 0) {
      if (scaler) {
        scaler->unscale_(*optimizer);
      }
      clip_grad_norm(parameters, options.clip_grad_norm());
    }
    if (scaler) {
      scaler->step(*optimizer);
      scaler->update();
    } else {
      optimizer->step();
    }
  }

  // Every rank's buffers (BatchNorm's running statistics) become rank 0's, as DistributedDataParallel's
  // broadcast_buffers makes them.
  void broadcast_buffers() {
    group->broadcast_coalesced(buffers, "the broadcast of rank 0's buffers at step " + std::to_string(step));
  }

  /// Takes one optimizer step on the loader's next batches (accumulate_grad_batches of them, fewer at the epoch's
  /// end), under the sync check when asked; false at the epoch's end.
  bool take_next_step(MetricBuffer& metrics) {
    const int64_t first = epoch_step;
    const int64_t length = std::min(accumulate, loader->batches_per_epoch() - first);
    int64_t step_samples = 0;
    for (int64_t b = first; b < first + length; ++b) {
      step_samples += global_rows(b);
    }
    for (int64_t index = 0; index < std::max<int64_t>(length, 1); ++index) {
      const OptionalSyncCheck check(options.check_syncs());
      auto batch = loader->next();
      if (!batch) {
        TORCH_INTERNAL_ASSERT(index == 0, "the loader ended an epoch inside an accumulation window");
        return false;
      }
      TORCH_INTERNAL_ASSERT(batch->global_samples == global_rows(first + index), "batch ", first + index, " holds ",
                            batch->global_samples, " samples, expected ", global_rows(first + index));
      take_batch(*batch, metrics, index, length, step_samples);
    }
    return true;
  }

  /// Logs the window's metrics. In a multi-process run the sums of every rank are added up in one allreduce,
  /// which also carries the stop requests: returns the reason that stops every rank, or 0.
  int flush_metrics(MetricBuffer& metrics) {
    if (metrics.empty()) {
      return 0;
    }
    const MetricRows rows = metrics.flush();
    const double seconds = train_clock.seconds() - window_start;
    const int64_t columns = static_cast<int64_t>(metric_names.size()) + 1;
    std::vector<double> sums(static_cast<size_t>(columns) + 3, 0.0);
    const at::Tensor values = rows.values.to(at::kDouble).contiguous();
    const double* data = values.data_ptr<double>();
    for (int64_t r = 0; r < rows.rows(); ++r) {
      const auto weight = static_cast<double>(window_rows[static_cast<size_t>(r)]);
      for (int64_t c = 0; c < columns; ++c) {
        if (weight > 0) {
          sums[static_cast<size_t>(c)] += data[r * columns + c] * weight;
        }
      }
      sums[static_cast<size_t>(columns)] += weight;
    }
    int stop = 0;
    if (group) {
      const int reason = stop_requested();
      sums[static_cast<size_t>(columns) + 1] = reason != 0 ? 1.0 : 0.0;
      sums[static_cast<size_t>(columns) + 2] = static_cast<double>(reason);
      sums = group->allreduce_sum(sums, "the metrics allreduce at step " + std::to_string(step));
      const double stoppers = sums[static_cast<size_t>(columns) + 1];
      if (stoppers > 0) {
        stop = reason != 0 ? reason : static_cast<int>(std::lround(sums[static_cast<size_t>(columns) + 2] / stoppers));
      }
    }
    const double samples = sums[static_cast<size_t>(columns)];
    const double loss = sums[0] / samples;
    std::vector<double> means;
    for (int64_t c = 1; c < columns; ++c) {
      means.push_back(sums[static_cast<size_t>(c)] / samples);
    }
    DKIT_CHECK(std::isfinite(loss), "training diverged: the loss is ", loss, " at step ", step, " (epoch ",
               epoch + 1, "); no checkpoint was written after it, the last good one is in '",
               (run->path() / "checkpoints").string(), "'; lower train.lr");
    const double rate = seconds > 0 ? window_samples / seconds : 0.0;
    summary.final_loss = loss;
    const double lr = optimizer->param_groups().front().options().get_lr();
    run->add_train_row(step, epoch + 1, loss, means, lr, rate);
    std::string text = fmt::format("epoch {}/{} loss {}", epoch + 1, options.epochs(), format_fixed(loss, 4));
    for (size_t i = 0; i < means.size(); ++i) {
      text += fmt::format(" {} {}", metric_names[i], format_fixed(means[i], 4));
    }
    text += fmt::format(" {} samples/s", format_rate(rate));
    info(fmt::format("step {}/{} {}", step, total_steps, text));
    if (main() && options.on_progress()) {
      options.on_progress()(ProgressUpdate{step, total_steps, text});
    }
    window_start = train_clock.seconds();
    window_samples = 0;
    window_rows.clear();
    return stop;
  }

  ValidationResult validate() {
    ValidationResult result;
    result.step = step;
    result.epoch = epoch + 1;
    result.loss = kNaN;
    for (const auto& name : metric_names) {
      result.metrics.emplace_back(name, kNaN);
    }
    if (!val_loader) {
      return result;
    }
    const torch::NoGradGuard no_grad;
    module().eval();
    const auto options64 = torch::TensorOptions().dtype(torch::kFloat64).device(device);
    std::vector<at::Tensor> sums(metric_names.size() + 1);
    for (auto& sum : sums) {
      sum = torch::zeros({}, options64);
    }
    val_loader->start_epoch(0);
    while (auto batch = val_loader->next()) {
      const int64_t rows = batch->size();
      if (rows == 0) {
        continue;
      }
      const StepResult out = run_step(*batch, "validation_step", [&] { return task->validation_step(*batch); });
      check_result(out, "validation_step");
      const auto weight = static_cast<double>(rows);
      sums[0].add_(out.loss.detach().to(torch::kFloat64), weight);
      for (size_t i = 0; i < out.metrics.size(); ++i) {
        sums[i + 1].add_(out.metrics[i].detach().to(torch::kFloat64), weight);
      }
    }
    module().train();
    const auto host = torch::stack(sums).to(torch::kCPU);
    note_host_sync();
    std::vector<double> totals(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
    totals.push_back(static_cast<double>(val_local_samples));
    if (group) {
      totals = group->allreduce_sum(totals, "the validation allreduce at step " + std::to_string(step));
    }
    const double samples = totals.back();
    result.loss = totals[0] / samples;
    for (size_t i = 0; i < metric_names.size(); ++i) {
      result.metrics[i].second = totals[i + 1] / samples;
    }
    return result;
  }

  void record_validation(const ValidationResult& result) {
    summary.val_loss = result.loss;
    summary.val_metrics = result.metrics;
    if (options.on_validation_end()) {
      options.on_validation_end()(result);
    }
  }

  // The monitored figure of `result`.
  double monitored(const ValidationResult& result) const {
    return monitor_column == 0 ? result.loss : result.metrics[static_cast<size_t>(monitor_column - 1)].second;
  }

  bool better(double value, double than) const {
    return std::isnan(than) || (options.monitor_mode() == MonitorMode::kMin ? value < than : value > than);
  }

  // After an epoch's validation (and its count moved on): keeps its checkpoint among the best and counts it for
  // early stopping; true when early stopping ends the run, after its checkpoint.
  bool watch(const ValidationResult& result) {
    const double value = monitored(result);
    bool save = false;
    std::string added;
    if (std::isfinite(value) && options.save_top_k() > 0 &&
        (static_cast<int64_t>(best.size()) < options.save_top_k() || better(value, best.back().value))) {
      added = fmt::format("best-epoch={}-step={}-{}={}.pt", result.epoch, step, options.monitor(),
                          format_fixed(value, 4));
      auto at = std::find_if(best.begin(), best.end(), [&](const Kept& kept) { return better(value, kept.value); });
      best.insert(at, Kept{value, added});
      save = true;
    }
    std::optional<Kept> dropped;
    if (static_cast<int64_t>(best.size()) > options.save_top_k()) {
      dropped = best.back();
      best.pop_back();
    }
    if (options.early_stopping_patience() > 0) {
      const double delta = options.early_stopping_min_delta();
      const double bar = options.monitor_mode() == MonitorMode::kMin ? early_best - delta : early_best + delta;
      if (std::isfinite(value) && better(value, bar)) {
        early_best = value;
        bad_validations = 0;
      } else if (++bad_validations >= options.early_stopping_patience()) {
        stopped_early = true;
        save = true;
      }
    }
    if (save) {
      train_clock.stop();
      save_checkpoint();
      if (main() && !added.empty()) {
        folder->keep_as(summary.checkpoint, added);
        info(fmt::format("best checkpoint {} ({} {})", added, options.monitor(), format_fixed(value, 4)));
      }
      if (main() && dropped) {
        std::error_code ignored;
        std::filesystem::remove(std::filesystem::path(folder->path()) / dropped->file, ignored);
      }
      train_clock.start();
    }
    if (!best.empty()) {
      summary.best_value = best.front().value;
      summary.best_checkpoint = (run->path() / "checkpoints" / best.front().file).string();
    } else if (options.early_stopping_patience() > 0) {
      summary.best_value = early_best;
    }
    if (stopped_early) {
      summary.stop_reason = StopReason::kEarlyStopping;
      const double delta = options.early_stopping_min_delta();
      run->log(LogLevel::kWarning,
               fmt::format("early stopping after step {}: {} did not improve{} for {} validation(s) (best {}); "
                           "checkpoint {}",
                           step, options.monitor(), delta > 0 ? " by more than " + format_number(delta) : "",
                           bad_validations, format_fixed(early_best, 4), summary.checkpoint));
    }
    return stopped_early;
  }

  ValidationResult end_epoch() {
    const ValidationResult result = validate();
    record_validation(result);
    std::vector<double> values;
    for (const auto& item : result.metrics) {
      values.push_back(item.second);
    }
    run->add_val_row(step, epoch + 1, result.loss, values);
    std::string validation = " (no validation part)";
    if (val_loader) {
      validation = fmt::format(": val loss {}", format_fixed(result.loss, 4));
      for (const auto& [name, value] : result.metrics) {
        validation += fmt::format(" val {} {}", name, format_fixed(value, 4));
      }
    }
    info(fmt::format("epoch {}/{} done at step {}{}", epoch + 1, options.epochs(), step, validation),
         /*headline=*/true);
    if (scheduler.scheduler && scheduler.interval == SchedulerInterval::kEpoch) {
      scheduler.scheduler->step();
    }
    if (options.on_epoch_end()) {
      options.on_epoch_end()(epoch + 1, step);
    }
    return result;
  }

  void save_checkpoint() {
    saved_step = step;
    if (!main()) {
      return;
    }
    TrainingCheckpoint checkpoint;
    checkpoint.model_state_dict = module_state_dict(module());
    task->describe(checkpoint);
    checkpoint.optimizer_state_dict = optimizer_state_dict(*optimizer);
    checkpoint.step = step;
    checkpoint.epoch = epoch;
    checkpoint.epoch_step = epoch_step;
    checkpoint.rng = capture_rng_state();
    checkpoint.config = config_yaml;
    checkpoint.data_checksum = data_checksum;
    checkpoint.world_size = world_size;
    if (scaler) {
      checkpoint.scaler_state_dict = scaler->state_dict();
    }
    if (scheduler.scheduler) {
      checkpoint.scheduler_state_dict = scheduler_state_dict(*scheduler.scheduler);
    }
    checkpoint.task_state = task->state_dict();
    checkpoint.trainer_state = trainer_state();
    summary.checkpoint = folder->save(checkpoint);
    info("checkpoint " + summary.checkpoint);
  }

  /// Flushes, checks for a stop and saves as the policy says; true when the run ends here.
  bool end_step(const detail::CheckpointPolicy& policy, MetricBuffer& metrics) {
    const detail::StepPlan plan = policy.after_step(step, metrics.size() + accumulate > metrics.capacity());
    int stop = plan.flush ? flush_metrics(metrics) : 0;
    if (plan.poll_stop) {
      stop = stop_requested();
    }
    if (plan.save || stop != 0) {
      flush_metrics(metrics);
      train_clock.stop();
      save_checkpoint();
      if (stop == kOutOfTime) {
        summary.stop_reason = StopReason::kMaxTime;
        run->log(LogLevel::kWarning, fmt::format("stopped after step {}: max_time of {} s spent; checkpoint {}", step,
                                                 format_number(options.max_time()), summary.checkpoint));
        return true;
      }
      if (stop != 0) {
        summary.stopped_by_signal = stop;
        summary.stop_reason = StopReason::kSignal;
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
    const detail::CheckpointPolicy policy(options.checkpoint_every(), total_steps, /*collective=*/group != nullptr);
    std::vector<std::string> columns{"loss"};
    columns.insert(columns.end(), metric_names.begin(), metric_names.end());
    MetricBuffer metrics(columns, device, options.log_every() * accumulate);
    const int64_t syncs_before = host_sync_count();
    task->on_train_start(context);
    bool validated = false;
    bool finished = step >= total_steps || stopped_early;
    if (stopped_early) {
      summary.stop_reason = StopReason::kEarlyStopping;
      info(fmt::format("early stopping ended this run at step {}; nothing is left to train", step));
    }
    module().train();
    train_clock.start();
    window_start = train_clock.seconds();
    while (!finished && epoch < options.epochs()) {
      train_clock.stop();
      loader->start_epoch(epoch, epoch_step);
      train_clock.start();
      validated = false;
      while (take_next_step(metrics)) {
        if (end_step(policy, metrics)) {
          finished = true;
          break;
        }
      }
      train_clock.stop();
      if (summary.stopped_by_signal != 0) {
        break;
      }
      if (epoch_step >= loader->batches_per_epoch()) {
        const ValidationResult result = end_epoch();
        validated = true;
        ++epoch;
        epoch_step = 0;
        if (monitoring() && watch(result)) {
          finished = true;
          break;
        }
      }
      train_clock.start();
    }
    train_clock.stop();
    flush_metrics(metrics);
    if (!validated) {
      record_validation(validate());
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
    std::string validation;
    if (val_loader) {
      validation = ", val loss " + format_fixed(summary.val_loss, 4);
      for (const auto& [name, value] : summary.val_metrics) {
        validation += fmt::format(" val {} {}", name, format_fixed(value, 4));
      }
    }
    info(fmt::format("done: {} steps, {} samples in {} s of training ({} samples/s), final loss {}{}", summary.steps,
                     summary.samples, format_fixed(summary.train_seconds, 3),
                     format_rate(summary.samples_per_second), format_fixed(summary.final_loss, 4), validation));
    return summary;
  }
};

Trainer::Trainer(TrainerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Trainer::~Trainer() = default;

TrainSummary Trainer::fit(Task& task, Dataset train, Dataset val) {
  Impl::FitData train_data;
  train_data.tensors = std::move(train);
  Impl::FitData val_data;
  if (val.features.defined()) {
    val_data.tensors = std::move(val);
  }
  return impl_->fit(task, std::move(train_data), std::move(val_data));
}

TrainSummary Trainer::fit(Task& task, SampleSource train, SampleSource val) {
  Impl::FitData train_data;
  train_data.samples = std::move(train);
  Impl::FitData val_data;
  if (val.size > 0) {
    val_data.samples = std::move(val);
  }
  return impl_->fit(task, std::move(train_data), std::move(val_data));
}

std::shared_ptr<ProcessGroupContext> join_launched_run(const TrainerOptions& options) {
  const std::optional<LaunchEnvironment> launch = launch_environment();
  if (!launch) {
    return nullptr;
  }
  return std::make_shared<ProcessGroupContext>(
      *launch, launch_device(options.device(), *launch),
      ProcessGroupOptions().backend(options.dist_backend()).timeout(std::chrono::seconds(options.dist_timeout())));
}

std::string summary_to_json(const TrainSummary& s) {
  nlohmann::ordered_json json = {{"device", s.device},
                                 {"steps", s.steps},
                                 {"samples", s.samples},
                                 {"train_seconds", s.train_seconds},
                                 {"samples_per_second", s.samples_per_second},
                                 {"final_loss", s.final_loss},
                                 {"val_loss", s.val_loss}};
  for (const auto& [name, value] : s.val_metrics) {
    json["val_" + name] = value;
  }
  json["peak_memory_bytes"] = s.peak_memory_bytes;
  json["host_syncs"] = s.host_syncs;
  json["stopped_by_signal"] = s.stopped_by_signal;
  json["stop_reason"] = std::string(name_of(kStopReasonNames, s.stop_reason));
  if (!s.monitor.empty()) {
    json["monitor"] = s.monitor;
    json["best_value"] = s.best_value;
    json["best_checkpoint"] = s.best_checkpoint;
  }
  json["checkpoint"] = s.checkpoint;
  return json.dump(/*indent=*/-1, /*indent_char=*/' ', /*ensure_ascii=*/false,
                   nlohmann::ordered_json::error_handler_t::replace) +
         "\n";
}

} // namespace dkit
