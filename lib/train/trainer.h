#pragma once

#include <dkit/data/dataset.h>
#include <dkit/data/loader.h>
#include <dkit/distributed/process_group.h>
#include <dkit/core/enum_names.h>
#include <dkit/train/amp.h>
#include <dkit/train/config.h>
#include <dkit/train/task.h>

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dkit {

struct TrainingCheckpoint;

/// Which way a monitored validation figure improves.
enum class MonitorMode {
  /// Lower is better (a loss).
  kMin,
  /// Higher is better (an accuracy).
  kMax,
};

/// The name of each MonitorMode.
inline constexpr EnumNames<MonitorMode, 2> kMonitorModeNames = {{
    {MonitorMode::kMin, "min"},
    {MonitorMode::kMax, "max"},
}};

/// Why a run ended before its last step.
enum class StopReason {
  /// It did not: it ran to its last step.
  kNone,
  /// A StopRequest (a signal) asked.
  kSignal,
  /// TrainerOptions::max_time ran out.
  kMaxTime,
  /// The monitored validation figure stopped improving (TrainerOptions::early_stopping_patience).
  kEarlyStopping,
};

/// The name of each StopReason, as `summary.json` writes it.
inline constexpr EnumNames<StopReason, 4> kStopReasonNames = {{
    {StopReason::kNone, "none"},
    {StopReason::kSignal, "signal"},
    {StopReason::kMaxTime, "max_time"},
    {StopReason::kEarlyStopping, "early_stopping"},
}};

/// A request to stop a run at the end of its current step, with a checkpoint: made from a signal handler, another
/// thread or a test. Async-signal-safe.
class StopRequest {
 public:
  /// Asks the run to stop; `reason` is non-zero, by convention the number of the signal that asked.
  void request(int reason) noexcept {
    reason_.store(reason);
  }
  /// The reason given to request(), or 0.
  int reason() const noexcept {
    return reason_.load();
  }
  /// Withdraws the request.
  void clear() noexcept {
    reason_.store(0);
  }

 private:
  std::atomic<int> reason_{0};
};

/// The StopRequest that SIGINT and SIGTERM make from now on, for a program that asks for it (the library installs no
/// handler by itself): a second signal of the same kind ends the process at once with the conventional status (128 +
/// signal). It also ignores SIGPIPE, as Python does, so that a peer lost in a multi-process run is an error the run
/// reports rather than a silent death. Sets process-wide state.
std::shared_ptr<StopRequest> stop_on_signals();

/// How much a log line matters.
enum class LogLevel {
  /// What the run is doing.
  kInfo,
  /// Something the user should act on or know about (a changed global batch, a stop).
  kWarning,
};

/// One line of a run's log, as `train.log` gets it (without the time stamp).
struct LogLine {
  /// How much it matters.
  LogLevel level = LogLevel::kInfo;
  /// Whether a console that draws a progress bar should still print it: the start line and each epoch's end.
  bool headline = false;
  /// The line, without a line break.
  std::string text;
};

/// A metrics flush: where the run is and what its last window measured.
struct ProgressUpdate {
  /// Optimizer steps done, counting those before a resume.
  int64_t step = 0;
  /// The step the run ends at.
  int64_t total_steps = 0;
  /// The window's figures, e.g. `epoch 2/5 loss 0.4123 acc 0.8750 310.2k samples/s`.
  std::string text;
};

/// Where a run continues: a checkpoint, and the configuration it saved. resume_run() finds one.
struct ResumePoint {
  /// The configuration the checkpoint saved, with the caller's overrides applied.
  TrainConfig config;
  /// The checkpoint; its tensors may be on any device.
  std::shared_ptr<const TrainingCheckpoint> checkpoint;
  /// Where it was read from, for messages.
  std::string source;
  /// `train.batch_size` of the run that saved it (the resumed run may change it).
  int64_t saved_batch_size = 0;
  /// One line per newer checkpoint file that could not be read, `PATH: reason`.
  std::vector<std::string> skipped;
};

/// The point to continue `checkpoint` (read from `source`) at: its saved configuration, with `overrides`
/// (`KEY=VALUE`, as for parse_config(); relative paths against `base_dir`) applied.
ResumePoint resume_point(TrainingCheckpoint checkpoint, const std::string& source,
                         const std::vector<std::string>& overrides = {}, const std::string& base_dir = ".");

/// resume_point() of the newest readable checkpoint of the run in `run_dir` (see CheckpointFolder::load_newest());
/// an error naming the folder when it has none.
ResumePoint resume_run(const std::string& run_dir, const std::vector<std::string>& overrides = {});

/// resume_run() when the run in `run_dir` has a readable checkpoint; nothing when it has none (no folder, or no
/// checkpoint in it yet): how a job that its launcher restarts (`dkit train --auto-resume`) continues where it was.
std::optional<ResumePoint> try_resume_run(const std::string& run_dir, const std::vector<std::string>& overrides = {});

/// What a validation pass measured, over every process's share of the validation data.
struct ValidationResult {
  /// Optimizer steps done when it ran.
  int64_t step = 0;
  /// The epoch it ended, from 1.
  int64_t epoch = 0;
  /// The mean validation loss.
  double loss = 0;
  /// The task's metrics by name (Task::metric_names()), each the mean over the validation samples.
  std::vector<std::pair<std::string, double>> metrics;
};

/// How a Trainer trains and where it writes: the recipe (device, epochs, batch size, precision, ...), the run folder,
/// what it continues, and how it reports. `dkit train` makes one from its config (trainer_options()). Example:
/// ```
/// dkit::TrainerOptions options("runs/lenet");
/// options.epochs(10).batch_size(256).precision(dkit::Precision::kBFloat16).checkpoint_every(500);
/// ```
struct TrainerOptions {
  /// A run writing into `out_dir`: `train.log`, `metrics.csv`, `summary.json`, `config.yaml` and `checkpoints/`.
  /// The folder is created if its parent exists.
  explicit TrainerOptions(std::string out_dir);

  /// The run folder.
  TORCH_ARG(std::string, out_dir);
  /// The device, `auto` (the first GPU, else the CPU), `cpu`, `cuda` or `cuda:N`; in a multi-process run each rank
  /// takes the GPU of its LOCAL_RANK. An absent device is an error.
  TORCH_ARG(std::string, device) = "auto";
  /// Passes over the training data.
  TORCH_ARG(int64_t, epochs) = 10;
  /// Stops after this many optimizer steps in all, counting those before a resume; 0: no limit.
  TORCH_ARG(int64_t, max_steps) = 0;
  /// Samples per step and per process.
  TORCH_ARG(int64_t, batch_size) = 64;
  /// The precision of the forward pass: fp32, or autocast to bf16, or to fp16 with a GradScaler.
  TORCH_ARG(Precision, precision) = Precision::kFloat32;
  /// Steps between metric flushes, the only reads of the device between checkpoints.
  TORCH_ARG(int64_t, log_every) = 50;
  /// Steps between checkpoints; 0 writes one at the end only.
  TORCH_ARG(int64_t, checkpoint_every) = 500;
  /// Step-numbered checkpoints kept beside `last.pt`; 0 keeps all.
  TORCH_ARG(int64_t, keep_checkpoints) = 3;
  /// Also writes the metrics into a TensorBoard event file in the run folder.
  TORCH_ARG(bool, tensorboard) = false;
  /// Seeds the sample order (and, with process_settings, LibTorch's generators).
  TORCH_ARG(int64_t, seed) = 0;
  /// LibTorch's CPU threads when process_settings is on; 0: every CPU this process may run on (shared between the
  /// processes of one host in a multi-process run).
  TORCH_ARG(int64_t, threads) = 0;
  /// Where the loader keeps the data (see Placement).
  TORCH_ARG(Placement, placement) = Placement::kAuto;
  /// Batches the loader prepares ahead (kPinned).
  TORCH_ARG(int64_t, prefetch) = 2;
  /// A new sample order each epoch, from `seed` and the epoch.
  TORCH_ARG(bool, shuffle) = true;
  /// Shuffles blocks of this many neighbouring samples when above 0 (LoaderOptions::shuffle_block), for data mapped
  /// from a disk where random reads are slow; 0 shuffles single samples.
  TORCH_ARG(int64_t, shuffle_block) = 0;
  /// Skips the last batch of an epoch when it is short.
  TORCH_ARG(bool, drop_last) = false;
  /// Clips the gradients' global L2 norm to this before each optimizer step, as `torch.nn.utils.clip_grad_norm_`:
  /// after the GradScaler unscales them and after the sum over processes, so every rank clips the same gradients.
  /// 0: no clipping.
  TORCH_ARG(double, clip_grad_norm) = 0.0;
  /// Batches whose gradients are summed into one optimizer step: the effective batch is this times `batch_size`
  /// times the processes, and the sum over processes runs once per step, as DDP's `no_sync`. Steps, schedules and
  /// checkpoints count optimizer steps.
  TORCH_ARG(int64_t, accumulate_grad_batches) = 1;
  /// Seconds this run may train; when they are spent it stops at the end of a step with a checkpoint, so that a job
  /// in a time-limited allocation continues in the next one (auto_resume). 0: no limit.
  TORCH_ARG(double, max_time) = 0.0;
  /// The validation figure that save_top_k and early stopping watch: `val_loss`, or `val_` and one of the task's
  /// metric names (`val_accuracy`).
  TORCH_ARG(std::string, monitor) = "val_loss";
  /// Whether `monitor` improves downwards or upwards.
  TORCH_ARG(MonitorMode, monitor_mode) = MonitorMode::kMin;
  /// Keeps the checkpoints of the k best validations by `monitor` beside `last.pt`, as Lightning's
  /// `ModelCheckpoint(save_top_k=k)`: `checkpoints/best-epoch=E-step=S-val_loss=V.pt`. 0: none.
  TORCH_ARG(int64_t, save_top_k) = 0;
  /// Stops the run, with a checkpoint, after this many validations in a row without an improvement of `monitor`
  /// by more than early_stopping_min_delta, as Lightning's `EarlyStopping(patience=...)`. 0: never.
  TORCH_ARG(int64_t, early_stopping_patience) = 0;
  /// The least change of `monitor` that counts as an improvement for early stopping.
  TORCH_ARG(double, early_stopping_min_delta) = 0.0;
  /// Converts each batch's features to this dtype on the device (e.g. float32 for uint8 images; see LoaderOptions).
  TORCH_ARG(std::optional<c10::ScalarType>, features_dtype) = std::nullopt;
  /// Divides each batch's features by this on the device, after the conversion (255 for 8-bit pixels).
  TORCH_ARG(double, features_divisor) = 1.0;
  /// The c10d backend when the trainer joins a multi-process run itself.
  TORCH_ARG(Backend, dist_backend) = Backend::kAuto;
  /// Seconds a rank waits for another before the run fails naming it, when the trainer joins a multi-process run.
  TORCH_ARG(int64_t, dist_timeout) = 60;
  /// Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set) and without a process_group,
  /// joins the multi-process run they describe; off, every process trains alone.
  TORCH_ARG(bool, join_launch) = true;
  /// The process group of a multi-process run; null for a single process (or for join_launch to make one).
  TORCH_ARG(std::shared_ptr<ProcessGroupContext>, process_group) = nullptr;
  /// Where to continue exactly (model, optimizer, scheduler, RNG, data position and the task's state); null to
  /// start afresh, or to let auto_resume look.
  TORCH_ARG(std::shared_ptr<const ResumePoint>, resume) = nullptr;
  /// Continues from the newest readable checkpoint in `out_dir` when there is one (see try_resume_run()), else
  /// starts afresh: what a job that its launcher restarts needs.
  TORCH_ARG(bool, auto_resume) = false;
  /// Applies `threads` and `seed` to the process: LibTorch's intra-op thread count, and its global generators,
  /// from which dropout draws. Off, the run uses them as the caller left them (the sample order is seeded either
  /// way).
  TORCH_ARG(bool, process_settings) = false;
  /// Checked after every step; a request stops the run (every rank of it) with a checkpoint.
  TORCH_ARG(std::shared_ptr<StopRequest>, stop) = nullptr;
  /// Called with every line from the start line on, and with every warning, as `train.log` gets it; on rank 0 only,
  /// which writes the run folder.
  TORCH_ARG(std::function<void(const LogLine&)>, on_log) = nullptr;
  /// Called after every metrics flush (every `log_every` steps), e.g. to draw a progress bar; on rank 0 only.
  TORCH_ARG(std::function<void(const ProgressUpdate&)>, on_progress) = nullptr;
  /// Called on every rank after each validation pass, with its figures.
  TORCH_ARG(std::function<void(const ValidationResult&)>, on_validation_end) = nullptr;
  /// Called on every rank at the end of each epoch (from 1), after its validation, with the steps done.
  TORCH_ARG(std::function<void(int64_t epoch, int64_t step)>, on_epoch_end) = nullptr;
  /// Proves the loop never waits for the GPU: every step and every batch the loader hands over runs under a
  /// ScopedSyncCheck, so a synchronisation that LibTorch performs there (`.item()`, a blocking copy to the host, a
  /// stream synchronisation) ends the run with an error; metric flushes, validation and checkpoints stay outside it.
  /// The sync debug mode it sets is process-wide while a step runs. Needs a CUDA build, a CUDA device and a
  /// precision other than fp16 (whose loss scaler reads the device every step).
  TORCH_ARG(bool, check_syncs) = false;
  /// Identifies the training data in checkpoints: a resumed run refuses other data. Empty: a checksum of the
  /// training Dataset's tensors (none for a SampleSource).
  TORCH_ARG(std::string, data_checksum) = "";
  /// The configuration recorded in `config.yaml` and in each checkpoint. Empty: these options as config keys
  /// (see to_yaml(const TrainerOptions&)).
  TORCH_ARG(std::string, config_yaml) = "";
};

/// What a run did: the contents of `summary.json`.
struct TrainSummary {
  /// The device trained on, e.g. `cuda:0`.
  std::string device;
  /// Optimizer steps done in all, counting those before a resume.
  int64_t steps = 0;
  /// Training samples processed by this run over all processes (a resumed run counts only its own).
  int64_t samples = 0;
  /// Wall time of this run's training steps: no start-up, data reading, validation or checkpoint writing.
  double train_seconds = 0;
  /// `samples / train_seconds`.
  double samples_per_second = 0;
  /// Mean training loss over the last logging window.
  double final_loss = 0;
  /// The last validation's loss; NaN without validation data.
  double val_loss = 0;
  /// The last validation's metrics by name (`accuracy` for a classifier); NaN without validation data.
  std::vector<std::pair<std::string, double>> val_metrics;
  /// Highest memory use on the device (CUDA: the caching allocator's peak; CPU: the peak resident set size).
  int64_t peak_memory_bytes = 0;
  /// Host reads of device values this run made (see host_sync_count()).
  int64_t host_syncs = 0;
  /// The reason given to the StopRequest that stopped the run early (a signal's number), or 0.
  int stopped_by_signal = 0;
  /// Why the run ended before its last step, if it did.
  StopReason stop_reason = StopReason::kNone;
  /// The validation figure the best checkpoints and early stopping watch (TrainerOptions::monitor); empty when
  /// neither is on.
  std::string monitor;
  /// Its best value so far; NaN before the first validation.
  double best_value = 0;
  /// The checkpoint of that best value (save_top_k); empty without one.
  std::string best_checkpoint;
  /// The last checkpoint written.
  std::string checkpoint;

  /// The last validation's value of metric `name`; NaN when the task has no such metric or there was no validation.
  double val_metric(std::string_view name) const;
};

/// Trains a Task, Lightning's Trainer for LibTorch: places the task's module on the device (checking that every
/// parameter and buffer arrived), reads batches through a Loader (pinned prefetch, seeded order, this rank's share),
/// runs each step (autocast and a GradScaler as the precision asks, gradients summed over the processes of a
/// multi-process run as DistributedDataParallel sums them, buffers broadcast from rank 0 after each step), keeps the
/// loss and metrics on the device and reads them back once per flush, validates after each epoch, writes atomic
/// checkpoints, and continues a run exactly where a checkpoint left it. Example:
/// ```
/// dkit::ModuleTask task(net);
/// const dkit::TrainSummary summary =
///     dkit::Trainer(dkit::TrainerOptions("runs/lenet").epochs(10)).fit(task, train, val);
/// ```
class Trainer {
 public:
  /// A trainer with `options`; nothing is read or written until fit().
  explicit Trainer(TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Trains `task` on `train` to the end, or until a stop is requested, validating on `val` after each epoch (an
  /// empty `val` validates nothing). Errors in the options, the data, the device, the task's outputs or a non-finite
  /// loss are dkit::Error; the last good checkpoint stays in place. A device that is not there is refused before the
  /// run folder is created; later errors are also written to its `train.log`.
  TrainSummary fit(Task& task, Dataset train, Dataset val = {});

  /// fit() on samples read one at a time (a `torch::data` dataset, see samples_of()); `val` may be empty (size 0).
  TrainSummary fit(Task& task, SampleSource train, SampleSource val = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The options' recipe (device, seed, threads, train.*, loader.*, dist.*) as YAML config keys, which parse_config()
/// reads back: what a Trainer records in `config.yaml` and its checkpoints when TrainerOptions::config_yaml is empty.
std::string to_yaml(const TrainerOptions& options);

/// The process group of the multi-process run that torchrun launched this process in (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR and MASTER_PORT set), joined on the device `options.device()` means for this rank, with its backend
/// and timeout; null when those variables are not set. Trainer::fit() calls it under TrainerOptions::join_launch.
std::shared_ptr<ProcessGroupContext> join_launched_run(const TrainerOptions& options);

/// The TrainerOptions of the keys in `config` that a Trainer takes (device, seed, threads, train.*, loader.*,
/// dist.*), writing into `out_dir`; the rest (what to resume, callbacks, ...) as TrainerOptions' defaults leave them.
TrainerOptions trainer_options(const FullTrainConfig& config, std::string out_dir);

/// The summary as `summary.json` holds it.
std::string summary_to_json(const TrainSummary& summary);

} // namespace dkit
