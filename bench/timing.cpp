#include <dkit/bench/timing.h>

#include <dkit/config.h>
#include <dkit/core/error.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#if DKIT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace dkit::bench {
namespace {

constexpr int64_t kMaxIterations = 1'000'000;

} // namespace

Timer::Timer() : start_(std::chrono::steady_clock::now()) {}

void Timer::reset() {
  start_ = std::chrono::steady_clock::now();
}

double Timer::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

#if DKIT_WITH_CUDA
struct DeviceTimer::CudaEvents {
  at::cuda::CUDAEvent begin{cudaEventDefault};
  at::cuda::CUDAEvent end{cudaEventDefault};
};
#else
struct DeviceTimer::CudaEvents {};
#endif

DeviceTimer::DeviceTimer(const Device& device) : device_(device) {
  if (device_.is_cpu()) {
    return;
  }
  DKIT_CHECK(device_.is_cuda() && is_available(device_), "cannot time work on '", device_.str(),
             "': not available; available devices: ", available_devices());
  if (!device_.has_index()) {
    device_ = gpu(0);
  }
#if DKIT_WITH_CUDA
  events_ = std::make_unique<CudaEvents>();
#endif
}

DeviceTimer::~DeviceTimer() = default;

void DeviceTimer::start() {
#if DKIT_WITH_CUDA
  if (events_) {
    const c10::cuda::CUDAGuard guard(device_.index());
    events_->begin.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    return;
  }
#endif
  timer_.reset();
}

double DeviceTimer::stop() {
#if DKIT_WITH_CUDA
  if (events_) {
    const c10::cuda::CUDAGuard guard(device_.index());
    events_->end.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    events_->end.synchronize();
    return static_cast<double>(events_->begin.elapsed_time(events_->end)) / 1000.0;
  }
#endif
  return timer_.seconds();
}

void synchronize(const Device& device) {
  if (device.is_cuda()) {
    torch::cuda::synchronize(device.has_index() ? device.index() : 0);
  }
}

Stats summarize(std::vector<double> samples) {
  DKIT_CHECK(!samples.empty(), "cannot summarize an empty list of samples");
  std::sort(samples.begin(), samples.end());
  Stats stats;
  stats.count = static_cast<int64_t>(samples.size());
  stats.min = samples.front();
  stats.max = samples.back();
  const size_t middle = samples.size() / 2;
  stats.median = samples.size() % 2 == 1 ? samples[middle] : (samples[middle - 1] + samples[middle]) / 2.0;
  stats.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  return stats;
}

Measurement measure(const Device& device, const MeasureOptions& options, const std::function<void()>& work) {
  DKIT_CHECK(options.warmup() >= 0, "warm-up calls must be 0 or more, got ", options.warmup());
  DKIT_CHECK(options.repeat() >= 1, "repeat must be at least 1, got ", options.repeat());
  DKIT_CHECK(options.iterations() >= 0, "iterations must be 0 (automatic) or more, got ", options.iterations());
  DeviceTimer timer(device);
  double one_call = 0.0;
  for (int64_t i = 0; i < options.warmup(); ++i) {
    timer.start();
    work();
    one_call = timer.stop();
  }
  Measurement result;
  result.iterations = options.iterations() > 0 ? options.iterations() : 1;
  if (options.iterations() == 0 && one_call < options.min_sample_seconds()) {
    while (true) {
      timer.start();
      for (int64_t i = 0; i < result.iterations; ++i) {
        work();
      }
      const double batch = timer.stop();
      one_call = batch / static_cast<double>(result.iterations);
      if (batch >= options.min_sample_seconds() || result.iterations >= kMaxIterations) {
        break;
      }
      const double wanted = 1.2 * options.min_sample_seconds() / std::max(batch, 1e-9);
      result.iterations = std::min(kMaxIterations, result.iterations * std::clamp<int64_t>(
                                                       static_cast<int64_t>(std::ceil(wanted)), 2, 10));
    }
  }
  int64_t repeat = options.repeat();
  if (options.budget_seconds() > 0.0 && one_call > 0.0) {
    const double per_sample = one_call * static_cast<double>(result.iterations);
    const auto fits = static_cast<int64_t>(options.budget_seconds() / per_sample);
    repeat = std::min(repeat, std::max(fits, std::min(options.min_repeat(), options.repeat())));
  }
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(repeat));
  for (int64_t r = 0; r < repeat; ++r) {
    timer.start();
    for (int64_t i = 0; i < result.iterations; ++i) {
      work();
    }
    samples.push_back(timer.stop() / static_cast<double>(result.iterations));
  }
  result.seconds = summarize(std::move(samples));
  return result;
}

} // namespace dkit::bench
