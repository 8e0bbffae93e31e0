#pragma once

#include <dkit/train/config.h>

#include <torch/arg.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dkit {

class ProcessGroupContext;
struct TrainingCheckpoint;

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

/// Options for Trainer besides the configuration: where the run writes, what it continues, and how it reports.
struct TrainerOptions {
  /// A run writing into `out_dir`: `train.log`, `metrics.csv`, `summary.json`, `config.yaml` and
  /// `checkpoints/`. The folder is created if its parent exists.
  explicit TrainerOptions(std::string out_dir);

  /// The run folder.
  TORCH_ARG(std::string, out_dir);
  /// Where to continue exactly (model, optimizer, RNG and data position); null to start afresh.
  TORCH_ARG(std::shared_ptr<const ResumePoint>, resume) = nullptr;
  /// Applies `threads` and `seed` to the process: LibTorch's intra-op thread count, and its global generators,
  /// from which the weights' initialisation and dropout draw. Off, the run uses them as the caller left them (the
  /// data split and sample order are seeded either way). `dkit train` turns it on.
  TORCH_ARG(bool, process_settings) = false;
  /// The process group of a multi-process run; null for a single process.
  TORCH_ARG(std::shared_ptr<ProcessGroupContext>, process_group) = nullptr;
  /// Checked after every step; a request stops the run (every rank of it) with a checkpoint.
  TORCH_ARG(std::shared_ptr<StopRequest>, stop) = nullptr;
  /// Called with every line from the start line on, and with every warning, as `train.log` gets it.
  TORCH_ARG(std::function<void(const LogLine&)>, on_log) = nullptr;
  /// Called after every metrics flush (every `train.log_every` steps), e.g. to draw a progress bar.
  TORCH_ARG(std::function<void(const ProgressUpdate&)>, on_progress) = nullptr;
  /// Proves the loop never waits for the GPU: every step and every batch the loader hands over runs under a
  /// ScopedSyncCheck, so a synchronisation that LibTorch performs there (`.item()`, a blocking copy to the host, a
  /// stream synchronisation) ends the run with an error; metric flushes, validation and checkpoints stay outside it.
  /// The sync debug mode it sets is process-wide while a step runs. Needs a CUDA build, a CUDA device and a
  /// precision other than fp16 (whose loss scaler reads the device every step).
  TORCH_ARG(bool, check_syncs) = false;
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
  /// Accuracy on the validation part at the end; NaN without a validation part.
  double val_accuracy = 0;
  /// Highest memory use on the device (CUDA: the caching allocator's peak; CPU: the peak resident set size).
  int64_t peak_memory_bytes = 0;
  /// Host reads of device values this run made (see host_sync_count()).
  int64_t host_syncs = 0;
  /// The reason given to the StopRequest that stopped the run early (a signal's number), or 0.
  int stopped_by_signal = 0;
  /// The last checkpoint written.
  std::string checkpoint;
};

/// Trains the configured MLP: reads the data, builds the model on the configured device, runs the steps with
/// on-device metrics flushed every `train.log_every` steps, validates after each epoch, writes atomic
/// checkpoints, and continues a run exactly where a checkpoint left it.
class Trainer {
 public:
  /// A trainer for `config`; nothing is read or written until run().
  Trainer(FullTrainConfig config, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Runs the training to its end, or until a stop is requested. Errors in the configuration, the data, the
  /// device or a non-finite loss are dkit::Error; the last good checkpoint stays in place. A device that is not
  /// there is refused before the run folder is created; later errors are also written to its `train.log`.
  TrainSummary run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The summary as `summary.json` holds it.
std::string summary_to_json(const TrainSummary& summary);

} // namespace dkit
