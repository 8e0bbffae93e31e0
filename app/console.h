#pragma once

#include <dkit/train/trainer.h>

#include <memory>
#include <string>
#include <vector>

namespace dkit::app {

/// What `dkit train` shows on standard error while a run trains: a progress bar with the headlines above it when
/// standard error is a terminal, every log line otherwise.
class TrainConsole {
 public:
  /// A console that draws a bar when `bar` is asked for and standard error is a terminal.
  explicit TrainConsole(bool bar);
  /// Clears the bar.
  ~TrainConsole();
  TrainConsole(const TrainConsole&) = delete;
  TrainConsole& operator=(const TrainConsole&) = delete;

  /// Passes the run's lines and progress to this console.
  TrainerOptions& attach(TrainerOptions& options);
  /// Clears the bar, before the lines that follow the run.
  void finish();

 private:
  void line(const LogLine& line);
  void progress(const ProgressUpdate& update);

  bool bar_;
  std::string last_;
};

/// Warns on standard error of each checkpoint a search of a run folder skipped: one line per `PATH: reason`.
void warn_skipped_checkpoints(const std::vector<std::string>& reasons);

} // namespace dkit::app
