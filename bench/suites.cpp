#include <dkit/bench/suites.h>

#include <dkit/bench/timing.h>
#include <dkit/config.h>
#include <dkit/core/error.h>
#include <dkit/device/report.h>
#include <dkit/metrics/metrics.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

namespace dkit::bench {
namespace {

std::vector<int64_t> checked_sizes(const SuiteOptions& options, std::vector<int64_t> defaults) {
  std::vector<int64_t> sizes = options.sizes().empty() ? std::move(defaults) : options.sizes();
  for (const int64_t size : sizes) {
    DKIT_CHECK(size > 0, "sizes must be positive, got ", size);
  }
  return sizes;
}

std::string dtype_name(c10::ScalarType dtype) {
  return dtype == torch::kBFloat16 ? "bfloat16" : "float32";
}

std::string case_label(const Device& device, c10::ScalarType dtype) {
  return device.str() + " " + dtype_name(dtype);
}

std::string case_key(const Device& device, c10::ScalarType dtype) {
  return device.str() + "." + dtype_name(dtype);
}

struct MatmulCase {
  Device device;
  c10::ScalarType dtype;
  int64_t n;
  Measurement measurement;
  double gflops;
};

std::string crossover_note(const std::vector<MatmulCase>& cases, const Device& device, c10::ScalarType dtype,
                           std::vector<std::pair<std::string, Cell>>& summary) {
  std::map<int64_t, double> cpu_times;
  std::map<int64_t, double> gpu_times;
  for (const auto& c : cases) {
    if (c.device.is_cpu() && c.dtype == torch::kFloat32) {
      cpu_times[c.n] = c.measurement.seconds.median;
    } else if (c.device == device && c.dtype == dtype) {
      gpu_times[c.n] = c.measurement.seconds.median;
    }
  }
  const std::string label = case_label(device, dtype);
  std::optional<int64_t> from;
  bool compared = false;
  for (auto it = gpu_times.rbegin(); it != gpu_times.rend(); ++it) {
    const auto cpu_time = cpu_times.find(it->first);
    if (cpu_time == cpu_times.end()) {
      continue;
    }
    compared = true;
    if (it->second >= cpu_time->second) {
      break;
    }
    from = it->first;
  }
  if (!compared) {
    return label + ": no size measured on both it and the CPU, so no crossover";
  }
  const std::string key = "gpu_overtakes_cpu_from_n." + case_key(device, dtype);
  if (!from) {
    summary.emplace_back(key, Cell{});
    return label + " is not faster than the CPU (float32) at the largest size measured";
  }
  summary.emplace_back(key, *from);
  const double speedup = cpu_times[*from] / gpu_times[*from];
  return label + " overtakes the CPU (float32) from n=" + std::to_string(*from) + " on (" + format_fixed(speedup, 1) +
         "x there), and stays ahead at every larger size measured";
}

struct LoggingRun {
  at::Tensor norms;
  int64_t host_reads = 0;
};

LoggingRun log_with_item(const at::Tensor& a, const at::Tensor& b, at::Tensor& c, int64_t steps) {
  const int64_t syncs_before = host_sync_count();
  LoggingRun run;
  run.norms = torch::empty({steps}, torch::kFloat32);
  float* out = run.norms.data_ptr<float>();
  for (int64_t i = 0; i < steps; ++i) {
    at::mm_out(c, a, b);
    out[i] = c.norm().item<float>();
    note_host_sync();
  }
  run.host_reads = host_sync_count() - syncs_before;
  return run;
}

LoggingRun log_on_device(const at::Tensor& a, const at::Tensor& b, at::Tensor& c, int64_t steps) {
  const int64_t syncs_before = host_sync_count();
  at::Tensor log = torch::empty({steps}, torch::TensorOptions().dtype(torch::kFloat32).device(a.device()));
  for (int64_t i = 0; i < steps; ++i) {
    at::mm_out(c, a, b);
    log.select(0, i).copy_(c.norm());
  }
  LoggingRun run;
  run.norms = log.to(torch::kCPU);
  note_host_sync();
  run.host_reads = host_sync_count() - syncs_before;
  return run;
}

LoggingRun log_with_metric_buffer(const at::Tensor& a, const at::Tensor& b, at::Tensor& c, int64_t steps,
                                  int64_t capacity) {
  const int64_t syncs_before = host_sync_count();
  MetricBuffer buffer({"frobenius_norm"}, a.device(), capacity);
  std::vector<at::Tensor> flushed;
  for (int64_t i = 0; i < steps; ++i) {
    at::mm_out(c, a, b);
    buffer.add({c.norm()});
    if (buffer.full()) {
      flushed.push_back(buffer.flush().values);
    }
  }
  if (!buffer.empty()) {
    flushed.push_back(buffer.flush().values);
  }
  LoggingRun run;
  run.norms = torch::cat(flushed).reshape({steps});
  run.host_reads = host_sync_count() - syncs_before;
  return run;
}

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

std::vector<Suite>& registry() {
  static std::vector<Suite> suites = {
      {"matmul", "square matmuls 50 ... 8192 on the CPU and each GPU: GFLOP/s, and where the GPU overtakes the CPU",
       nullptr, bench_matmul},
      {"logging", "1,000 matmuls logging a norm by .item() every step vs on the device vs a metric buffer",
       nullptr, bench_logging},
      {"transfer", "host<->device copies 4 KiB ... 1 GiB: pageable vs pinned vs pinned + non_blocking overlapped",
       transfer_unsupported, bench_transfer},
      {"multi-gpu", "two matmuls on two GPUs at once vs one after the other on one GPU: scaling efficiency",
       multi_gpu_unsupported, bench_multi_gpu},
      {"train", "MLP training steps at batch 32 ... 8192: eager vs CUDA graph, data placements, PyTorch beside",
       nullptr, bench_train},
      {"optimizers", "MLP steps per optimizer at batch 64, 256, 1024: fused vs LibTorch's, the matmul limit, PyTorch",
       nullptr, bench_optimizers},
      {"precision", "MLP steps in fp32, bf16, fp16 at batch 64, 256, 1024: dkit, its products alone, PyTorch autocast",
       nullptr, bench_precision},
      {"lenet", "d2l's LeNet on Fashion-MNIST at batch 64, 256: dkit's Trainer vs a bare LibTorch loop vs PyTorch",
       nullptr, bench_lenet},
  };
  return suites;
}

} // namespace

const std::vector<Suite>& suites() {
  return registry();
}

void register_suite(Suite suite) {
  DKIT_CHECK(!suite.name.empty() && suite.name != "all", "a benchmark suite cannot be called '", suite.name, "'");
  DKIT_CHECK(try_find_suite(suite.name) == nullptr, "a benchmark suite called '", suite.name,
             "' is already registered");
  DKIT_CHECK(static_cast<bool>(suite.run), "benchmark suite '", suite.name, "' has nothing to run");
  registry().push_back(std::move(suite));
}

const Suite* try_find_suite(std::string_view name) {
  for (const auto& suite : registry()) {
    if (suite.name == name) {
      return &suite;
    }
  }
  return nullptr;
}

const Suite& find_suite(std::string_view name) {
  if (const Suite* suite = try_find_suite(name)) {
    return *suite;
  }
  std::string names;
  for (const auto& suite : registry()) {
    names += suite.name + ", ";
  }
  throw Error(dkit::detail::concat("unknown benchmark suite '", name, "'; the suites are ", names, "all"));
}

std::vector<SuiteResult> run_suites(std::string_view name, const SuiteOptions& options) {
  std::vector<const Suite*> chosen;
  if (name == "all") {
    for (const auto& suite : registry()) {
      chosen.push_back(&suite);
    }
  } else {
    chosen.push_back(&find_suite(name));
  }
  std::vector<SuiteResult> results;
  for (const Suite* suite : chosen) {
    const std::string why = suite->unsupported ? suite->unsupported(options) : "";
    if (!why.empty()) {
      report_progress(options, suite->name + ": skipped: " + why);
      results.push_back(SuiteResult::skipped(suite->name, why));
      continue;
    }
    results.push_back(suite->run(options));
  }
  return results;
}

SuiteResult bench_matmul(const SuiteOptions& options) {
  const std::vector<Device> devices = suite_devices(options);
  const std::vector<int64_t> sizes = checked_sizes(
      options, options.quick() ? std::vector<int64_t>{50, 100, 500, 1000}
                               : std::vector<int64_t>{50, 100, 500, 1000, 2000, 4000, 8192});
  MeasureOptions measure_options;
  measure_options.warmup(1).repeat(options.repeat() > 0 ? options.repeat() : 5);
  if (options.repeat() == 0) {
    measure_options.budget_seconds(options.quick() ? 2.0 : 10.0).min_repeat(3);
  }
  std::vector<MatmulCase> cases;
  for (const auto& device : devices) {
    std::vector<c10::ScalarType> dtypes = {torch::kFloat32};
    if (device.is_cuda()) {
      dtypes.push_back(torch::kBFloat16);
    }
    for (const auto dtype : dtypes) {
      for (const int64_t n : sizes) {
        report_progress(options, "matmul: " + device.str() + " " + dtype_name(dtype) + " n=" + std::to_string(n));
        const auto tensor_options = torch::TensorOptions().dtype(dtype).device(device);
        const at::Tensor a = torch::randn({n, n}, tensor_options);
        const at::Tensor b = torch::randn({n, n}, tensor_options);
        at::Tensor c = torch::empty({n, n}, tensor_options);
        const Measurement measurement = measure(device, measure_options, [&] { at::mm_out(c, a, b); });
        const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
        cases.push_back({device, dtype, n, measurement, flops / measurement.seconds.median / 1e9});
      }
    }
  }

  std::map<std::string, double> best;
  std::map<int64_t, double> cpu_median;
  for (const auto& c : cases) {
    double& top = best[case_key(c.device, c.dtype)];
    top = std::max(top, c.gflops);
    if (c.device.is_cpu() && c.dtype == torch::kFloat32) {
      cpu_median[c.n] = c.measurement.seconds.median;
    }
  }
  ResultTable table("matmul", {{"device"}, {"dtype"}, {"n", ColumnKind::kInteger},
                               {"repeat", ColumnKind::kInteger}, {"iterations", ColumnKind::kInteger},
                               {"median_ms", ColumnKind::kReal}, {"min_ms", ColumnKind::kReal},
                               {"max_ms", ColumnKind::kReal}, {"gflops", ColumnKind::kReal},
                               {"of_best", ColumnKind::kReal, 3}, {"vs_cpu", ColumnKind::kReal, 3}});
  for (const auto& c : cases) {
    const Stats& s = c.measurement.seconds;
    Cell vs_cpu;
    if (!c.device.is_cpu() && cpu_median.count(c.n) != 0) {
      vs_cpu = cpu_median[c.n] / s.median;
    }
    table.add_row({c.device.str(), dtype_name(c.dtype), c.n, s.count, c.measurement.iterations, s.median * 1e3,
                   s.min * 1e3, s.max * 1e3, c.gflops, c.gflops / best[case_key(c.device, c.dtype)],
                   vs_cpu});
  }
  SuiteResult result("matmul",
                     "C = A B for square n x n matrices, timed after a warm-up call (a monotonic clock on the CPU, "
                     "CUDA events on a GPU); median/min/max of the repeats, GFLOP/s = 2n^3 / median, of_best = "
                     "fraction of the best GFLOP/s this device and dtype reached in this run, vs_cpu = CPU float32 "
                     "median / this median",
                     std::move(table));
  result.summary.emplace_back("cpu_threads", static_cast<int64_t>(at::get_num_threads()));
  for (const auto& c : cases) {
    const std::string key = case_key(c.device, c.dtype);
    if (c.gflops == best[key]) {
      result.summary.emplace_back("best_gflops." + key, c.gflops);
      result.notes.push_back(case_label(c.device, c.dtype) + ": best " + format_fixed(c.gflops, 1) + " GFLOP/s, at n=" +
                             std::to_string(c.n));
    }
  }
  if (!cpu_median.empty()) {
    const BlasInfo blas = blas_info();
    result.summary.emplace_back("blas", blas.name + " (" + blas.threading + ")");
    result.summary.emplace_back("blas_threads", static_cast<int64_t>(blas.threads));
    result.notes.push_back("cpu: LibTorch uses " + std::to_string(at::get_num_threads()) + " intra-op thread(s); " +
                           blas.name + " (" + blas.threading + ") uses " + std::to_string(blas.threads) +
                           " thread(s)");
  }
  bool any_gpu = false;
  for (const auto& device : devices) {
    if (!device.is_cuda()) {
      continue;
    }
    any_gpu = true;
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      result.notes.push_back(crossover_note(cases, device, dtype, result.summary));
    }
  }
  if (!any_gpu) {
    result.notes.push_back("no GPU in this run, so no size at which a GPU overtakes the CPU");
  } else {
    result.summary.emplace_back("cuda_allow_tf32", at::globalContext().allowTF32CuBLAS());
    result.notes.push_back(std::string("GPU float32 products ") +
                           (at::globalContext().allowTF32CuBLAS() ? "may use" : "do not use") +
                           " TF32 (LibTorch's allowTF32CuBLAS setting)");
  }
  return result;
}

