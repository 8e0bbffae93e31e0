#include <dkit/bench/train_common.h>

#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/train/optim.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace dkit::bench::detail {
namespace {

constexpr int64_t kPythonWarmupSteps = 100;
constexpr int64_t kPythonWarmupSamples = 25600;
constexpr int64_t kPythonWarmupFewest = 10;

std::string default_python() {
  return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

std::string default_python_script() {
  const std::filesystem::path installed = std::filesystem::path(DKIT_BENCH_SCRIPT_DIR_FROM_BIN) / "mlp_train.py";
  std::error_code error;
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) {
    return installed.string();
  }
  const std::filesystem::path beside = program.parent_path() / "mlp_train.py";
  if (std::filesystem::exists(beside, error)) {
    return beside.string();
  }
  return (program.parent_path() / installed).lexically_normal().string();
}

} // namespace

const std::vector<int64_t>& hidden_sizes() {
  static const std::vector<int64_t> sizes = {256, 256};
  return sizes;
}

int64_t weight_products() {
  int64_t total = 0;
  int64_t in = kFeatures;
  for (const int64_t out : hidden_sizes()) {
    total += in * out;
    in = out;
  }
  return total + in * kClasses;
}

int64_t parameter_count() {
  int64_t biases = kClasses;
  for (const int64_t h : hidden_sizes()) {
    biases += h;
  }
  return weight_products() + biases;
}

double matmul_flops(int64_t batch) {
  return 2.0 * static_cast<double>(batch) *
         static_cast<double>(3 * weight_products() - kFeatures * hidden_sizes().front());
}

