#include <dkit/train/trainer.h>

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/data/dataset.h>
#include <dkit/data/loader.h>
#include <dkit/device/device.h>
#include <dkit/distributed/data_parallel.h>
#include <dkit/distributed/gradient_reducer.h>
#include <dkit/distributed/process_group.h>
#include <dkit/metrics/metrics.h>
#include <dkit/model/mlp.h>
#include <dkit/train/optim.h>
#include <dkit/train/step.h>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <torch/torch.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <optional>
#include <sstream>

namespace dkit {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::atomic<int> g_stop_signal{0};

void on_stop_signal(int signal) {
  if (g_stop_signal.load() != 0) {
    _exit(128 + signal);
  }
  g_stop_signal.store(signal);
}

std::string data_checksum(const Dataset& data) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  auto mix = [&hash](const at::Tensor& tensor) {
    const at::Tensor bytes = tensor.contiguous();
    const auto* p = static_cast<const unsigned char*>(bytes.data_ptr());
    const size_t n = bytes.numel() * bytes.element_size();
    for (size_t i = 0; i < n; ++i) {
      hash = (hash ^ p[i]) * 0x100000001b3ULL;
    }
  };
  mix(data.features);
  mix(data.labels);
  std::ostringstream out;
  out << "fnv1a64:" << std::hex << std::setw(16) << std::setfill('0') << hash;
  return out.str();
}

int64_t fingerprint(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) {
    hash = (hash ^ c) * 0x100000001b3ULL;
  }
  return static_cast<int64_t>(hash >> 1);
}

Dataset load_data(const FullTrainConfig& c) {
  switch (c.data_source) {
    case DataSource::kCsv: return read_csv(c.data_path, CsvOptions().label_column(c.label_column));
    case DataSource::kMnist: return read_mnist(c.data_path, /*train=*/true);
    case DataSource::kSynthetic:
      return make_synthetic(SyntheticOptions(c.synthetic_samples, c.synthetic_features, c.synthetic_classes)
                                .seed(static_cast<uint64_t>(c.seed)));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled DataSource ", static_cast<int>(c.data_source));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const FullTrainConfig& c,
                                                        const std::vector<torch::Tensor>& params) {
  switch (c.optimizer) {
    case OptimizerKind::kSgd:
      return std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay));
    case OptimizerKind::kAdam:
      return std::make_unique<FusedAdam>(params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
    case OptimizerKind::kAdamW:
      return std::make_unique<FusedAdamW>(params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled OptimizerKind ", static_cast<int>(c.optimizer));
}

std::string format_rate(double samples_per_second) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (samples_per_second >= 1e6) {
    out << samples_per_second / 1e6 << "M";
  } else if (samples_per_second >= 1e3) {
    out << samples_per_second / 1e3 << "k";
  } else {
    out << samples_per_second;
  }
  return out.str();
}

class Progress {
 public:
  Progress(bool enabled, int64_t total) : enabled_(enabled), total_(std::max<int64_t>(total, 1)) {}

  void update(int64_t step, const std::string& text) {
    if (!enabled_) {
      return;
    }
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * std::min<int64_t>(step, total_) / total_);
    last_ = "[" + std::string(filled, '#') + std::string(kWidth - filled, ' ') + "] " + std::to_string(step) +
            "/" + std::to_string(total_) + " " + text;
    std::fprintf(stderr, "\r\033[K%s", last_.c_str());
    std::fflush(stderr);
  }

  void line(const std::string& text) {
    if (!enabled_) {
      return;
    }
    std::fprintf(stderr, "\r\033[K%s\n%s", text.c_str(), last_.c_str());
    std::fflush(stderr);
  }

  void finish() {
    if (enabled_ && !last_.empty()) {
      std::fprintf(stderr, "\r\033[K");
      std::fflush(stderr);
    }
  }

 private:
  bool enabled_;
  int64_t total_;
  std::string last_;
};

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

} // namespace

TrainerOptions::TrainerOptions(std::string out_dir) : out_dir_(std::move(out_dir)) {}

struct Trainer::Impl {
  FullTrainConfig config;
  TrainerOptions options;

