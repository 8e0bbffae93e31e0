#include <dkit/bench/suites.h>

#include <dkit/bench/timing.h>
#include <dkit/config.h>
#include <dkit/core/error.h>
#include <dkit/device/report.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>

#if DKIT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace dkit::bench {
namespace {

std::vector<Device> selected_gpus(const SuiteOptions& options) {
  std::vector<Device> gpus;
  if (options.devices().empty()) {
    for (int64_t i = 0; i < num_gpus(); ++i) {
      gpus.push_back(gpu(i));
    }
    return gpus;
  }
  for (const auto& device : options.devices()) {
    if (device.is_cuda()) {
      DKIT_CHECK(is_available(device), "cannot benchmark on '", device.str(),
                 "': not available; available devices: ", available_devices());
      gpus.push_back(device.has_index() ? device : gpu(0));
    }
  }
  return gpus;
}

#if DKIT_WITH_CUDA
std::string size_label(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  int64_t value = bytes;
  while (unit < 4 && value >= 1024 && value % 1024 == 0) {
    value /= 1024;
    ++unit;
  }
  return std::to_string(value) + " " + kUnits[unit];
}

struct TransferRow {
  std::string direction;
  std::string memory;
  int64_t bytes = 0;
  Stats seconds;
  std::optional<double> compute_seconds;
  std::optional<double> together_seconds;
  std::optional<double> hidden;
};

struct OverlapTiming {
  Stats copy;
  Stats together;
};

OverlapTiming time_overlapped_copy(const Device& device, at::Tensor& dst, const at::Tensor& src,
                                   const std::function<void()>& compute, int64_t repeat) {
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  at::cuda::CUDAEvent start(cudaEventDefault);
  at::cuda::CUDAEvent end(cudaEventDefault);
  at::cuda::CUDAEvent copy_begin(cudaEventDefault);
  at::cuda::CUDAEvent copy_end(cudaEventDefault);
  std::vector<double> copy_samples;
  std::vector<double> together_samples;
  for (int64_t r = 0; r <= repeat; ++r) {
    start.record(main);
    start.block(side);
    compute();
    copy_begin.record(side);
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      dst.copy_(src, /*non_blocking=*/true);
    }
    copy_end.record(side);
    copy_end.block(main);
    end.record(main);
    end.synchronize();
    if (r == 0) {
      continue;
    }
    copy_samples.push_back(static_cast<double>(copy_begin.elapsed_time(copy_end)) / 1000.0);
    together_samples.push_back(static_cast<double>(start.elapsed_time(end)) / 1000.0);
  }
  return {summarize(std::move(copy_samples)), summarize(std::move(together_samples))};
}