std::unique_ptr<torch::optim::Optimizer> BenchOptimizer::make(const std::vector<at::Tensor>& params,
                                                              bool fused) const {
  switch (kind) {
    case OptimizerKind::kSgd: {
      const auto options =
          torch::optim::SGDOptions(lr).momentum(momentum).nesterov(nesterov).weight_decay(weight_decay);
      if (fused) {
        return std::make_unique<FusedSGD>(params, options);
      }
      return std::make_unique<torch::optim::SGD>(params, options);
    }
    case OptimizerKind::kAdam: {
      const auto options = torch::optim::AdamOptions(lr).weight_decay(weight_decay);
      if (fused) {
        return std::make_unique<FusedAdam>(params, options);
      }
      return std::make_unique<torch::optim::Adam>(params, options);
    }
    case OptimizerKind::kAdamW: {
      const auto options = torch::optim::AdamWOptions(lr).weight_decay(weight_decay);
      if (fused) {
        return std::make_unique<FusedAdamW>(params, options);
      }
      return std::make_unique<torch::optim::AdamW>(params, options);
    }
    case OptimizerKind::kRmsprop:
      return std::make_unique<torch::optim::RMSprop>(
          params, torch::optim::RMSpropOptions(lr).momentum(momentum).weight_decay(weight_decay));
    case OptimizerKind::kAdagrad:
      return std::make_unique<torch::optim::Adagrad>(params, torch::optim::AdagradOptions(lr).weight_decay(weight_decay));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled OptimizerKind ", static_cast<int>(kind));
}

std::vector<std::string> BenchOptimizer::python_arguments() const {
  std::vector<std::string> args = {"--optimizer", to_string(kind), "--lr", format_number(lr), "--weight-decay",
                                   format_number(weight_decay)};
  if (kind == OptimizerKind::kSgd) {
    args.insert(args.end(), {"--momentum", format_number(momentum)});
    if (nesterov) {
      args.emplace_back("--nesterov");
    }
  }
  return args;
}

std::string BenchOptimizer::describe() const {
  std::string text = std::string(name_of(kOptimizerClassNames, kind)) + "(lr=" + format_number(lr);
  if (kind == OptimizerKind::kSgd && momentum != 0) {
    text += ", momentum=" + format_number(momentum);
  }
  if (nesterov) {
    text += ", nesterov=True";
  }
  if (weight_decay != 0) {
    text += ", weight_decay=" + format_number(weight_decay);
  }
  return text + ")";
}

const std::vector<BenchOptimizer>& bench_optimizers() {
  static const std::vector<BenchOptimizer> optimizers = {
      {"sgd", OptimizerKind::kSgd, 0.05, 0.0, false, 0.0},
      {"sgd-momentum", OptimizerKind::kSgd, 0.05, 0.9, false, 0.0},
      {"sgd-nesterov-wd", OptimizerKind::kSgd, 0.05, 0.9, true, 5e-4},
      {"adam", OptimizerKind::kAdam, 1e-3, 0.0, false, 0.0},
      {"adamw", OptimizerKind::kAdamW, 1e-3, 0.0, false, 0.01},
  };
  return optimizers;
}

const BenchOptimizer& find_bench_optimizer(std::string_view name) {
  const auto& all = bench_optimizers();
  const auto found = std::find_if(all.begin(), all.end(), [&](const BenchOptimizer& o) { return o.name == name; });
  TORCH_INTERNAL_ASSERT(found != all.end(), "bench_optimizers() has no '", name, "'");
  return *found;
}

TrainRunner::TrainRunner(const Dataset& data, const Device& device, int64_t batch, Placement placement,
                         const BenchOptimizer& optimizer, bool fused, bool graph, Precision precision)
    : loader_(data, device, LoaderOptions(batch).placement(placement).drop_last(true).seed(1)),
      model_(MlpOptions(kFeatures, hidden_sizes(), kClasses)),
      metrics_({"loss_sum", "correct"}, device, kLogEvery) {
  place_module(model_, device);
  optimizer_ = optimizer.make(model_->parameters(), fused);
#if DKIT_WITH_CUDA
  if (graph) {
    auto* adam = dynamic_cast<torch::optim::Adam*>(optimizer_.get());
    TORCH_INTERNAL_ASSERT(adam != nullptr, "the CUDA graph step takes Adam");
    graph_ = std::make_unique<CudaGraphStep>(model_, *adam, batch, kFeatures);
  }
#else
  TORCH_INTERNAL_ASSERT(!graph, "a CUDA graph step needs a CUDA build");
#endif
  TORCH_INTERNAL_ASSERT(!graph || precision == Precision::kFloat32, "the CUDA graph step trains in float32");
  if (precision == Precision::kFloat16) {
    scaler_ = std::make_unique<GradScaler>();
  }
  step_.emplace(model_, *optimizer_, TrainStepOptions().precision(precision).scaler(scaler_.get()));
  loader_.start_epoch(epoch_);
}

bool TrainRunner::pinned() const {
  return loader_.pinned();
}

void TrainRunner::step() {
  std::optional<Batch> batch = loader_.next();
  if (!batch) {
    loader_.start_epoch(++epoch_);
    batch = loader_.next();
  }
  StepOutput out;
#if DKIT_WITH_CUDA
  if (graph_) {
    out = graph_->run(batch->features, batch->labels);
  }
#endif
  if (!out.loss_sum.defined()) {
    out = step_->run(batch->features, batch->labels, batch->global_samples);
  }
  metrics_.add({out.loss_sum, out.correct});
  if (metrics_.full()) {
    metrics_.flush();
  }
}

MatmulLimit::MatmulLimit(const Device& device, int64_t batch, c10::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  const auto random = [&](at::IntArrayRef sizes) {
    return at::randn(sizes, options.dtype(at::kFloat)).to(dtype);
  };
  std::vector<int64_t> widths = {kFeatures};
  widths.insert(widths.end(), hidden_sizes().begin(), hidden_sizes().end());
  widths.push_back(kClasses);
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    weights_.push_back(random({widths[i + 1], widths[i]}));
    inputs_.push_back(random({batch, widths[i]}));
    outputs_.push_back(at::empty({batch, widths[i + 1]}, options));
    output_grads_.push_back(random({batch, widths[i + 1]}));
    weight_grads_.push_back(at::empty({widths[i + 1], widths[i]}, options));
    input_grads_.push_back(at::empty({batch, widths[i]}, options));
  }
}

void MatmulLimit::step() {
  const at::NoGradGuard no_grad;
  for (size_t i = 0; i < weights_.size(); ++i) {
    at::mm_out(outputs_[i], inputs_[i], weights_[i].t());
  }
  for (size_t i = weights_.size(); i-- > 0;) {
    at::mm_out(weight_grads_[i], output_grads_[i].t(), inputs_[i]);
    if (i > 0) {
      at::mm_out(input_grads_[i], output_grads_[i], weights_[i]);
    }
  }
}

