#include <dkit/bench/suites.h>

#include <dkit/bench/timing.h>
#include <dkit/config.h>
#include <dkit/core/error.h>
#include <dkit/data/dataset.h>
#include <dkit/data/loader.h>
#include <dkit/metrics/metrics.h>
#include <dkit/model/mlp.h>
#include <dkit/train/optim.h>
#include <dkit/train/step.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

namespace dkit::bench {
namespace {

constexpr int64_t kFeatures = 64;
constexpr int64_t kClasses = 10;
constexpr int64_t kLogEvery = 20;
// Adam's arithmetic per parameter element, counting a square root and a division as one operation each.
constexpr double kAdamFlopsPerParameter = 13.0;

const std::vector<int64_t>& hidden_sizes() {
  static const std::vector<int64_t> sizes = {256, 256};
  return sizes;
}

std::string rate_text(double samples_per_second) {
  return samples_per_second >= 1e6 ? format_fixed(samples_per_second / 1e6, 2) + "M"
                                   : format_fixed(samples_per_second / 1e3, 1) + "k";
}

// Sum over the layers of in * out: the multiply-adds of one sample's forward pass.
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

double flops_per_step(int64_t batch) {
  return 6.0 * static_cast<double>(batch) * static_cast<double>(weight_products()) +
         kAdamFlopsPerParameter * static_cast<double>(parameter_count());
}

// One of dkit's variants: its own loader, model, optimizer and metric buffer, stepping through the data epoch
// after epoch as dkit::Trainer does.
class Runner {
 public:
  Runner(const Dataset& data, const Device& device, int64_t batch, Placement placement, bool graph)
      : loader_(data, device, LoaderOptions(batch).placement(placement).drop_last(true).seed(1)),
        model_(MlpOptions(kFeatures, hidden_sizes(), kClasses)),
        metrics_({"loss_sum", "correct"}, device, kLogEvery) {
    place_module(model_, device);
    optimizer_ = std::make_unique<FusedAdam>(model_->parameters(), torch::optim::AdamOptions(1e-3));
#if DKIT_WITH_CUDA
    if (graph) {
      graph_ = std::make_unique<CudaGraphStep>(model_, *optimizer_, batch, kFeatures);
    }
#endif
    TORCH_INTERNAL_ASSERT(!graph || graph_ready(), "a CUDA graph step needs a CUDA build");
    step_.emplace(model_, *optimizer_);
    loader_.start_epoch(epoch_);
  }

  bool pinned() const {
    return loader_.pinned();
  }

