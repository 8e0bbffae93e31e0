#include "console.h"

#include <dkit/core/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

namespace dkit::app {
TrainConsole::TrainConsole(bool bar) : bar_(bar && isatty(STDERR_FILENO) == 1) {}

TrainConsole::~TrainConsole() {
  finish();
}

void TrainConsole::finish() {
  if (bar_ && !last_.empty()) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    last_.clear();
  }
}

TrainerOptions& TrainConsole::attach(TrainerOptions& options) {
  return options.on_log([this](const LogLine& l) { line(l); })
      .on_progress([this](const ProgressUpdate& update) { progress(update); });
}

void TrainConsole::line(const LogLine& line) {
  if (!bar_) {
    std::fprintf(stderr, "%s\n", printable(line.text).c_str());
  } else if (line.headline || line.level == LogLevel::kWarning) {
    std::fprintf(stderr, "\r\033[K%s\n%s", printable(line.text).c_str(), last_.c_str());
  }
  std::fflush(stderr);
}

void TrainConsole::progress(const ProgressUpdate& update) {
  if (!bar_) {
    return;
  }
  constexpr int kWidth = 30;
  const int64_t total = std::max<int64_t>(update.total_steps, 1);
  const int filled = static_cast<int>(kWidth * std::min(update.step, total) / total);
  last_ = "[" + std::string(filled, '#') + std::string(kWidth - filled, ' ') + "] " + std::to_string(update.step) +
          "/" + std::to_string(total) + " " + update.text;
  std::fprintf(stderr, "\r\033[K%s", last_.c_str());
  std::fflush(stderr);
}

void warn_skipped_checkpoints(const std::vector<std::string>& reasons) {
  for (const auto& reason : reasons) {
    std::cerr << "dkit: warning: skipped an unreadable checkpoint: " << printable(reason) << "\n";
  }
}

} // namespace dkit::app