void time_in_turns(std::vector<TimedVariant>& variants, const Device& device, int64_t steps, int64_t repeat,
                   double min_sample_seconds) {
  DeviceTimer timer(device);
  for (auto& variant : variants) {
    if (variant.timed) {
      continue;
    }
    for (int64_t i = 0; i < 10; ++i) {
      variant.step();
    }
    variant.iterations = steps > 0 ? steps : 1;
    while (steps == 0) {
      timer.start();
      for (int64_t i = 0; i < variant.iterations; ++i) {
        variant.step();
      }
      const double seconds = timer.stop();
      if (seconds >= min_sample_seconds || variant.iterations >= 100000) {
        break;
      }
      const double wanted = 1.2 * min_sample_seconds / std::max(seconds, 1e-9);
      variant.iterations *= std::clamp<int64_t>(static_cast<int64_t>(std::ceil(wanted)), 2, 10);
    }
  }
  for (auto& variant : variants) {
    if (variant.timed) {
      variant.iterations = std::max<int64_t>(variants.front().iterations, 3);
    }
  }
  for (int64_t r = 0; r < repeat; ++r) {
    for (auto& variant : variants) {
      double seconds = 0;
      if (variant.timed) {
        seconds = variant.timed(variant.iterations);
      } else {
        timer.start();
        for (int64_t i = 0; i < variant.iterations; ++i) {
          variant.step();
        }
        seconds = timer.stop();
      }
      variant.samples.push_back(seconds / static_cast<double>(variant.iterations));
    }
  }
}

PythonSide python_side(const SuiteOptions& options) {
  PythonSide side;
  side.python = options.python().empty() ? default_python() : options.python();
  side.script = options.python_script().empty() ? default_python_script() : options.python_script();
  if (side.python == "none") {
    side.skipped = "left out (--python none)";
  } else if (!std::filesystem::exists(side.script)) {
    side.skipped = "left out: no script at '" + side.script + "' (give --python-script)";
  }
  return side;
}

SyntheticOptions suite_data(int64_t samples) {
  return SyntheticOptions(samples, kFeatures, kClasses).seed(static_cast<uint64_t>(0));
}

TrainSuiteSetup train_suite_setup(const SuiteOptions& options, std::vector<int64_t> defaults,
                                  std::vector<int64_t> quick_defaults) {
  TrainSuiteSetup setup;
  setup.sizes = options.sizes();
  if (setup.sizes.empty()) {
    setup.sizes = options.quick() ? std::move(quick_defaults) : std::move(defaults);
  }
  for (const int64_t size : setup.sizes) {
    DKIT_CHECK(size > 0, "sizes must be positive, got ", size);
  }
  setup.repeat = options.repeat() > 0 ? options.repeat() : (options.quick() ? 3 : 5);
  setup.min_sample_seconds = options.quick() ? 0.05 : 0.25;
  setup.samples = std::max<int64_t>(4096, 4 * *std::max_element(setup.sizes.begin(), setup.sizes.end()));
  setup.data = make_synthetic(suite_data(setup.samples));
  setup.python = python_side(options);
  return setup;
}

std::vector<std::string> python_arguments(const Device& device, int64_t batch, int64_t samples, int64_t warmup,
                                          const std::string& loops) {
  const SyntheticOptions data = suite_data(samples);
  return {"--data",
          "blobs:" + std::to_string(data.samples()) + ":" + std::to_string(data.features()) + ":" +
              std::to_string(data.classes()) + ":" + format_number(data.noise()),
          "--hidden", "256,256", "--batch", std::to_string(batch), "--warmup", std::to_string(warmup),
          "--threads", std::to_string(at::get_num_threads()), "--device", device.str(), "--loops", loops};
}

int64_t python_warmup(int64_t batch) {
  return std::clamp<int64_t>(kPythonWarmupSamples / batch, kPythonWarmupFewest, kPythonWarmupSteps);
}

std::string python_warmup_words() {
  return std::to_string(kPythonWarmupSteps) + " warm-up steps (" + std::to_string(kPythonWarmupSamples) +
         " samples at larger batches, at least " + std::to_string(kPythonWarmupFewest) + " steps)";
}

