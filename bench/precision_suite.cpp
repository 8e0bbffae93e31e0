#include <dkit/bench/suites.h>

#include <dkit/bench/timing.h>
#include <dkit/bench/train_common.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/data/dataset.h>
#include <dkit/train/amp.h>

#include <torch/torch.h>

#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

namespace dkit::bench {
namespace {

using detail::MatmulLimit;
using detail::PythonServers;
using detail::TimedVariant;
using detail::TrainRunner;

constexpr const char* kPrecisionOptimizer = "adam";

// The flags of /proc/cpuinfo that bfloat16 and float16 kernels may use, and whether this CPU lists each.
std::string low_precision_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string word; words >> word;) {
        flags.insert(word);
      }
      break;
    }
  }
  if (flags.empty()) {
    return "unknown (no flags line in /proc/cpuinfo)";
  }
  std::string text;
  for (const char* flag : {"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16", "f16c"}) {
    text += (text.empty() ? "" : ", ") + std::string(flag) + (flags.count(flag) != 0 ? " yes" : " no");
  }
  return text;
}

} // namespace

SuiteResult bench_precision(const SuiteOptions& options) {
  const std::vector<Device> devices = suite_devices(options);
  const detail::TrainSuiteSetup setup = detail::train_suite_setup(options, {64, 256, 1024}, {64, 256});
  const detail::BenchOptimizer& optimizer = detail::find_bench_optimizer(kPrecisionOptimizer);
  std::string python_skipped = setup.python.skipped;
  std::string torch_python_version;
  detail::PythonRotation python_rotation(setup.repeat);

  ResultTable table("precision", {{"device"}, {"batch", ColumnKind::kInteger}, {"precision"}, {"variant"},
                                  {"steps", ColumnKind::kInteger}, {"repeat", ColumnKind::kInteger},
                                  {"median_ms", ColumnKind::kReal}, {"min_ms", ColumnKind::kReal},
                                  {"max_ms", ColumnKind::kReal}, {"samples_per_s", ColumnKind::kReal},
                                  {"vs_fp32", ColumnKind::kReal, 3}, {"vs_pytorch", ColumnKind::kReal, 3}});
  SuiteResult result("precision", "", ResultTable("precision", {}));
  std::map<std::string, std::string> unsupported;
  for (const auto& device : devices) {
    std::vector<Precision> precisions;
    for (const auto& entry : kPrecisionNames) {
      if (entry.value != Precision::kFloat32) {
        try {
          check_autocast(device.type(), autocast_dtype_of(entry.value));
        } catch (const Error& e) {
          unsupported[device.str() + " " + std::string(entry.name)] = e.what();
          continue;
        }
      }
      precisions.push_back(entry.value);
    }
    for (const int64_t batch : setup.sizes) {
      const std::string where = device.str() + " batch " + std::to_string(batch);
      report_progress(options, "precision: " + where);
      struct Row {
        Precision precision;
        std::string variant;
      };
      std::vector<Row> rows;
      std::vector<TimedVariant> variants;
      std::vector<std::shared_ptr<PythonServers>> servers;
      for (const Precision precision : precisions) {
        torch::manual_seed(0);
        auto runner = std::make_shared<TrainRunner>(setup.data, device, batch, Placement::kDevice, optimizer,
                                                    /*fused=*/true, /*graph=*/false, precision);
        variants.emplace_back("dkit", "", [runner] { runner->step(); });
        rows.push_back({precision, "dkit"});
        auto limit = std::make_shared<MatmulLimit>(device, batch, autocast_dtype_of(precision));
        variants.emplace_back("matmul", "", [limit] { limit->step(); });
        rows.push_back({precision, "matmul"});
        if (python_skipped.empty()) {
          report_progress(options, "precision: " + where + " " + to_string(precision) + " PyTorch (" +
                                       setup.python.python + ")");
          std::vector<std::string> arguments = detail::python_arguments(device, batch, setup.samples,
                                                                        detail::python_warmup(batch), "slicing");
          const std::vector<std::string> optimizer_arguments = optimizer.python_arguments();
          arguments.insert(arguments.end(), optimizer_arguments.begin(), optimizer_arguments.end());
          arguments.insert(arguments.end(), {"--precision", to_string(precision)});
          auto server = std::make_shared<PythonServers>(setup.python.python, setup.python.script, arguments,
                                                        python_rotation.processes());
          if (server->error().empty()) {
            torch_python_version = server->torch_version();
            servers.push_back(server);
            variants.emplace_back("pytorch", [server](int64_t steps) { return server->time_steps(steps); });
            rows.push_back({precision, "pytorch"});
          } else if (precision == Precision::kFloat32) {
            python_skipped = "left out: " + server->error();
          } else {
            unsupported["PyTorch " + device.str() + " " + to_string(precision)] = server->error();
          }
        }
      }
      detail::time_in_turns(variants, device, options.steps(), setup.repeat, setup.min_sample_seconds);
      python_rotation.add(servers, python_skipped);

      std::vector<Stats> stats;
      std::map<std::pair<Precision, std::string>, double> seconds;
      for (size_t i = 0; i < variants.size(); ++i) {
        stats.push_back(summarize(variants[i].samples));
        seconds[{rows[i].precision, rows[i].variant}] = stats.back().median;
      }
      const auto fp32_seconds = [&](const std::string& variant) {
        return seconds.at({Precision::kFloat32, variant});
      };
      const std::string key = device.str() + ".b=" + std::to_string(batch);
      for (size_t i = 0; i < variants.size(); ++i) {
        const Row& row = rows[i];
        if (row.variant == "pytorch" && !python_skipped.empty()) {
          continue;
        }
        const Stats& s = stats[i];
        const double vs_fp32 = fp32_seconds(row.variant) / s.median;
        Cell vs_pytorch;
        const auto python = seconds.find({row.precision, "pytorch"});
        if (row.variant == "dkit" && python_skipped.empty() && python != seconds.end()) {
          vs_pytorch = python->second / s.median;
        }
        table.add_row({device.str(), batch, to_string(row.precision), row.variant, variants[i].iterations, s.count,
                       s.median * 1e3, s.min * 1e3, s.max * 1e3, static_cast<double>(batch) / s.median, vs_fp32,
                       vs_pytorch});
        if (row.precision != Precision::kFloat32) {
          result.summary.emplace_back(to_string(row.precision) + "_vs_fp32." + key + "." + row.variant, vs_fp32);
        }
      }
      for (const Precision precision : precisions) {
        if (precision == Precision::kFloat32) {
          continue;
        }
        const std::string name = to_string(precision);
        std::string note = where + ": " + name + " trains at " +
                           format_fixed(fp32_seconds("dkit") / seconds.at({precision, "dkit"}), 2) +
                           "x fp32's samples/s in dkit";
        const auto python = seconds.find({precision, "pytorch"});
        if (python_skipped.empty() && python != seconds.end()) {
          note += ", " + format_fixed(fp32_seconds("pytorch") / python->second, 2) + "x in PyTorch";
        }
        note += "; its matrix products alone run at " +
                format_fixed(fp32_seconds("matmul") / seconds.at({precision, "matmul"}), 2) + "x fp32's";
        result.notes.push_back(note);
      }
    }
  }
  const int threads = at::get_num_threads();
  result.summary.emplace_back("threads", static_cast<int64_t>(threads));
  result.summary.emplace_back("python", python_skipped.empty() ? setup.python.python + " " + setup.python.script
                                                               : Cell{});
  if (!torch_python_version.empty()) {
    result.summary.emplace_back("python_torch_version", torch_python_version);
  }
  if (python_skipped.empty()) {
    python_rotation.summarize(result);
  }
  result.notes.push_back("CPU flags for bfloat16 and float16 (/proc/cpuinfo): " + low_precision_flags() +
                         "; LibTorch built with oneDNN: " + (at::hasMKLDNN() ? "yes" : "no"));
  for (const auto& [what, why] : unsupported) {
    result.notes.push_back(what + ": left out: " + why);
  }
  if (python_skipped.empty()) {
    result.notes.push_back("pytorch: the same MLP, Adam and loss in PyTorch " + torch_python_version + " eager (" +
                           setup.python.python + " " + setup.python.script + " --serve --precision P), " +
                           std::to_string(threads) + " thread(s), its forward pass and loss under torch.autocast "
                           "for bf16 and fp16 (fp16 with a GradScaler), tensor slicing of device-resident data, "
                           "loss.item() each step, after " + detail::python_warmup_words() +
                           ", its samples taken in turns with dkit's, " + python_rotation.words());
  } else {
    result.notes.push_back("PyTorch comparison " + python_skipped);
  }
  result.description =
      "MLP [64, 256, 256, 10] training steps with " + optimizer.describe() + " in each precision this LibTorch can "
      "autocast to on the device, " + std::to_string(threads) + " CPU thread(s): dkit = dkit::TrainStep as dkit train "
      "runs it with train.precision (fp32, and bf16 on the CPU: the written-out step, in bf16 bitwise autocast's; "
      "otherwise autograd with the forward pass under dkit::AutocastGuard, fp16 with a dkit::GradScaler), "
      "FusedAdam, device-resident batches; matmul = the "
      "step's matrix products alone in that precision's dtype, at the same shapes; pytorch = PyTorch eager in the "
      "same precision; samples of `steps` steps taken in turns, " + std::to_string(setup.repeat) +
      " times; vs_fp32 = the same variant's fp32 median / this median; vs_pytorch = PyTorch's median in the same "
      "precision / dkit's";
  result.table = std::move(table);
  return result;
}

} // namespace dkit::bench