  fs::path out_dir;
  std::shared_ptr<spdlog::logger> log;
  std::shared_ptr<spdlog::logger> file_log;
  spdlog::sink_ptr console_sink;
  std::shared_ptr<spdlog::logger> previous_default;
  Device device = cpu();
  Normalization normalization;
  std::string checksum;
  std::string data_description;
  std::optional<Loader> loader;
  at::Tensor val_features;
  at::Tensor val_labels;
  int64_t in_features = 0;
  int64_t num_classes = 0;
  Mlp model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::ofstream metrics_csv;
  std::optional<CheckpointFolder> folder;
  std::shared_ptr<ProcessGroupContext> group;
  bool main = true;
  int64_t world_size = 1;
  std::unique_ptr<GradientReducer> reducer;
  std::vector<Device> data_parallel_devices;
  int64_t val_total = 0;

  int64_t step = 0;
  int64_t epoch = 0;
  int64_t epoch_step = 0;
  int64_t total_steps = 0;
  double window_seconds_start = 0;
  int64_t window_samples = 0;
  int64_t window_local_samples = 0;
  int64_t last_validated_step = -1;
  int64_t saved_step = -1;
  TrainSummary summary;
  Stopwatch train_clock;

  Impl(FullTrainConfig c, TrainerOptions o)
      : config(std::move(c)), options(std::move(o)), group(options.process_group()),
        main(group == nullptr || group->is_main()), world_size(group ? group->world_size() : 1) {}

  void prepare_out_dir() {
    out_dir = fs::absolute(options.out_dir()).lexically_normal();
    if (!main) {
      return;
    }
    const fs::path parent = out_dir.parent_path();
    std::error_code ec;
    DKIT_CHECK(fs::is_directory(parent, ec), "cannot create the run folder '", out_dir.string(), "': its parent '",
               parent.string(), fs::exists(parent, ec) ? "' is not a folder" : "' does not exist");
    fs::create_directories(out_dir / "checkpoints", ec);
    DKIT_CHECK(!ec, "cannot create the run folder '", out_dir.string(), "': ", ec.message());
    const fs::path probe = out_dir / ".dkit-write-test";
    {
      std::ofstream test(probe);
      DKIT_CHECK(test.good() && (test << "ok").good(), "the run folder '", out_dir.string(),
                 "' is not writable");
    }
    fs::remove(probe, ec);
  }

  void setup_logging() {
    if (!main) {
      auto null_sink = std::make_shared<spdlog::sinks::null_sink_mt>();
      log = std::make_shared<spdlog::logger>("dkit.train", null_sink);
      file_log = std::make_shared<spdlog::logger>("dkit.train.file", null_sink);
      previous_default = spdlog::default_logger();
      spdlog::set_default_logger(log);
      return;
    }
    auto file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>((out_dir / "train.log").string());
    std::vector<spdlog::sink_ptr> sinks{file_sink};
    if (options.console()) {
      console_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
      console_sink->set_level(spdlog::level::warn);
      console_sink->set_pattern("%v");
      sinks.push_back(console_sink);
    }
    file_sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    log = std::make_shared<spdlog::logger>("dkit.train", sinks.begin(), sinks.end());
    file_log = std::make_shared<spdlog::logger>("dkit.train.file", file_sink);
    log->set_level(spdlog::level::info);
    log->flush_on(spdlog::level::info);
    previous_default = spdlog::default_logger();
    spdlog::set_default_logger(log);
  }

  void restore_logging() {
    if (previous_default) {
      spdlog::set_default_logger(previous_default);
      previous_default.reset();
    }
  }

  void setup_data() {
    const Dataset all = load_data(config);
    checksum = data_checksum(all);
    data_description = all.description;
    log->info("data: {} ({})", all.description, checksum);
    DatasetSplit parts = split(all, config.val_fraction, static_cast<uint64_t>(config.seed));
    normalization = fit_normalization(parts.train.features, parse_scaling(config.scaling));
    const Dataset train = normalization.apply(parts.train);
    in_features = train.num_features();
    num_classes = all.num_classes;
    val_total = parts.val.size();
    if (val_total > 0) {
      at::Tensor features = normalization.apply(parts.val.features);
      at::Tensor labels = parts.val.labels;
      if (group) {
        const int64_t begin = val_total * group->rank() / world_size;
        const int64_t end = val_total * (group->rank() + 1) / world_size;
        features = features.narrow(0, begin, end - begin);
        labels = labels.narrow(0, begin, end - begin);
      }
      val_features = features.to(device);
      val_labels = labels.to(device);
    }
    const int64_t rank = group ? group->rank() : 0;
    loader.emplace(train, device,
                   LoaderOptions(config.batch_size)
                       .shuffle(config.shuffle)
                       .drop_last(config.drop_last)
                       .placement(parse_placement(config.placement))
                       .prefetch(config.prefetch)
                       .seed(static_cast<uint64_t>(config.seed))
                       .rank(rank)
                       .world_size(world_size));
    if (group) {
      log->info("split: {} training, {} validation samples; {} global batches of {} per epoch ({} processes of {}), "
                "loader placement {}",
                train.size(), parts.val.size(), loader->batches_per_epoch(), config.batch_size * world_size,
                world_size, config.batch_size, to_string(loader->placement()));
    } else {
      log->info("split: {} training, {} validation samples; {} batches of {} per epoch, loader placement {}",
                train.size(), parts.val.size(), loader->batches_per_epoch(), config.batch_size,
                to_string(loader->placement()));
    }
  }