PythonServer::PythonServer(const std::string& python, const std::string& script,
                           const std::vector<std::string>& arguments)
    : python_(python), script_(script) {
  int input[2];
  int output[2];
  if (pipe2(input, O_CLOEXEC) != 0) {
    fail(std::strerror(errno));
    return;
  }
  if (pipe2(output, O_CLOEXEC) != 0) {
    close(input[0]);
    close(input[1]);
    fail(std::strerror(errno));
    return;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, input[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, output[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, output[1], STDERR_FILENO);
  std::vector<std::string> args = {python, script};
  args.insert(args.end(), arguments.begin(), arguments.end());
  args.emplace_back("--serve");
  std::vector<char*> argv;
  for (auto& arg : args) {
    argv.push_back(arg.data());
  }
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(input[0]);
  close(output[1]);
  to_child_ = input[1];
  from_child_ = output[0];
  if (spawned != 0) {
    fail("cannot run " + python + ": " + std::strerror(spawned));
    return;
  }
  pid_ = pid;
  const std::string line = read_json_line();
  const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("ready") || json.at("ready") != true) {
    std::string ended;
    if (line.empty()) {
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
      ended = WIFEXITED(status) ? " (exit status " + std::to_string(WEXITSTATUS(status)) + ")"
                                : " (signal " + std::to_string(WTERMSIG(status)) + ")";
    }
    fail(python + " " + script + " --serve did not start" + ended + (last_other_.empty() ? "" : ": " + last_other_));
    return;
  }
  if (const auto* torch = json.contains("torch") ? json.at("torch").get_ptr<const std::string*>() : nullptr) {
    torch_version_ = *torch;
  }
}

PythonServer::~PythonServer() {
  if (to_child_ >= 0) {
    close(to_child_);
  }
  if (from_child_ >= 0) {
    close(from_child_);
  }
  if (pid_ > 0) {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

const std::string& PythonServer::error() const {
  return error_;
}

const std::string& PythonServer::torch_version() const {
  return torch_version_;
}

double PythonServer::time_steps(int64_t steps) {
  if (!error_.empty()) {
    return std::nan("");
  }
  const std::string request = std::to_string(steps) + "\n";
  if (write(to_child_, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    fail(python_ + " " + script_ + " --serve stopped reading: " + std::strerror(errno));
    return std::nan("");
  }
  const auto json = nlohmann::json::parse(read_json_line(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("seconds") || !json["seconds"].is_number()) {
    fail(python_ + " " + script_ + " --serve failed" + (last_other_.empty() ? "" : ": " + last_other_));
    return std::nan("");
  }
  return json["seconds"].get<double>();
}

PythonServers::PythonServers(const std::string& python, const std::string& script,
                             const std::vector<std::string>& arguments, int64_t processes) {
  TORCH_INTERNAL_ASSERT(processes >= 1, "PythonServers needs a process, got ", processes);
  do {
    servers_.push_back(std::make_unique<PythonServer>(python, script, arguments));
  } while (static_cast<int64_t>(servers_.size()) < processes && error().empty());
  answered_.assign(servers_.size(), false);
}

const std::string& PythonServers::error() const {
  for (const auto& server : servers_) {
    if (!server->error().empty()) {
      return server->error();
    }
  }
  return servers_.front()->error();
}

const std::string& PythonServers::torch_version() const {
  return servers_.front()->torch_version();
}

double PythonServers::time_steps(int64_t steps) {
  if (!error().empty()) {
    return std::nan("");
  }
  PythonServer& server = *servers_[next_];
  const double seconds = server.time_steps(steps);
  if (server.error().empty()) {
    answered_[next_] = true;
  }
  next_ = (next_ + 1) % servers_.size();
  return seconds;
}

int64_t PythonServers::processes_answered() const {
  return std::count(answered_.begin(), answered_.end(), true);
}

PythonRotation::PythonRotation(int64_t repeat) : processes_(std::clamp<int64_t>(repeat, 1, kPythonProcesses)) {}

int64_t PythonRotation::processes() const {
  return processes_;
}

void PythonRotation::add(const std::vector<std::shared_ptr<PythonServers>>& servers, std::string& skipped) {
  bool failed = false;
  for (const auto& server : servers) {
    if (!server->error().empty()) {
      skipped = "left out: " + server->error();
      failed = true;
    }
  }
  if (failed) {
    return;
  }
  for (const auto& server : servers) {
    fewest_ = std::min(fewest_.value_or(server->processes_answered()), server->processes_answered());
  }
}

void PythonRotation::summarize(SuiteResult& result) const {
  if (fewest_) {
    result.summary.emplace_back("python_processes", *fewest_);
  }
}

std::string PythonRotation::words() const {
  const std::string from = processes_ == 1 ? "one process" : std::to_string(processes_) + " processes in rotation";
  return "each row's from " + from + " (a process may keep a speed of its own for its whole life)";
}

std::string PythonServer::read_json_line() {
  for (;;) {
    const size_t end = buffer_.find('\n');
    if (end != std::string::npos) {
      std::string line = buffer_.substr(0, end);
      buffer_.erase(0, end + 1);
      if (line.rfind('{', 0) == 0) {
        return line;
      }
      if (!line.empty()) {
        last_other_ = line;
      }
      continue;
    }
    char chunk[4096];
    const ssize_t count = read(from_child_, chunk, sizeof(chunk));
    if (count > 0) {
      buffer_.append(chunk, static_cast<size_t>(count));
    } else if (count == 0 || errno != EINTR) {
      return "";
    }
  }
}

void PythonServer::fail(const std::string& why) {
  if (error_.empty()) {
    error_ = why;
  }
}

} // namespace dkit::bench::detail
