#pragma once

#include <dkit/metrics/event_file.h>
#include <dkit/train/trainer.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace spdlog {
class logger;
} // namespace spdlog

namespace dkit::detail {

/// A training run's folder and the files in it besides the checkpoints: `train.log`, `config.yaml`, `metrics.csv`,
/// `summary.json` and, with `train.tensorboard`, TensorBoard event files. Only the process that writes the run
/// (rank 0) touches the disk; on other ranks every write is dropped.
class RunFolder {
 public:
  /// The run in `out_dir`. With `writes`, the folder and its `checkpoints/` are created (the parent must exist)
  /// and probed for writing, and `train.log` is opened for appending; an error names the folder at fault.
  RunFolder(const std::string& out_dir, bool writes, std::function<void(const LogLine&)> on_log);
  ~RunFolder();
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;

  /// The folder, absolute.
  const std::filesystem::path& path() const {
    return path_;
  }
  /// Whether this process writes the run.
  bool writes() const {
    return writes_;
  }

  /// Writes a line to `train.log`; passes it on to the log callback once echo() was called, or at once when it is a
  /// warning.
  void log(LogLevel level, const std::string& text, bool headline = false);
  /// From now on every line goes to the log callback too.
  void echo() {
    echo_ = true;
  }
  /// Writes an error to `train.log` only: the caller reports it.
  void log_error(const std::string& text);

  /// Writes `config.yaml`.
  void write_config(const std::string& yaml);
  /// Opens `metrics.csv` for a task with metrics `metric_names` besides the loss. A run that starts after step
  /// `resumed_step` (a resumed run) continues the existing file, without the rows an earlier process wrote after that
  /// step (past its last checkpoint) before it was stopped, so that each step has one row; otherwise the file starts
  /// afresh with the header row.
  void open_metrics(const std::vector<std::string>& metric_names, std::optional<int64_t> resumed_step);
  /// Opens a new TensorBoard event file; from now on each row of `metrics.csv` goes into it as scalars too. A run
  /// that starts after step `step` (a resumed run) marks `step + 1` with a SessionLog START, so that TensorBoard
  /// drops what an earlier process wrote after that step (past its last checkpoint) before it was stopped.
  void open_events(int64_t step);
  /// A training row of `metrics.csv`, flushed at once: the window's loss and metrics (in open_metrics()'s order); with an event
  /// file, the scalars `train/loss`, `train/METRIC`, `train/lr` and `train/samples_per_second` at `step`, flushed.
  void add_train_row(int64_t step, int64_t epoch, double loss, const std::vector<double>& metrics, double lr,
                     double rate);
  /// A validation row of `metrics.csv`, flushed at once; with an event file, the scalars `val/loss` and
  /// `val/METRIC` at `step`, flushed (none when there is no validation data: the loss is NaN).
  void add_val_row(int64_t step, int64_t epoch, double val_loss, const std::vector<double>& val_metrics);
  /// Writes `summary.json`.
  void write_summary(const TrainSummary& summary);

 private:
  std::filesystem::path path_;
  bool writes_;
  bool echo_ = false;
  std::function<void(const LogLine&)> on_log_;
  std::shared_ptr<spdlog::logger> file_;
  std::ofstream metrics_;
  std::vector<std::string> metric_names_;
  std::optional<EventFileWriter> events_;
};

} // namespace dkit::detail
