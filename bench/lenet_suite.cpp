#include <dkit/bench/suites.h>

#include <dkit/bench/lenet_common.h>
#include <dkit/bench/timing.h>
#include <dkit/bench/train_common.h>
#include <dkit/core/format.h>

#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <memory>

namespace dkit::bench {
namespace {

using detail::LenetLoop;
using detail::PythonServers;
using detail::TimedVariant;

constexpr const char* kBare = "libtorch-loop";
constexpr const char* kTrainer = "dkit-trainer";
constexpr const char* kPython = "pytorch-eager";

} // namespace

SuiteResult bench_lenet(const SuiteOptions& options) {
  const detail::TrainSuiteSetup setup = detail::train_suite_setup(options, {64, 256}, {64});
  const int64_t asked = options.steps() > 0 ? options.steps() : (options.quick() ? 100 : 300);
  const int64_t steps = (asked + detail::kLenetFlush - 1) / detail::kLenetFlush * detail::kLenetFlush;
  const Dataset data = detail::lenet_data(detail::kFashionMnist);
  const bool fashion = data.size() == 60000;
  const std::string python = setup.python.python;
  const std::string script =
      (std::filesystem::path(setup.python.script).parent_path() / "lenet_train.py").lexically_normal().string();
  std::string python_skipped = setup.python.python == "none" ? setup.python.skipped : "";
  if (python_skipped.empty() && !std::filesystem::exists(script)) {
    python_skipped = "left out: no script at '" + script + "'";
  }
  const std::string folder =
      (std::filesystem::temp_directory_path() / ("dkit-bench-lenet-" + std::to_string(::getpid()))).string();
  std::string torch_python_version;
  detail::PythonRotation python_rotation(setup.repeat);

  ResultTable table("lenet", {{"batch", ColumnKind::kInteger}, {"variant"}, {"steps", ColumnKind::kInteger},
                              {"repeat", ColumnKind::kInteger}, {"median_ms", ColumnKind::kReal},
                              {"min_ms", ColumnKind::kReal}, {"max_ms", ColumnKind::kReal},
                              {"samples_per_s", ColumnKind::kReal}, {"vs_loop", ColumnKind::kReal, 3},
                              {"vs_pytorch", ColumnKind::kReal, 3}});
  SuiteResult result("lenet", "", ResultTable("lenet", {}));
  const int threads = at::get_num_threads();
  for (const int64_t batch : setup.sizes) {
    report_progress(options, "lenet: batch " + std::to_string(batch));
    torch::manual_seed(0);
    auto loop = std::make_shared<LenetLoop>(detail::lenet(), data, batch);
    auto net = std::make_shared<torch::nn::Sequential>(detail::lenet());
    std::vector<TimedVariant> variants;
    variants.emplace_back(kBare, "", [loop] { loop->step(); });
    variants.emplace_back(kTrainer, [net, &data, batch, folder](int64_t n) {
      return detail::trainer_seconds(*net, data, batch, n, folder);
    });
    std::shared_ptr<PythonServers> server;
    if (python_skipped.empty()) {
      report_progress(options, "lenet: batch " + std::to_string(batch) + " PyTorch (" + python + ")");
      server = std::make_shared<PythonServers>(
          python, script,
          std::vector<std::string>{"--data", fashion ? detail::kFashionMnist : "synthetic:10000", "--batch",
                                   std::to_string(batch), "--lr", format_number(detail::kLenetLr), "--threads",
                                   std::to_string(threads), "--warmup", std::to_string(detail::python_warmup(batch))},
          python_rotation.processes());
      if (server->error().empty()) {
        torch_python_version = server->torch_version();
        variants.emplace_back(kPython, [server](int64_t n) { return server->time_steps(n); });
      }
    }
    detail::time_in_turns(variants, cpu(), steps, setup.repeat, 0);
    if (server) {
      python_rotation.add({server}, python_skipped);
      if (!server->error().empty() && variants.size() > 2) {
        variants.pop_back();
      }
    }
    const Stats loop_stats = summarize(variants[0].samples);
    const bool with_python = variants.size() > 2;
    const Stats python_stats = with_python ? summarize(variants[2].samples) : Stats{};
    for (const auto& variant : variants) {
      const Stats s = summarize(variant.samples);
      Cell vs_pytorch;
      if (with_python) {
        vs_pytorch = python_stats.median / s.median;
      }
      table.add_row({batch, variant.name, variant.iterations, s.count, s.median * 1e3, s.min * 1e3, s.max * 1e3,
                     static_cast<double>(batch) / s.median, s.median / loop_stats.median, vs_pytorch});
    }
    const Stats trainer = summarize(variants[1].samples);
    const std::string key = "b=" + std::to_string(batch);
    result.summary.emplace_back("trainer_vs_loop." + key, trainer.median / loop_stats.median);
    std::string note = "batch " + std::to_string(batch) + ": the Trainer's step " +
                       format_fixed(trainer.median * 1e3, 3) + " ms, " +
                       format_fixed(100 * (trainer.median / loop_stats.median - 1), 1) +
                       "% over the bare LibTorch loop's " + format_fixed(loop_stats.median * 1e3, 3) + " ms";
    if (with_python) {
      result.summary.emplace_back("trainer_vs_pytorch." + key, python_stats.median / trainer.median);
      note += ", " + format_fixed(python_stats.median / trainer.median, 2) + "x PyTorch eager's samples/s (" +
              format_fixed(python_stats.median * 1e3, 3) + " ms)";
    }
    result.notes.push_back(note);
  }
  result.summary.emplace_back("threads", static_cast<int64_t>(threads));
  result.summary.emplace_back("data", fashion ? "fashion-mnist" : "synthetic");
  if (!torch_python_version.empty()) {
    result.summary.emplace_back("python_torch_version", torch_python_version);
  }
  if (python_skipped.empty()) {
    python_rotation.summarize(result);
    result.notes.push_back(std::string(kPython) + ": the same LeNet, SGD, loss and batches' recipe in PyTorch " +
                           torch_python_version + " eager (" + python + " " + script + " --serve), " +
                           std::to_string(threads) + " thread(s), the loss read every " +
                           std::to_string(detail::kLenetFlush) + " steps, its samples taken in turns with dkit's, " +
                           python_rotation.words());
  } else {
    result.notes.push_back("PyTorch comparison " + python_skipped);
  }
  result.description =
      "d2l's LeNet training steps on " +
      std::string(fashion ? "Fashion-MNIST's 60,000 training images" : "10,000 synthetic 28x28 images") +
      " (uint8, scaled on the device), SGD lr " + format_number(detail::kLenetLr) + ", " + std::to_string(threads) +
      " CPU thread(s): " + kBare + " = a hand-written LibTorch loop over the same batches, the loss summed on the "
      "device and read every " + std::to_string(detail::kLenetFlush) + " steps; " + kTrainer +
      " = dkit::Trainer with a ModuleTask (no metrics but the loss, no validation) over the same module and data, "
      "its steps' time (TrainSummary::train_seconds) of one fit per sample; samples of `steps` steps taken in "
      "turns, " + std::to_string(setup.repeat) + " times; vs_loop = median / the loop's median";
  result.table = std::move(table);
  return result;
}

} // namespace dkit::bench