  void setup_model() {
    model = Mlp(MlpOptions(in_features, config.hidden, num_classes)
                    .activation(parse_activation(config.activation))
                    .dropout(config.dropout));
    place_module(model, device);
    optimizer = make_optimizer(config, model->parameters());
    log->info("model: {} on {}, optimizer {} lr {}", model_description(), device.str(), to_string(config.optimizer),
              config.lr);
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
    data_parallel_devices.push_back(device);
    for (int64_t i = 0; i < num_gpus(); ++i) {
      if (gpu(i) != device) {
        data_parallel_devices.push_back(gpu(i));
      }
    }
    log->info("DataParallel over {} GPUs", data_parallel_devices.size());
  }

  /// Makes every rank start from rank 0's weights, checks that the ranks agree on what they train (resume point,
  /// data, shapes), and hooks the gradient allreduce.
  void join_ranks() {
    std::vector<at::Tensor> state;
    for (const auto& param : model->parameters()) {
      state.push_back(param.detach());
    }
    for (const auto& buffer : model->buffers()) {
      state.push_back(buffer);
    }
    group->broadcast(state, "the broadcast of rank 0's weights");
    const std::vector<std::pair<const char*, int64_t>> facts = {
        {"step", step},
        {"epoch", epoch},
        {"batch in epoch", epoch_step},
        {"train.batch_size", config.batch_size},
        {"data checksum", fingerprint(checksum)},
        {"config", fingerprint(to_yaml(config_without_path()))},
    };
    std::vector<int64_t> mine;
    for (const auto& fact : facts) {
      mine.push_back(fact.second);
    }
    auto theirs = torch::tensor(mine, torch::kInt64).to(device);
    group->broadcast({theirs}, "the broadcast of rank 0's starting point");
    const auto host = theirs.to(torch::kCPU);
    note_host_sync();
    for (size_t i = 0; i < facts.size(); ++i) {
      const int64_t rank0 = host.data_ptr<int64_t>()[i];
      DKIT_CHECK(rank0 == mine[i], "rank ", group->rank(), " does not start where rank 0 does: its ", facts[i].first,
                 " differs (", i < 4 ? std::to_string(mine[i]) : "hash " + std::to_string(mine[i]), ", rank 0: ",
                 i < 4 ? std::to_string(rank0) : "hash " + std::to_string(rank0),
                 "); every rank must be given the same config, data and checkpoint folder");
    }
    reducer = std::make_unique<GradientReducer>(model->parameters(), group);
    log->info("{} processes over {} ({}): gradients summed in {} bucket(s)", world_size, group->backend(),
              group->launch().master_addr + ":" + std::to_string(group->launch().master_port),
              reducer->buckets().size());
  }

  FullTrainConfig config_without_path() const {
    FullTrainConfig copy = config;
    copy.data_path.clear();
    return copy;
  }

  std::string model_description() const {
    std::ostringstream out;
    model->pretty_print(out);
    return out.str();
  }

  void zero_grad() {
    for (auto& param : model->parameters()) {
      param.mutable_grad() = at::Tensor();
    }
  }

  void open_metrics_csv(bool append) {
    const fs::path path = out_dir / "metrics.csv";
    const bool exists = append && fs::exists(path);
    metrics_csv.open(path, append ? std::ios::app : std::ios::trunc);
    DKIT_CHECK(metrics_csv.good(), "cannot write '", path.string(), "'");
    if (!exists) {
      metrics_csv << "step,epoch,loss,accuracy,lr,samples_per_second,val_loss,val_accuracy\n";
    }
  }

