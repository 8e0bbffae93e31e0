#include <dkit/bench/suites.h>

#include <dkit/bench/timing.h>
#include <dkit/bench/train_common.h>
#include <dkit/core/format.h>
#include <dkit/data/dataset.h>
#include <dkit/train/optim.h>

#include <torch/torch.h>

#include <algorithm>
#include <memory>

namespace dkit::bench {
namespace {

using detail::BenchOptimizer;
using detail::kClasses;
using detail::kFeatures;
using detail::MatmulLimit;
using detail::PythonServers;
using detail::TimedVariant;
using detail::TrainRunner;

constexpr const char* kLimit = "matmul-limit";

} // namespace

SuiteResult bench_optimizers(const SuiteOptions& options) {
  const std::vector<Device> devices = suite_devices(options);
  const detail::TrainSuiteSetup setup = detail::train_suite_setup(options, {64, 256, 1024}, {64, 256});
  const std::vector<int64_t>& sizes = setup.sizes;
  const int64_t repeat = setup.repeat;
  const double min_sample_seconds = setup.min_sample_seconds;
  const int64_t samples = setup.samples;
  const Dataset& data = setup.data;
  const std::string& python = setup.python.python;
  const std::string& script = setup.python.script;
  std::string python_skipped = setup.python.skipped;
  std::string torch_python_version;
  detail::PythonRotation python_rotation(repeat);

  ResultTable table("optimizers", {{"device"}, {"batch", ColumnKind::kInteger}, {"optimizer"}, {"variant"},
                                   {"steps", ColumnKind::kInteger}, {"repeat", ColumnKind::kInteger},
                                   {"median_ms", ColumnKind::kReal}, {"min_ms", ColumnKind::kReal},
                                   {"max_ms", ColumnKind::kReal}, {"samples_per_s", ColumnKind::kReal},
                                   {"vs_limit", ColumnKind::kReal, 3}, {"vs_pytorch", ColumnKind::kReal, 3}});
  SuiteResult result("optimizers", "", ResultTable("optimizers", {}));
  const int threads = at::get_num_threads();
  for (const auto& device : devices) {
    for (const int64_t batch : sizes) {
      for (const BenchOptimizer& optimizer : detail::bench_optimizers()) {
        const std::string where = device.str() + " batch " + std::to_string(batch) + " " + optimizer.name;
        report_progress(options, "optimizers: " + where);
        std::vector<TimedVariant> variants;
        for (const bool fused : {true, false}) {
          torch::manual_seed(0);
          auto runner = std::make_shared<TrainRunner>(data, device, batch, Placement::kDevice, optimizer, fused,
                                                      /*graph=*/false);
          variants.emplace_back(fused ? "dkit" : "dkit/libtorch-optimizer", "", [runner] { runner->step(); });
        }
        auto limit = std::make_shared<MatmulLimit>(device, batch);
        variants.emplace_back(kLimit, "", [limit] { limit->step(); });
        std::shared_ptr<PythonServers> server;
        if (python_skipped.empty()) {
          report_progress(options, "optimizers: " + where + " PyTorch (" + python + ")");
          std::vector<std::string> arguments =
              detail::python_arguments(device, batch, samples, detail::python_warmup(batch), "slicing");
          const std::vector<std::string> optimizer_arguments = optimizer.python_arguments();
          arguments.insert(arguments.end(), optimizer_arguments.begin(), optimizer_arguments.end());
          server = std::make_shared<PythonServers>(python, script, arguments, python_rotation.processes());
          if (server->error().empty()) {
            torch_python_version = server->torch_version();
            variants.emplace_back("pytorch/slicing", [server](int64_t steps) { return server->time_steps(steps); });
          }
        }
        detail::time_in_turns(variants, device, options.steps(), repeat, min_sample_seconds);
        if (server) {
          python_rotation.add({server}, python_skipped);
          if (!server->error().empty() && variants.size() > 3) {
            variants.pop_back();
          }
        }

        const Stats limit_stats = summarize(variants[2].samples);
        const double limit_seconds = limit_stats.median;
        const bool with_python = variants.size() > 3;
        const Stats python_stats = with_python ? summarize(variants[3].samples) : Stats{};
        const double python_rate = with_python ? static_cast<double>(batch) / python_stats.median : 0.0;
        for (const auto& variant : variants) {
          const Stats s = summarize(variant.samples);
          const double rate = static_cast<double>(batch) / s.median;
          Cell vs_pytorch;
          if (python_rate > 0) {
            vs_pytorch = rate / python_rate;
          }
          table.add_row({device.str(), batch, optimizer.name, variant.name, variant.iterations, s.count,
                         s.median * 1e3, s.min * 1e3, s.max * 1e3, rate, s.median / limit_seconds, vs_pytorch});
        }
        const std::string key = device.str() + ".b=" + std::to_string(batch) + "." + optimizer.name;
        const Stats step = summarize(variants.front().samples);
        const double step_seconds = step.median;
        result.summary.emplace_back("step_vs_limit." + key, step_seconds / limit_seconds);
        const double step_vs_limit_fastest = step.min / limit_stats.min;
        result.summary.emplace_back("step_vs_limit_fastest." + key, step_vs_limit_fastest);
        std::string note = where + ": dkit's step " + format_fixed(step_seconds * 1e3, 3) + " ms, " +
                           format_fixed(step_seconds / limit_seconds, 2) + "x its matrix products alone (" +
                           format_fixed(limit_seconds * 1e3, 3) + " ms; fastest samples " +
                           format_fixed(step_vs_limit_fastest, 2) + "x)";
        if (with_python) {
          const double vs = static_cast<double>(batch) / step_seconds / python_rate;
          const double fastest = python_stats.min / step.min;
          result.summary.emplace_back("vs_pytorch." + key, vs);
          result.summary.emplace_back("vs_pytorch_fastest." + key, fastest);
          note += ", " + format_fixed(vs, 2) + "x PyTorch's samples/s (fastest samples " + format_fixed(fastest, 2) +
                  "x)";
        }
        result.notes.push_back(note);
      }
    }
  }
  result.summary.emplace_back("threads", static_cast<int64_t>(threads));
  result.summary.emplace_back("fused_sgd_kernel", to_string(fused_sgd_kernel()));
  result.summary.emplace_back("fused_adam_kernel", to_string(fused_adam_kernel()));
  result.summary.emplace_back("python", python_skipped.empty() ? python + " " + script : Cell{});
  if (!torch_python_version.empty()) {
    result.summary.emplace_back("python_torch_version", torch_python_version);
  }
  if (python_skipped.empty()) {
    python_rotation.summarize(result);
  }
  std::string described;
  for (const BenchOptimizer& optimizer : detail::bench_optimizers()) {
    described += (described.empty() ? "" : ", ") + optimizer.name + " = " + optimizer.describe();
  }
  result.notes.push_back("optimizers: " + described);
  if (python_skipped.empty()) {
    result.notes.push_back("pytorch/slicing: the same MLP, optimizer and loss in PyTorch " + torch_python_version +
                           " eager (" + python + " " + script + " --serve), " + std::to_string(threads) +
                           " thread(s): its faster loop (tensor slicing of device-resident data, loss.item() each "
                           "step), after " + detail::python_warmup_words() + ", its samples taken in "
                           "turns with dkit's, " + python_rotation.words());
  } else {
    result.notes.push_back("PyTorch comparison " + python_skipped);
  }
  result.description =
      "MLP [64, 256, 256, 10] training steps with each optimizer at batch sizes " +
      [&] {
        std::string text;
        for (const int64_t size : sizes) {
          text += (text.empty() ? "" : ", ") + std::to_string(size);
        }
        return text;
      }() +
      ", " + std::to_string(threads) + " CPU thread(s): dkit = dkit::TrainStep with dkit's fused optimizer "
      "(FusedSGD, FusedAdam, FusedAdamW) on device-resident batches from dkit::Loader, metrics on the device "
      "flushed every " + std::to_string(detail::kLogEvery) + " steps, as dkit train runs it; "
      "dkit/libtorch-optimizer = the same with LibTorch's own optimizer; " + kLimit + " = the step's matrix "
      "products alone, one after another, at the same shapes and layouts (per layer the forward product, the "
      "weight gradient and, but for the first layer, the input gradient); samples of `steps` steps taken in "
      "turns, " + std::to_string(repeat) + " times; vs_limit = median / the limit's median; vs_pytorch = "
      "samples_per_s / PyTorch's";
  result.table = std::move(table);
  return result;
}

} // namespace dkit::bench