  void step() {
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

 private:
  bool graph_ready() const {
#if DKIT_WITH_CUDA
    return graph_ != nullptr;
#else
    return false;
#endif
  }

  Loader loader_;
  int64_t epoch_ = 0;
  Mlp model_;
  std::unique_ptr<FusedAdam> optimizer_;
  std::optional<TrainStep> step_;
#if DKIT_WITH_CUDA
  std::unique_ptr<CudaGraphStep> graph_;
#endif
  MetricBuffer metrics_;
};

struct Variant {
  std::string name;
  std::string data;
  std::unique_ptr<Runner> runner;
  int64_t iterations = 1;
  std::vector<double> samples;
};

struct PythonLoop {
  std::string loop;
  int64_t steps = 0;
  Stats per_step;
  double samples_per_second = 0;
};

struct PythonRun {
  std::vector<PythonLoop> loops;
  std::string torch_version;
  std::string error;
};

// What a child process wrote to its stdout and stderr, and how it ended; `error` says why it did not start.
struct ChildOutput {
  std::string text;
  int status = 0;
  std::string error;
};

// Runs `args` (args[0] looked up in the PATH as by execvp) with its stdout and stderr into one pipe, and waits
// for it to end.
ChildOutput run_child(const std::vector<std::string>& args) {
  ChildOutput out;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    out.error = std::strerror(errno);
    return out;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> argv;
  for (const auto& arg : args) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (spawned != 0) {
    close(fds[0]);
    out.error = std::strerror(spawned);
    return out;
  }
  char buffer[4096];
  for (;;) {
    const ssize_t count = read(fds[0], buffer, sizeof(buffer));
    if (count > 0) {
      out.text.append(buffer, static_cast<size_t>(count));
    } else if (count == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  while (waitpid(pid, &out.status, 0) < 0 && errno == EINTR) {
  }
  return out;
}

// One loop's result from a line that mlp_train.py prints ({"loop": ..., "steps": ..., "runs_seconds": [...], ...}),
// or nothing when the line is not one.
std::optional<PythonLoop> parse_loop(const std::string& line, std::string& torch_version) {
  const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return std::nullopt;
  }
  try {
    PythonLoop loop;
    loop.loop = json.value("loop", "");
    loop.steps = json.value("steps", int64_t{0});
    auto runs = json.value("runs_seconds", std::vector<double>{});
    if (runs.empty() || loop.steps <= 0) {
      return std::nullopt;
    }
    for (double& seconds : runs) {
      seconds /= static_cast<double>(loop.steps);
    }
    loop.per_step = summarize(runs);
    loop.samples_per_second = json.value("samples_per_second", 0.0);
    torch_version = json.value("torch", "");
    return loop;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

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

PythonRun run_python(const std::string& python, const std::string& script, const Device& device, int64_t batch,
                     int64_t samples, int64_t steps, int64_t warmup, int64_t repeat) {
  PythonRun run;
  const ChildOutput child = run_child(
      {python, script, "--data",
       "random:" + std::to_string(samples) + ":" + std::to_string(kFeatures) + ":" + std::to_string(kClasses),
       "--hidden", "256,256", "--batch", std::to_string(batch), "--steps", std::to_string(steps), "--warmup",
       std::to_string(warmup), "--repeat", std::to_string(repeat), "--threads", std::to_string(at::get_num_threads()),
       "--device", device.str(), "--loops", "slicing,dataloader"});
  if (!child.error.empty()) {
    run.error = "cannot run " + python + ": " + child.error;
    return run;
  }
  std::istringstream lines(child.text);
  std::string last_other;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{", 0) != 0) {
      if (!line.empty()) {
        last_other = line;
      }
      continue;
    }
    if (auto loop = parse_loop(line, run.torch_version)) {
      run.loops.push_back(std::move(*loop));
    }
  }
  const int status = child.status;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || run.loops.empty()) {
    run.error = python + " " + script + " failed" +
                (WIFEXITED(status) ? " (exit status " + std::to_string(WEXITSTATUS(status)) + ")" : "") +
                (last_other.empty() ? "" : ": " + last_other);
    run.loops.clear();
  }
  return run;
}

// Times the variants in turns, sample by sample, so that a change in the machine's load hits them alike.
void time_variants(std::vector<Variant>& variants, const Device& device, int64_t steps, int64_t repeat,
                   double min_sample_seconds) {
  DeviceTimer timer(device);
  for (auto& variant : variants) {
    for (int64_t i = 0; i < 10; ++i) {
      variant.runner->step();
    }
    variant.iterations = steps > 0 ? steps : 1;
    while (steps == 0) {
      timer.start();
      for (int64_t i = 0; i < variant.iterations; ++i) {
        variant.runner->step();
      }
      const double seconds = timer.stop();
      if (seconds >= min_sample_seconds || variant.iterations >= 100000) {
        break;
      }
      const double wanted = 1.2 * min_sample_seconds / std::max(seconds, 1e-9);
      variant.iterations *= std::clamp<int64_t>(static_cast<int64_t>(std::ceil(wanted)), 2, 10);
    }
  }
  for (int64_t r = 0; r < repeat; ++r) {
    for (auto& variant : variants) {
      timer.start();
      for (int64_t i = 0; i < variant.iterations; ++i) {
        variant.runner->step();
      }
      variant.samples.push_back(timer.stop() / static_cast<double>(variant.iterations));
    }
  }
}

} // namespace

SuiteResult bench_train(const SuiteOptions& options) {
  const std::vector<Device> devices = suite_devices(options);
  std::vector<int64_t> sizes = options.sizes();
  if (sizes.empty()) {
    sizes = options.quick() ? std::vector<int64_t>{32, 256, 2048}
                            : std::vector<int64_t>{32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
  }
  for (const int64_t size : sizes) {
    DKIT_CHECK(size > 0, "sizes must be positive, got ", size);
  }
  const int64_t repeat = options.repeat() > 0 ? options.repeat() : (options.quick() ? 3 : 5);
  const double min_sample_seconds = options.quick() ? 0.05 : 0.25;
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  const int64_t samples = std::max<int64_t>(4096, 4 * largest);
  const Dataset data =
      make_synthetic(SyntheticOptions(samples, kFeatures, kClasses).seed(static_cast<uint64_t>(0)));

  const std::string python = options.python().empty() ? default_python() : options.python();
  const std::string script = options.python_script().empty() ? default_python_script() : options.python_script();
  std::string python_skipped;
  if (python == "none") {
    python_skipped = "left out (--python none)";
  } else if (!std::filesystem::exists(script)) {
    python_skipped = "left out: no script at '" + script + "' (give --python-script)";
  }
  std::string torch_python_version;

  ResultTable table("train", {{"device"}, {"batch", ColumnKind::kInteger}, {"variant"}, {"data"},
                              {"steps", ColumnKind::kInteger}, {"repeat", ColumnKind::kInteger},
                              {"median_ms", ColumnKind::kReal}, {"min_ms", ColumnKind::kReal},
                              {"max_ms", ColumnKind::kReal}, {"samples_per_s", ColumnKind::kReal},
                              {"gflops", ColumnKind::kReal}, {"vs_pytorch", ColumnKind::kReal, 3}});
  SuiteResult result("train", "", ResultTable("train", {}));
  const int threads = at::get_num_threads();
  bool pinned_fell_back = false;
  for (const auto& device : devices) {
    for (const int64_t batch : sizes) {
      report_progress(options, "train: " + device.str() + " batch " + std::to_string(batch));
      std::vector<Variant> variants;
      auto add = [&](std::string name, std::string what, Placement placement, bool graph) {
        torch::manual_seed(0);
        Variant variant;
        variant.name = std::move(name);
        variant.data = std::move(what);
        variant.runner = std::make_unique<Runner>(data, device, batch, placement, graph);
        variants.push_back(std::move(variant));
      };
      add("eager/device", "device-resident", Placement::kDevice, false);
      add("eager/pageable", "pageable", Placement::kPageable, false);
      add("eager/pinned", "pinned", Placement::kPinned, false);
      if (!variants.back().runner->pinned()) {
        variants.back().name = "eager/pinned-fallback";
        variants.back().data = "ordinary host buffers (no pinning without CUDA)";
        pinned_fell_back = true;
      }
#if DKIT_WITH_CUDA
      if (device.is_cuda()) {
        add("graph/device", "device-resident", Placement::kDevice, true);
      }
#endif
      time_variants(variants, device, options.steps(), repeat, min_sample_seconds);

      PythonRun py;
      if (python_skipped.empty()) {
        report_progress(options, "train: " + device.str() + " batch " + std::to_string(batch) + " PyTorch (" + python + ")");
        const int64_t steps = std::max<int64_t>(variants.front().iterations, 3);
        py = run_python(python, script, device, batch, samples, steps, /*warmup=*/std::max<int64_t>(steps, 10),
                        repeat);
        if (!py.error.empty()) {
          python_skipped = "left out: " + py.error;
        } else {
          torch_python_version = py.torch_version;
        }
      }
      double best_python = 0;
      std::string best_loop;
      for (const auto& loop : py.loops) {
        if (loop.samples_per_second > best_python) {
          best_python = loop.samples_per_second;
          best_loop = loop.loop;
        }
      }
      const std::string key = device.str() + ".b=" + std::to_string(batch);
      double best_dkit = 0;
      std::string best_variant;
      auto add_row = [&](const std::string& name, const std::string& what, int64_t steps, const Stats& s,
                         double rate) {
        Cell vs_pytorch;
        if (best_python > 0) {
          vs_pytorch = rate / best_python;
        }
        table.add_row({device.str(), batch, name, what, steps, s.count, s.median * 1e3, s.min * 1e3, s.max * 1e3,
                       rate, flops_per_step(batch) / s.median / 1e9, vs_pytorch});
        result.summary.emplace_back("samples_per_s." + key + "." + name, rate);
      };
      for (auto& variant : variants) {
        const Stats s = summarize(variant.samples);
        const double rate = static_cast<double>(batch) / s.median;
        add_row(variant.name, variant.data, variant.iterations, s, rate);
        if (variant.name.rfind("eager/", 0) == 0 && rate > best_dkit) {
          best_dkit = rate;
          best_variant = variant.name;
        }
      }
      for (const auto& loop : py.loops) {
        add_row("pytorch/" + loop.loop, loop.loop == "slicing" ? "device-resident" : "DataLoader(TensorDataset)",
                loop.steps, loop.per_step, loop.samples_per_second);
      }
      if (best_python > 0) {
        result.summary.emplace_back("vs_pytorch." + key, best_dkit / best_python);
        result.notes.push_back(device.str() + " batch " + std::to_string(batch) + ": dkit " + best_variant + " " +
                               rate_text(best_dkit) + " samples/s, " + format_fixed(best_dkit / best_python, 2) +
                               "x PyTorch's faster loop (" + best_loop + ", " + rate_text(best_python) +
                               " samples/s)");
      }
      if (device.is_cuda() && variants.size() > 3) {
        const double eager = static_cast<double>(batch) / summarize(variants[0].samples).median;
        const double graph = static_cast<double>(batch) / summarize(variants[3].samples).median;
        result.summary.emplace_back("graph_vs_eager." + key, graph / eager);
        result.notes.push_back(device.str() + " batch " + std::to_string(batch) + ": the CUDA graph step runs " +
                               format_fixed(graph / eager, 2) + "x the eager step's samples/s (device-resident data)");
      }
    }
  }
  result.summary.emplace_back("threads", static_cast<int64_t>(threads));
  result.summary.emplace_back("fused_adam_kernel", to_string(fused_adam_kernel()));
  result.summary.emplace_back("python", python_skipped.empty() ? python + " " + script : Cell{});
  if (!torch_python_version.empty()) {
    result.summary.emplace_back("python_torch_version", torch_python_version);
  }
  if (pinned_fell_back) {
    result.notes.push_back("eager/pinned-fallback: without CUDA there is no page-locked memory; the Loader's "
                           "pinned placement falls back to reused ordinary host buffers filled by its prefetch "
                           "thread, and that fallback is what the row measures");
  }
  if (python_skipped.empty()) {
    result.notes.push_back("pytorch/*: the same MLP, optimizer and loss in PyTorch " + torch_python_version + " (" +
                           python + " " + script + "), " + std::to_string(threads) +
                           " thread(s), after its own warm-up; its timed runs are whole loops of `steps` steps, "
                           "each with loss.item() as PyTorch's tutorials write it");
  } else {
    result.notes.push_back("PyTorch comparison " + python_skipped);
  }
  result.description =
      "MLP [64, 256, 256, 10] training steps (zero_grad, forward, summed cross-entropy, backward, Adam lr 1e-3, "
      "on-device metrics flushed every " + std::to_string(kLogEvery) + " steps: dkit::TrainStep as dkit train runs "
      "it) on " + std::to_string(samples) + " synthetic samples through dkit::Loader, " + std::to_string(threads) +
      " CPU thread(s); after 10 warm-up steps, samples of `steps` steps taken in turns, variant by variant, " +
      std::to_string(repeat) + " times; median/min/max ms per step; samples_per_s = batch / median; gflops = (6 * "
      "batch * " + std::to_string(weight_products()) + " + " + format_fixed(kAdamFlopsPerParameter, 0) + " * " +
      std::to_string(parameter_count()) + " for Adam) / median; vs_pytorch = samples_per_s / the faster PyTorch "
      "loop's";
  result.table = std::move(table);
  return result;
}

} // namespace dkit::bench
