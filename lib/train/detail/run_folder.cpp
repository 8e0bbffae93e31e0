#include <dkit/train/detail/run_folder.h>

#include <dkit/core/error.h>
#include <dkit/core/format.h>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <utility>

namespace dkit::detail {
namespace {

namespace fs = std::filesystem;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void add_scalars(EventFileWriter& events, int64_t step, const std::vector<std::pair<std::string, double>>& values) {
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

void RunFolder::open_metrics(const std::vector<std::string>& metric_names, std::optional<int64_t> resumed_step) {
  metric_names_ = metric_names;
  if (!writes_) {
    return;
  }
  const fs::path path = path_ / "metrics.csv";
  std::string kept;
  if (resumed_step && fs::exists(path)) {
    std::ifstream in(path);
    std::string line;
    for (bool header = true; std::getline(in, line); header = false) {
      int64_t step = 0;
      const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), step);
      if (header || (ec == std::errc() && *end == ',' && step <= *resumed_step)) {
        kept += line + "\n";
      }
    }
    const fs::path rewritten = path_ / "metrics.csv.tmp";
    std::ofstream(rewritten, std::ios::trunc) << kept;
    fs::rename(rewritten, path);
  }
  metrics_.open(path, kept.empty() ? std::ios::trunc : std::ios::app);
  DKIT_CHECK(metrics_.good(), "cannot write '", path.string(), "'");
  if (kept.empty()) {
    metrics_ << "step,epoch,loss";
    for (const auto& name : metric_names_) {
      metrics_ << "," << name;
    }
    metrics_ << ",lr,samples_per_second,val_loss";
    for (const auto& name : metric_names_) {
      metrics_ << ",val_" << name;
    }
    metrics_ << "\n";
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

void RunFolder::add_train_row(int64_t step, int64_t epoch, double loss, const std::vector<double>& metrics,
                              double lr, double rate) {
  if (metrics_.is_open()) {
    metrics_ << step << "," << epoch << "," << format_number(loss);
    for (const double value : metrics) {
      metrics_ << "," << format_number(value);
    }
    metrics_ << "," << format_number(lr) << "," << format_number(rate) << "," << std::string(metrics.size(), ',')
             << "\n";
    metrics_.flush();
  }
  if (events_) {
    std::vector<std::pair<std::string, double>> scalars = {{"train/loss", loss}};
    for (size_t i = 0; i < metrics.size(); ++i) {
      scalars.emplace_back("train/" + metric_names_[i], metrics[i]);
    }
    scalars.emplace_back("train/lr", lr);
    scalars.emplace_back("train/samples_per_second", rate);
    add_scalars(*events_, step, scalars);
  }
}

void RunFolder::add_val_row(int64_t step, int64_t epoch, double val_loss, const std::vector<double>& val_metrics) {
  if (metrics_.is_open()) {
    metrics_ << step << "," << epoch << "," << std::string(val_metrics.size() + 3, ',') << format_number(val_loss);
    for (const double value : val_metrics) {
      metrics_ << "," << format_number(value);
    }
    metrics_ << "\n";
    metrics_.flush();
  }
  if (events_ && !std::isnan(val_loss)) {
    std::vector<std::pair<std::string, double>> scalars = {{"val/loss", val_loss}};
    for (size_t i = 0; i < val_metrics.size(); ++i) {
      scalars.emplace_back("val/" + metric_names_[i], val_metrics[i]);
    }
    add_scalars(*events_, step, scalars);
  }
}

void RunFolder::write_summary(const TrainSummary& summary) {
  if (writes_) {
    std::ofstream(path_ / "summary.json") << summary_to_json(summary);
  }
}

} // namespace dkit::detail