  double current_lr() const {
    return optimizer->param_groups().front().options().get_lr();
  }

  /// Logs the window's metrics. In a multi-process run the sums of every rank are added up in one allreduce,
  /// which also carries the stop requests: returns the signal that stops every rank, or 0.
  int flush_metrics(MetricBuffer& metrics, Progress& progress) {
    if (metrics.empty()) {
      return 0;
    }
    const MetricRows rows = metrics.flush();
    const double seconds = train_clock.seconds() - window_seconds_start;
    double loss_sum = rows.sum("loss_sum");
    double correct = rows.sum("correct");
    double samples = static_cast<double>(window_local_samples);
    int stop = 0;
    if (group) {
      const int signal = stop_requested();
      const auto total = group->allreduce_sum({loss_sum, correct, samples, signal != 0 ? 1.0 : 0.0,
                                               static_cast<double>(signal)},
                                              "the metrics allreduce at step " + std::to_string(step));
      loss_sum = total[0];
      correct = total[1];
      samples = total[2];
      if (total[3] > 0) {
        stop = signal != 0 ? signal : static_cast<int>(std::lround(total[4] / total[3]));
      }
    }
    const double loss = loss_sum / samples;
    const double accuracy = correct / samples;
    DKIT_CHECK(std::isfinite(loss), "training diverged: the loss is ", loss, " at step ", step, " (epoch ",
               epoch + 1, "); no checkpoint was written after it, the last good one is in '",
               (out_dir / "checkpoints").string(), "'; lower train.lr");
    const double rate = seconds > 0 ? window_samples / seconds : 0.0;
    summary.final_loss = loss;
    if (main) {
      metrics_csv << step << "," << epoch + 1 << "," << format_number(loss) << "," << format_number(accuracy) << ","
                  << format_number(current_lr()) << "," << format_number(rate) << ",,\n";
    }
    std::ostringstream text;
    text << "epoch " << epoch + 1 << "/" << config.epochs << " loss " << std::fixed << std::setprecision(4) << loss
         << " acc " << accuracy << " " << format_rate(rate) << " samples/s";
    log->info("step {}/{} {}", step, total_steps, text.str());
    progress.update(step, text.str());
    window_seconds_start = train_clock.seconds();
    window_samples = 0;
    window_local_samples = 0;
    return stop;
  }