SuiteResult run_transfer(const Device& device, const SuiteOptions& options) {
  const c10::cuda::CUDAGuard guard(device.index());
  std::vector<int64_t> sizes = options.sizes();
  if (sizes.empty()) {
    const int64_t largest = options.quick() ? (int64_t{64} << 20) : (int64_t{1} << 30);
    for (int64_t bytes = 4096; bytes <= largest; bytes *= 4) {
      sizes.push_back(bytes);
    }
  }
  for (const int64_t bytes : sizes) {
    DKIT_CHECK(bytes > 0, "sizes must be positive, got ", bytes);
  }
  const int64_t repeat = options.repeat() > 0 ? options.repeat() : 5;
  const MeasureOptions copy_options = MeasureOptions().warmup(1).repeat(repeat).min_sample_seconds(0.01);

  const int64_t side = 1024;
  const auto float_options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const at::Tensor ma = torch::randn({side, side}, float_options);
  const at::Tensor mb = torch::randn({side, side}, float_options);
  at::Tensor mc = torch::empty({side, side}, float_options);
  const double one_matmul =
      measure(device, MeasureOptions().warmup(2).repeat(3), [&] { at::mm_out(mc, ma, mb); }).seconds.median;

  std::vector<TransferRow> rows;
  for (const int64_t bytes : sizes) {
    const auto bytes_options = torch::TensorOptions().dtype(torch::kUInt8);
    const at::Tensor pageable = torch::ones({bytes}, bytes_options);
    const at::Tensor pinned = torch::ones({bytes}, bytes_options).pin_memory();
    const at::Tensor on_device = torch::ones({bytes}, bytes_options.device(device));
    for (const bool to_device : {true, false}) {
      const std::string direction = to_device ? "h2d" : "d2h";
      double pinned_seconds = 0.0;
      for (const bool use_pinned : {false, true}) {
        const std::string memory = use_pinned ? "pinned" : "pageable";
        report_progress(options, "transfer: " + direction + " " + memory + " " + size_label(bytes));
        at::Tensor host = use_pinned ? pinned : pageable;
        at::Tensor dst = to_device ? on_device : host;
        const at::Tensor src = to_device ? host : on_device;
        const Measurement measurement = measure(device, copy_options, [&] { dst.copy_(src); });
        rows.push_back({direction, memory, bytes, measurement.seconds, {}, {}, {}});
        pinned_seconds = measurement.seconds.median;
      }
      report_progress(options, "transfer: " + direction + " pinned_overlap " + size_label(bytes));
      const auto matmuls = static_cast<int64_t>(
          std::clamp(std::ceil(pinned_seconds / std::max(one_matmul, 1e-9)), 1.0, 10000.0));
      const std::function<void()> compute = [&] {
        for (int64_t i = 0; i < matmuls; ++i) {
          at::mm_out(mc, ma, mb);
        }
      };
      const double compute_seconds =
          measure(device, MeasureOptions().warmup(1).repeat(repeat).iterations(1), compute).seconds.median;
      at::Tensor host = pinned;
      at::Tensor dst = to_device ? on_device : host;
      const at::Tensor src = to_device ? host : on_device;
      const OverlapTiming overlap = time_overlapped_copy(device, dst, src, compute, repeat);
      const double copy_seconds = overlap.copy.median;
      const double hidden = std::clamp((copy_seconds + compute_seconds - overlap.together.median) /
                                           std::max(std::min(copy_seconds, compute_seconds), 1e-12),
                                       0.0, 1.0);
      rows.push_back({direction, "pinned_overlap", bytes, overlap.copy, compute_seconds, overlap.together.median,
                      hidden});
    }
  }

  std::map<std::string, double> peak;
  for (const auto& row : rows) {
    peak[row.direction] = std::max(peak[row.direction], static_cast<double>(row.bytes) / row.seconds.median / 1e9);
  }
  ResultTable table("transfer", {{"direction"}, {"memory"}, {"size"}, {"bytes", ColumnKind::kInteger},
                                 {"repeat", ColumnKind::kInteger}, {"median_us", ColumnKind::kReal},
                                 {"min_us", ColumnKind::kReal}, {"max_us", ColumnKind::kReal},
                                 {"gbps", ColumnKind::kReal}, {"of_peak", ColumnKind::kReal, 3},
                                 {"compute_us", ColumnKind::kReal}, {"together_us", ColumnKind::kReal},
                                 {"hidden", ColumnKind::kReal, 3}});
  const auto optional_cell = [](const std::optional<double>& value, double scale) {
    return value ? Cell(*value * scale) : Cell();
  };
  for (const auto& row : rows) {
    const double gbps = static_cast<double>(row.bytes) / row.seconds.median / 1e9;
    table.add_row({row.direction, row.memory, size_label(row.bytes), row.bytes, row.seconds.count,
                   row.seconds.median * 1e6, row.seconds.min * 1e6, row.seconds.max * 1e6, gbps,
                   gbps / peak[row.direction], optional_cell(row.compute_seconds, 1e6),
                   optional_cell(row.together_seconds, 1e6), optional_cell(row.hidden, 1.0)});
  }
  SuiteResult result(
      "transfer",
      "copies between host memory and " + device.str() +
          ", timed with CUDA events after a warm-up: pageable and pinned memory with synchronous copies, and "
          "pinned memory copied with non_blocking on a side stream while matmuls of about the copy's duration "
          "run on the main stream (compute_us alone, together_us both, hidden = fraction of the shorter one "
          "hidden by the overlap); GB/s = 10^9 bytes/s from the median, of_peak = fraction of the best GB/s "
          "in this run for that direction",
      std::move(table));
  for (const auto& [direction, gbps] : peak) {
    result.summary.emplace_back("peak_gbps." + direction, gbps);
    result.notes.push_back(direction + ": best " + format_fixed(gbps, 2) + " GB/s in this run");
  }
  return result;
}
#endif

} // namespace

std::string transfer_unsupported(const SuiteOptions& options) {
  if (num_gpus() == 0) {
    return "needs a CUDA GPU: " + cuda_unavailable_reason();
  }
  if (selected_gpus(options).empty()) {
    return "needs a CUDA GPU, and --device selected none";
  }
  return "";
}

std::string multi_gpu_unsupported(const SuiteOptions& options) {
  const size_t found = selected_gpus(options).size();
  if (found >= 2) {
    return "";
  }
  std::string why = "needs 2 GPUs, found " + std::to_string(found);
  if (num_gpus() == 0) {
    why += ": " + cuda_unavailable_reason();
  } else if (!options.devices().empty()) {
    why += " among the devices selected";
  }
  return why;
}