SuiteResult bench_logging(const SuiteOptions& options) {
  const std::vector<Device> devices = suite_devices(options);
  const std::vector<int64_t> sizes = checked_sizes(options, {100, 500});
  const int64_t steps = options.steps() > 0 ? options.steps() : (options.quick() ? 200 : 1000);
  const int64_t repeat = options.repeat() > 0 ? options.repeat() : 3;
  const int64_t capacity = std::min<int64_t>(100, steps);
  ResultTable table("logging", {{"device"}, {"n", ColumnKind::kInteger}, {"variant"},
                                {"steps", ColumnKind::kInteger}, {"host_reads", ColumnKind::kInteger},
                                {"repeat", ColumnKind::kInteger}, {"median_us_per_step", ColumnKind::kReal},
                                {"min_us_per_step", ColumnKind::kReal}, {"max_us_per_step", ColumnKind::kReal},
                                {"speedup_vs_item", ColumnKind::kReal, 3}});
  SuiteResult result("logging", "", ResultTable("logging", {}));
  for (const auto& device : devices) {
    for (const int64_t n : sizes) {
      const auto tensor_options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
      const at::Tensor a = torch::randn({n, n}, tensor_options) / std::sqrt(static_cast<double>(n));
      const at::Tensor b = torch::randn({n, n}, tensor_options) / std::sqrt(static_cast<double>(n));
      at::Tensor c = torch::empty({n, n}, tensor_options);
      const std::vector<std::pair<std::string, std::function<LoggingRun(int64_t)>>> variants = {
          {"a:item_every_step", [&](int64_t k) { return log_with_item(a, b, c, k); }},
          {"b:device_tensor", [&](int64_t k) { return log_on_device(a, b, c, k); }},
          {"c:metric_buffer", [&](int64_t k) { return log_with_metric_buffer(a, b, c, k, capacity); }},
      };
      const int64_t warmup_steps = std::min<int64_t>(steps, 50);
      at::Tensor reference;
      for (const auto& [variant, run] : variants) {
        const LoggingRun warm = run(warmup_steps);
        if (!reference.defined()) {
          reference = warm.norms;
        }
        TORCH_INTERNAL_ASSERT(torch::allclose(warm.norms, reference), "logging variant ", variant,
                              " logged different norms from the .item() variant");
      }
      std::vector<std::vector<double>> samples(variants.size());
      std::vector<int64_t> host_reads(variants.size(), 0);
      DeviceTimer timer(device);
      for (int64_t r = 0; r < repeat; ++r) {
        report_progress(options, "logging: " + device.str() + " n=" + std::to_string(n) + " run " + std::to_string(r + 1) + "/" +
                         std::to_string(repeat) + " of each variant");
        for (size_t v = 0; v < variants.size(); ++v) {
          timer.start();
          host_reads[v] = variants[v].second(steps).host_reads;
          samples[v].push_back(timer.stop() / static_cast<double>(steps));
        }
      }
      double item_median = 0.0;
      for (size_t v = 0; v < variants.size(); ++v) {
        const std::string& variant = variants[v].first;
        const Stats per_step = summarize(samples[v]);
        if (v == 0) {
          item_median = per_step.median;
        }
        const double speedup = item_median / per_step.median;
        table.add_row({device.str(), n, variant, steps, host_reads[v], per_step.count, per_step.median * 1e6,
                       per_step.min * 1e6, per_step.max * 1e6, speedup});
        const std::string key = device.str() + ".n=" + std::to_string(n) + "." + variant;
        result.summary.emplace_back("us_per_step." + key, per_step.median * 1e6);
        if (v == 0) {
          continue;
        }
        result.summary.emplace_back("speedup_vs_item." + key, speedup);
        result.notes.push_back(device.str() + " n=" + std::to_string(n) + ": " + variant + " takes " +
                               format_fixed(per_step.median * 1e6, 1) + " us/step, " + format_fixed(speedup, 2) +
                               "x the speed of a:item_every_step (" + format_fixed(item_median * 1e6, 1) + " us/step)");
      }
    }
  }
  result.description = std::to_string(steps) +
                       " steps of C = A B, each logging the Frobenius norm of C: (a) .item() every step, (b) into "
                       "a preallocated device tensor read back once, (c) through a metric buffer of " +
                       std::to_string(capacity) +
                       " rows flushed when full (dkit::MetricBuffer); host_reads = the change in "
                       "dkit::host_sync_count() over a run; after a warm-up, the variants take turns run by run so "
                       "that a change in the machine's load hits them alike; time per step = run time / steps, "
                       "median/min/max of the runs";
  result.table = std::move(table);
  return result;
}