  std::pair<double, double> validate() {
    if (!val_features.defined()) {
      return {std::nan(""), std::nan("")};
    }
    torch::NoGradGuard no_grad;
    model->eval();
    constexpr int64_t kChunk = 8192;
    auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
    const int64_t n = val_features.size(0);
    for (int64_t start = 0; start < n; start += kChunk) {
      const int64_t length = std::min(kChunk, n - start);
      const auto x = val_features.narrow(0, start, length);
      const auto y = val_labels.narrow(0, start, length);
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
    return {sums[0] / static_cast<double>(val_total), sums[1] / static_cast<double>(val_total)};
  }

  void end_epoch(Progress& progress) {
    const auto [val_loss, val_accuracy] = validate();
    summary.val_accuracy = val_accuracy;
    last_validated_step = step;
    if (main) {
      metrics_csv << step << "," << epoch + 1 << ",,,,," << format_number(val_loss) << "," << format_number(val_accuracy)
                  << "\n";
      metrics_csv.flush();
    }
    std::ostringstream text;
    text << "epoch " << epoch + 1 << "/" << config.epochs << " done at step " << step << ": val loss "
         << std::fixed << std::setprecision(4) << val_loss << " val acc " << val_accuracy;
    log->info("{}", text.str());
    progress.line(text.str());
  }

  void save_checkpoint() {
    if (!main) {
      saved_step = step;
      return;
    }
    TrainingCheckpoint checkpoint;
    checkpoint.model_state_dict = module_state_dict(*model);
    checkpoint.model = model->options;
    checkpoint.input_mean = normalization.mean;
    checkpoint.input_std = normalization.std;
    checkpoint.optimizer_state_dict = optimizer_state_dict(*optimizer);
    checkpoint.step = step;
    checkpoint.epoch = epoch;
    checkpoint.epoch_step = epoch_step;
    checkpoint.rng = capture_rng_state();
    checkpoint.config = to_yaml(config);
    checkpoint.data_checksum = checksum;
    checkpoint.world_size = world_size;
    summary.checkpoint = folder->save(checkpoint);
    saved_step = step;
    log->info("checkpoint {}", summary.checkpoint);
  }

  void restore(const TrainingCheckpoint& checkpoint, const std::string& source) {
    DKIT_CHECK(checkpoint.data_checksum == checksum, "cannot resume from ", source,
               ": the training data changed since it was written (checksum ", checkpoint.data_checksum, ", now ",
               checksum, "); start a new run instead");
    load_state_dict(*model, checkpoint.model_state_dict, LoadStateDictOptions().source(source));
    load_optimizer_state_dict(*optimizer, checkpoint.optimizer_state_dict, source);
    restore_rng_state(checkpoint.rng);
    step = checkpoint.step;
    epoch = checkpoint.epoch;
    epoch_step = checkpoint.epoch_step;
    saved_step = step;
    const int64_t saved_batch = FullTrainConfig(parse_config(checkpoint.config, source, ".")).batch_size;
    const int64_t saved_global = saved_batch * checkpoint.world_size;
    const int64_t global = config.batch_size * world_size;
    if (saved_global != global && epoch_step > 0) {
      const int64_t samples_done = epoch_step * saved_global;
      DKIT_CHECK(samples_done % global == 0, "cannot resume from ", source, ": it stopped after ", epoch_step,
                 " global batches of ", saved_global, " (", checkpoint.world_size, " process(es) x train.batch_size ",
                 saved_batch, ") in epoch ", epoch + 1, ", ", samples_done, " samples, which is no whole number of "
                 "this run's global batches of ", global, " (", world_size, " process(es) x train.batch_size ",
                 config.batch_size, "); resume with a global batch of ", saved_global);
      epoch_step = samples_done / global;
      log->warn("the global batch changed from {} to {}: epoch {} continues at batch {} (after sample {})",
                saved_global, global, epoch + 1, epoch_step, samples_done);
    }
    log->info("resumed from {} at step {} (epoch {}, batch {})", source, step, epoch + 1, epoch_step);
  }

  TrainSummary run() {
    prepare_out_dir();
    setup_logging();
    try {
      TrainSummary result = train();
      restore_logging();
      return result;
    } catch (const std::exception& e) {
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      const std::string message = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
      file_log->error("{}", message);
      file_log->flush();
      if (group) {
        group->publish_failure(message);
      }
      restore_logging();
      throw;
    }
  }

  TrainSummary train() {
    const int64_t cpus = std::max<int64_t>(cpu_count(), 1);
    const int64_t share = group ? std::max<int64_t>(1, cpus / group->launch().local_world_size) : cpus;
    at::set_num_threads(static_cast<int>(config.threads > 0 ? config.threads : share));
    device = group ? group->device() : parse_device(config.device);
    torch::manual_seed(static_cast<uint64_t>(config.seed));
    summary.device = device.str();
    log->info("dkit train: device {}, {} CPU threads, out {}", device.str(), at::get_num_threads(),
              out_dir.string());
    if (main) {
      std::ofstream saved(out_dir / "config.yaml");
      saved << to_yaml(config);
    }
    setup_data();
    setup_model();
    setup_data_parallel();
    if (main) {
      folder.emplace(out_dir.string(), CheckpointFolderOptions().keep(config.keep_checkpoints));
    }
    const bool resuming = options.resume() != nullptr;
    if (resuming) {
      restore(*options.resume(), options.resume_source());
    }
    if (group) {
      join_ranks();
    }
    if (main) {
      open_metrics_csv(resuming);
    }
    if (console_sink && !(options.progress() && isatty(STDERR_FILENO) == 1)) {
      console_sink->set_level(spdlog::level::info);
    }
    const std::string processes =
        group ? fmt::format(" x {} processes ({}, global batch {})", world_size, group->backend(),
                            config.batch_size * world_size)
              : std::string();
    const std::string start = fmt::format("training {} on {} ({} CPU threads){}: {}; {} batches of {} per epoch; run folder {}",
                                          model_description(), device.str(), at::get_num_threads(), processes,
                                          data_description, loader->batches_per_epoch(), config.batch_size,
                                          out_dir.string());
    log->info("{}", start);
    total_steps = step + (config.epochs - epoch) * loader->batches_per_epoch() - epoch_step;
    if (config.max_steps > 0) {
      total_steps = std::min(total_steps, config.max_steps);
    }
    reset_peak_memory_stats(device);

    MetricBuffer metrics({"loss_sum", "correct"}, device, config.log_every);
    Progress progress(main && options.progress() && options.console() && isatty(STDERR_FILENO) == 1, total_steps);
    progress.line(start);
    const int64_t syncs_before = host_sync_count();
    const auto sum_options = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);
    const bool data_parallel = !data_parallel_devices.empty();
    // The written-out step has no autograd hooks for the gradient reducer to start its allreduces from, and
    // DataParallel replicates the model each step: both take autograd's path below.
    std::optional<TrainStep> train_step;
    if (!reducer && !data_parallel) {
      train_step.emplace(model, *optimizer);
    }
    bool finished = step >= total_steps;
    model->train();
    train_clock.start();
    window_seconds_start = train_clock.seconds();
    while (!finished && epoch < config.epochs) {
      loader->start_epoch(epoch, epoch_step);
      while (auto batch = loader->next()) {
        if (train_step) {
          const StepOutput out = train_step->run(batch->features, batch->labels, batch->global_samples);
          metrics.add({out.loss_sum, out.correct});
        } else {
          zero_grad();
          const auto logits = data_parallel ? data_parallel_forward(model, batch->features, data_parallel_devices)
                                            : model->forward(batch->features);
          const auto loss_sum = torch::nn::functional::cross_entropy(logits, batch->labels, sum_options);
          (loss_sum / static_cast<double>(batch->global_samples)).backward();
          if (reducer) {
            reducer->synchronize();
          }
          optimizer->step();
          metrics.add({loss_sum.detach(), logits.detach().argmax(1).eq(batch->labels).sum()});
        }
        ++step;
        ++epoch_step;
        window_samples += batch->global_samples;
        window_local_samples += batch->size();
        summary.samples += batch->global_samples;
        const bool at_limit = step >= total_steps;
        const bool checkpoint_due = config.checkpoint_every > 0 && step % config.checkpoint_every == 0;
        int stop = 0;
        if (!group) {
          if (metrics.full()) {
            flush_metrics(metrics, progress);
          }
          stop = stop_requested();
        } else if (metrics.full() || at_limit || checkpoint_due) {
          stop = flush_metrics(metrics, progress);
        }
        if (at_limit || stop != 0 || checkpoint_due) {
          flush_metrics(metrics, progress);
          train_clock.stop();
          save_checkpoint();
          if (stop != 0) {
            summary.stopped_by_signal = stop;
            log->warn("stopped by signal {} after step {}; checkpoint {}", summary.stopped_by_signal, step,
                      summary.checkpoint);
            finished = true;
            break;
          }
          train_clock.start();
        }
        if (at_limit) {
          finished = true;
          break;
        }
      }
      train_clock.stop();
      if (summary.stopped_by_signal != 0) {
        break;
      }
      if (epoch_step >= loader->batches_per_epoch()) {
        end_epoch(progress);
        ++epoch;
        epoch_step = 0;
      }
      train_clock.start();
    }
    train_clock.stop();
    flush_metrics(metrics, progress);
    if (last_validated_step != step) {
      summary.val_accuracy = validate().second;
      last_validated_step = step;
    }
    progress.finish();
    if (saved_step != step) {
      save_checkpoint();
    }
    if (group) {
      group->barrier("the final barrier, after rank 0 wrote its checkpoint");
    }
    summary.steps = step;
    summary.train_seconds = train_clock.seconds();
    summary.samples_per_second = summary.train_seconds > 0 ? summary.samples / summary.train_seconds : 0.0;
    summary.peak_memory_bytes = memory_stats(device).peak_allocated_bytes;
    summary.host_syncs = host_sync_count() - syncs_before;
    if (main) {
      std::ofstream json(out_dir / "summary.json");
      json << summary_to_json(summary);
    }
    log->info("done: {} steps, {} samples in {:.3f} s of training ({} samples/s), final loss {:.4f}, val acc {:.4f}",
              summary.steps, summary.samples, summary.train_seconds, format_rate(summary.samples_per_second),
              summary.final_loss, summary.val_accuracy);
    return summary;
  }
};

Trainer::Trainer(FullTrainConfig config, TrainerOptions options)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(options))) {}

Trainer::~Trainer() = default;

TrainSummary Trainer::run() {
  return impl_->run();
}

void request_stop(int signal) noexcept {
  g_stop_signal.store(signal);
}

int stop_requested() noexcept {
  return g_stop_signal.load();
}

void clear_stop_request() noexcept {
  g_stop_signal.store(0);
}

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
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