SuiteResult bench_transfer(const SuiteOptions& options) {
  const std::string why = transfer_unsupported(options);
  if (!why.empty()) {
    return SuiteResult::skipped("transfer", why);
  }
#if DKIT_WITH_CUDA
  return run_transfer(selected_gpus(options).front(), options);
#else
  TORCH_INTERNAL_ASSERT(false, "a build without CUDA found a GPU");
  return SuiteResult::skipped("transfer", why);
#endif
}

SuiteResult bench_multi_gpu(const SuiteOptions& options) {
  const std::string why = multi_gpu_unsupported(options);
  if (!why.empty()) {
    return SuiteResult::skipped("multi-gpu", why);
  }
  const std::vector<Device> gpus = selected_gpus(options);
  const Device first = gpus[0];
  const Device second = gpus[1];
  std::vector<int64_t> sizes = options.sizes();
  if (sizes.empty()) {
    sizes = options.quick() ? std::vector<int64_t>{1000, 4000} : std::vector<int64_t>{1000, 2000, 4000, 8192};
  }
  const int64_t repeat = options.repeat() > 0 ? options.repeat() : 5;
  const MeasureOptions measure_options = MeasureOptions().warmup(2).repeat(repeat);
  ResultTable table("multi-gpu", {{"n", ColumnKind::kInteger}, {"mode"}, {"devices"},
                                  {"repeat", ColumnKind::kInteger}, {"iterations", ColumnKind::kInteger},
                                  {"median_ms", ColumnKind::kReal}, {"min_ms", ColumnKind::kReal},
                                  {"max_ms", ColumnKind::kReal}, {"speedup", ColumnKind::kReal, 3},
                                  {"efficiency", ColumnKind::kReal, 3}});
  SuiteResult result("multi-gpu", "", ResultTable("multi-gpu", {}));
  for (const int64_t n : sizes) {
    DKIT_CHECK(n > 0, "sizes must be positive, got ", n);
    report_progress(options, "multi-gpu: n=" + std::to_string(n));
    const auto on_first = torch::TensorOptions().dtype(torch::kFloat32).device(first);
    const auto on_second = torch::TensorOptions().dtype(torch::kFloat32).device(second);
    const at::Tensor a0 = torch::randn({n, n}, on_first);
    const at::Tensor b0 = torch::randn({n, n}, on_first);
    const at::Tensor a0b = torch::randn({n, n}, on_first);
    const at::Tensor b0b = torch::randn({n, n}, on_first);
    const at::Tensor a1 = torch::randn({n, n}, on_second);
    const at::Tensor b1 = torch::randn({n, n}, on_second);
    at::Tensor c0 = torch::empty({n, n}, on_first);
    at::Tensor c0b = torch::empty({n, n}, on_first);
    at::Tensor c1 = torch::empty({n, n}, on_second);
    const Measurement one = measure(cpu(), measure_options, [&] {
      at::mm_out(c0, a0, b0);
      synchronize(first);
    });
    const Measurement sequential = measure(cpu(), measure_options, [&] {
      at::mm_out(c0, a0, b0);
      at::mm_out(c0b, a0b, b0b);
      synchronize(first);
    });
    const Measurement parallel = measure(cpu(), measure_options, [&] {
      at::mm_out(c0, a0, b0);
      at::mm_out(c1, a1, b1);
      synchronize(first);
      synchronize(second);
    });
    const double speedup = sequential.seconds.median / parallel.seconds.median;
    const auto add = [&](const std::string& mode, const std::string& devices, const Measurement& m, Cell gain,
                         Cell efficiency) {
      table.add_row({n, mode, devices, m.seconds.count, m.iterations, m.seconds.median * 1e3, m.seconds.min * 1e3,
                     m.seconds.max * 1e3, std::move(gain), std::move(efficiency)});
    };
    add("one matmul", first.str(), one, Cell(), Cell());
    add("two in sequence", first.str(), sequential, 1.0, 1.0);
    add("two at once", first.str() + "+" + second.str(), parallel, speedup, speedup / 2.0);
    result.summary.emplace_back("efficiency.n=" + std::to_string(n), speedup / 2.0);
    result.notes.push_back("n=" + std::to_string(n) + ": two GPUs at once are " + format_fixed(speedup, 2) +
                           "x as fast as one GPU in sequence, a scaling efficiency of " +
                           format_fixed(100.0 * speedup / 2.0, 0) + "%");
  }
  result.description = "two float32 n x n matmuls, one after the other on " + first.str() + " vs one on " +
                       first.str() + " and one on " + second.str() +
                       " at once; host clock around the launches and a synchronize of each GPU (two devices "
                       "share no event clock), after warm-up; speedup = sequential / at once, efficiency = "
                       "speedup / 2";
  result.table = std::move(table);
  return result;
}

} // namespace dkit::bench
