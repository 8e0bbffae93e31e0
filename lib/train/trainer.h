#pragma once

#include <dkit/train/config.h>

#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dkit {

class ProcessGroupContext;
struct TrainingCheckpoint;

/// Options for Trainer besides the configuration: where the run writes, and what it continues.
struct TrainerOptions {
  /// A run writing into `out_dir`: `train.log`, `metrics.csv`, `summary.json`, `config.yaml` and
  /// `checkpoints/`. The folder is created if its parent exists.
  explicit TrainerOptions(std::string out_dir);

  /// The run folder.
  TORCH_ARG(std::string, out_dir);
  /// A training checkpoint to continue from exactly (its model, optimizer, RNG and data position); null to start
  /// afresh. Its tensors may be on any device.
  TORCH_ARG(std::shared_ptr<const TrainingCheckpoint>, resume) = nullptr;
  /// Where `resume` was read from, for messages.
  TORCH_ARG(std::string, resume_source) = "";
  /// Draw a progress bar when standard error is a terminal; plain log lines otherwise.
  TORCH_ARG(bool, progress) = true;
  /// Log to the console as well as to `train.log`.
  TORCH_ARG(bool, console) = true;
  /// The process group of a multi-process run; null for a single process.
  TORCH_ARG(std::shared_ptr<ProcessGroupContext>, process_group) = nullptr;
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
  /// The signal that stopped the run early (SIGINT, SIGTERM), or 0.
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

  /// Runs the training to its end, or until stop is requested (request_stop()). Errors in the configuration,
  /// the data, the device or a non-finite loss are dkit::Error; the last good checkpoint stays in place.
  TrainSummary run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Asks every running Trainer to finish its current step, write a checkpoint and return: what the SIGINT and
/// SIGTERM handlers call. Async-signal-safe.
void request_stop(int signal) noexcept;

/// The signal passed to request_stop(), or 0.
int stop_requested() noexcept;

/// Clears a stop request (for tests and for a program that trains more than once).
void clear_stop_request() noexcept;

/// Installs SIGINT and SIGTERM handlers that call request_stop(). A second signal of the same kind ends the
/// process at once with the conventional status (128 + signal).
void install_stop_handlers();

/// The summary as `summary.json` holds it.
std::string summary_to_json(const TrainSummary& summary);

} // namespace dkit
