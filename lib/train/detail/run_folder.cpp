#include <dkit/train/detail/run_folder.h>

#include <dkit/core/error.h>
#include <dkit/core/format.h>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <initializer_list>
#include <utility>

namespace dkit::detail {
namespace {

namespace fs = std::filesystem;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void add_scalars(EventFileWriter& events, int64_t step, std::initializer_list<std::pair<const char*, double>> values) {
  const double wall_time = now_seconds();
  for (const auto& [tag, value] : values) {
    events.add_scalar(tag, static_cast<float>(value), step, wall_time);
  }
  events.flush();
}

} // namespace

RunFolder::RunFolder(const std::string& out_dir, bool writes, std::function<void(const LogLine&)> on_log)
    : path_(fs::absolute(out_dir).lexically_normal()), writes_(writes), on_log_(std::move(on_log)) {
  if (!writes_) {
    return;
  }
  const fs::path parent = path_.parent_path();
  std::error_code ec;
  DKIT_CHECK(fs::is_directory(parent, ec), "cannot create the run folder '", path_.string(), "': its parent '",
             parent.string(), fs::exists(parent, ec) ? "' is not a folder" : "' does not exist");
  fs::create_directories(path_ / "checkpoints", ec);
  DKIT_CHECK(!ec, "cannot create the run folder '", path_.string(), "': ", ec.message());
  const fs::path probe = path_ / ".dkit-write-test";
  {
    std::ofstream test(probe);
    DKIT_CHECK(test.good() && (test << "ok").good(), "the run folder '", path_.string(), "' is not writable");
  }
  fs::remove(probe, ec);
  auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>((path_ / "train.log").string());
  sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  file_ = std::make_shared<spdlog::logger>("dkit.train", std::move(sink));
  file_->set_level(spdlog::level::info);
  file_->flush_on(spdlog::level::info);
}

RunFolder::~RunFolder() = default;

void RunFolder::log(LogLevel level, const std::string& text, bool headline) {
  if (file_) {
    file_->log(level == LogLevel::kWarning ? spdlog::level::warn : spdlog::level::info, "{}", text);
  }
  if (on_log_ && (echo_ || level == LogLevel::kWarning)) {
    on_log_(LogLine{level, headline, text});
  }
}

void RunFolder::log_error(const std::string& text) {
  if (file_) {
    file_->error("{}", text);
    file_->flush();
  }
}

void RunFolder::write_config(const std::string& yaml) {
  if (writes_) {
    std::ofstream(path_ / "config.yaml") << yaml;
  }
}

void RunFolder::open_metrics(bool append) {
  if (!writes_) {
    return;
  }
  const fs::path path = path_ / "metrics.csv";
  const bool exists = append && fs::exists(path);
  metrics_.open(path, append ? std::ios::app : std::ios::trunc);
  DKIT_CHECK(metrics_.good(), "cannot write '", path.string(), "'");
  if (!exists) {
    metrics_ << "step,epoch,loss,accuracy,lr,samples_per_second,val_loss,val_accuracy\n";
  }
}

void RunFolder::open_events(int64_t step) {
  if (!writes_) {
    return;
  }
  events_.emplace(path_.string());
  if (step > 0) {
    events_->add_restart(step + 1);
    events_->flush();
  }
  log(LogLevel::kInfo, "TensorBoard event file " + events_->path());
}

void RunFolder::add_train_row(int64_t step, int64_t epoch, double loss, double accuracy, double lr, double rate) {
  if (metrics_.is_open()) {
    metrics_ << step << "," << epoch << "," << format_number(loss) << "," << format_number(accuracy) << ","
             << format_number(lr) << "," << format_number(rate) << ",,\n";
  }
  if (events_) {
    add_scalars(*events_, step,
                {{"train/loss", loss},
                 {"train/accuracy", accuracy},
                 {"train/lr", lr},
                 {"train/samples_per_second", rate}});
  }
}

void RunFolder::add_val_row(int64_t step, int64_t epoch, double val_loss, double val_accuracy) {
  if (metrics_.is_open()) {
    metrics_ << step << "," << epoch << ",,,,," << format_number(val_loss) << "," << format_number(val_accuracy)
             << "\n";
    metrics_.flush();
  }
  if (events_ && !std::isnan(val_accuracy)) {
    add_scalars(*events_, step, {{"val/loss", val_loss}, {"val/accuracy", val_accuracy}});
  }
}

void RunFolder::write_summary(const TrainSummary& summary) {
  if (writes_) {
    std::ofstream(path_ / "summary.json") << summary_to_json(summary);
  }
}

} // namespace dkit::detail