std::string results_to_json(const std::vector<SuiteResult>& results) {
  const DeviceReport report = device_report();
  nlohmann::ordered_json gpus = nlohmann::ordered_json::array();
  for (const auto& gpu_info : report.gpus) {
    gpus.push_back(gpu(gpu_info.index).str() + " " + gpu_info.name);
  }
  const nlohmann::ordered_json json = {
      {"dkit_version", DKIT_VERSION},
      {"torch_version", report.torch_version},
      {"date", utc_now()},
      {"machine",
       {{"cpu_threads", report.cpu_threads},
        {"cpus_available", report.cpus_available},
        {"blas", report.blas.name},
        {"blas_threading", report.blas.threading},
        {"cuda_status", to_string(report.cuda_status)},
        {"gpus", std::move(gpus)}}},
      {"suites", results}};
  return json_text(json) + "\n";
}

std::vector<std::pair<std::string, std::string>> csv_outputs(const std::string& path,
                                                             const std::vector<SuiteResult>& results) {
  std::vector<std::pair<std::string, std::string>> outputs;
  if (results.size() == 1) {
    outputs.emplace_back(path, results.front().table.to_csv());
    return outputs;
  }
  const std::filesystem::path base(path);
  const std::string extension = base.has_extension() ? base.extension().string() : ".csv";
  for (const auto& result : results) {
    const std::filesystem::path file =
        base.parent_path() / (base.stem().string() + "-" + result.suite + extension);
    outputs.emplace_back(file.string(), result.table.to_csv());
  }
  return outputs;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DKIT_CHECK(out, "cannot write '", path, "': ", std::strerror(errno));
  out << text;
  out.close();
  DKIT_CHECK(out, "cannot write '", path, "': ", std::strerror(errno));
}

void report_progress(const SuiteOptions& options, const std::string& line) {
  if (options.progress()) {
    options.progress()(line);
  }
}

std::vector<Device> suite_devices(const SuiteOptions& options) {
  std::vector<Device> devices = options.devices();
  if (devices.empty()) {
    devices.push_back(cpu());
    for (int64_t i = 0; i < num_gpus(); ++i) {
      devices.push_back(gpu(i));
    }
  }
  for (auto& device : devices) {
    DKIT_CHECK(is_available(device), "cannot benchmark on '", device.str(),
               "': not available; available devices: ", available_devices());
    if (device.is_cuda() && !device.has_index()) {
      device = gpu(0);
    }
  }
  return devices;
}

} // namespace dkit::bench
