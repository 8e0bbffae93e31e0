#include <dkit/bench/suites.h>

#include <dkit/bench/timing.h>
#include <dkit/bench/train_common.h>
#include <dkit/config.h>
#include <dkit/core/format.h>
#include <dkit/data/dataset.h>
#include <dkit/train/optim.h>

#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <utility>

namespace dkit::bench {
namespace {

using detail::kClasses;
using detail::kFeatures;
using detail::kLogEvery;
using detail::parameter_count;
using detail::PythonServers;
using detail::TimedVariant;
using detail::TrainRunner;
using detail::weight_products;

// PyTorch's two loops (mlp_train.py --loops) and the data each reads.
constexpr std::pair<const char*, const char*> kPythonLoops[] = {{"slicing", "device-resident"},
                                                                 {"dataloader", "DataLoader(TensorDataset)"}};

// Adam's arithmetic per parameter element, counting a square root and a division as one operation each.
constexpr double kAdamFlopsPerParameter = 13.0;

double flops_per_step(int64_t batch) {
  return 6.0 * static_cast<double>(batch) * static_cast<double>(weight_products()) +
         kAdamFlopsPerParameter * static_cast<double>(parameter_count());
}

} // namespace

SuiteResult bench_train(const SuiteOptions& options) {
  const std::vector<Device> devices = suite_devices(options);
  const detail::TrainSuiteSetup setup = detail::train_suite_setup(
      options, {32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}, {32, 256, 2048});
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
      std::vector<TimedVariant> variants;
      std::vector<std::shared_ptr<TrainRunner>> runners;
      auto add = [&](std::string name, std::string what, Placement placement, bool graph) {
        torch::manual_seed(0);
        runners.push_back(std::make_shared<TrainRunner>(data, device, batch, placement,
                                                        detail::find_bench_optimizer("adam"), /*fused=*/true, graph));
        variants.emplace_back(std::move(name), std::move(what), [runner = runners.back()] { runner->step(); });
      };
      add("eager/device", "device-resident", Placement::kDevice, false);
      add("eager/pageable", "pageable", Placement::kPageable, false);
      add("eager/pinned", "pinned", Placement::kPinned, false);
      if (!runners.back()->pinned()) {
        variants.back().name = "eager/pinned-fallback";
        variants.back().data = "ordinary host buffers (no pinning without CUDA)";
        pinned_fell_back = true;
      }
#if DKIT_WITH_CUDA
      if (device.is_cuda()) {
        add("graph/device", "device-resident", Placement::kDevice, true);
      }
#endif
      const size_t dkit_variants = variants.size();
      std::vector<std::shared_ptr<PythonServers>> servers;
      if (python_skipped.empty()) {
        report_progress(options,
                        "train: " + device.str() + " batch " + std::to_string(batch) + " PyTorch (" + python + ")");
        for (const auto& loop : kPythonLoops) {
          auto server = std::make_shared<PythonServers>(
              python, script,
              detail::python_arguments(device, batch, samples, detail::python_warmup(batch), loop.first),
              python_rotation.processes());
          if (!server->error().empty()) {
            python_skipped = "left out: " + server->error();
            servers.clear();
            break;
          }
          servers.push_back(server);
        }
        for (size_t i = 0; i < servers.size(); ++i) {
          torch_python_version = servers[i]->torch_version();
          variants.emplace_back(std::string("pytorch/") + kPythonLoops[i].first,
                                [server = servers[i]](int64_t steps) { return server->time_steps(steps); });
          variants.back().data = kPythonLoops[i].second;
        }
      }
      detail::time_in_turns(variants, device, options.steps(), repeat, min_sample_seconds);
      python_rotation.add(servers, python_skipped);
      if (!python_skipped.empty()) {
        servers.clear();
        variants.erase(variants.begin() + static_cast<std::ptrdiff_t>(dkit_variants), variants.end());
      }
      double best_python = 0;
      std::string best_loop;
      for (size_t i = 0; i < servers.size(); ++i) {
        const double rate = static_cast<double>(batch) / summarize(variants[dkit_variants + i].samples).median;
        if (rate > best_python) {
          best_python = rate;
          best_loop = kPythonLoops[i].first;
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
      if (best_python > 0) {
        result.summary.emplace_back("vs_pytorch." + key, best_dkit / best_python);
        result.notes.push_back(device.str() + " batch " + std::to_string(batch) + ": dkit " + best_variant + " " +
                               format_rate(best_dkit) + " samples/s, " + format_fixed(best_dkit / best_python, 2) +
                               "x PyTorch's faster loop (" + best_loop + ", " + format_rate(best_python) +
                               " samples/s)");
      }
      if (device.is_cuda() && dkit_variants > 3) {
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
    python_rotation.summarize(result);
    result.notes.push_back("pytorch/*: the same MLP, optimizer and loss in PyTorch " + torch_python_version + " (" +
                           python + " " + script + " --serve --loops L), " + std::to_string(threads) +
                           " thread(s), each loop in processes of its own, each step with loss.item() as PyTorch's "
                           "tutorials write it, after " + detail::python_warmup_words() +
                           ", its samples taken in turns with dkit's, " + python_rotation.words());
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
