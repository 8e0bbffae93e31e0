#pragma once

#include <dkit/device/device.h>

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace dkit::bench {

/// A monotonic wall-clock stopwatch (`std::chrono::steady_clock`), started when constructed. It never goes
/// backwards when the system clock is adjusted, unlike `std::chrono::system_clock`.
class Timer {
 public:
  /// Starts the stopwatch.
  Timer();
  /// Starts the stopwatch again from zero.
  void reset();
  /// Seconds since construction or the last reset().
  double seconds() const;

 private:
  std::chrono::steady_clock::time_point start_;
};

/// Times work queued on one device. On the CPU it is a Timer, as LibTorch's CPU operations finish before they
/// return. On a GPU it records CUDA events on the device's current stream, so the time is the GPU's own and
/// stop() waits for the queued work instead of timing only the kernel launches.
class DeviceTimer {
 public:
  /// A timer for `device`; a GPU must be available.
  explicit DeviceTimer(const Device& device);
  /// Releases the CUDA events, if any.
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  /// Marks the start of the timed work.
  void start();
  /// Marks its end, waits for the device to reach that mark and returns the seconds in between.
  double stop();
  /// The device being timed.
  const Device& device() const {
    return device_;
  }

 private:
  struct CudaEvents;

  Device device_;
  Timer timer_;
  std::unique_ptr<CudaEvents> events_;
};

/// Waits until every operation queued on `device` has finished; returns at once for the CPU.
void synchronize(const Device& device);

/// Summary statistics of repeated measurements.
struct Stats {
  /// The middle sample; the mean of the two middle ones for an even count.
  double median = 0.0;
  /// The smallest sample.
  double min = 0.0;
  /// The largest sample.
  double max = 0.0;
  /// The arithmetic mean.
  double mean = 0.0;
  /// How many samples there were.
  int64_t count = 0;
};

/// The statistics of `samples`, which must not be empty.
Stats summarize(std::vector<double> samples);

/// How measure() repeats the work it times.
struct MeasureOptions {
  /// Untimed calls first, to pay one-off costs (allocator growth, cuBLAS handles, lazy kernels, page faults).
  TORCH_ARG(int64_t, warmup) = 1;
  /// Timed samples taken after the warm-up.
  TORCH_ARG(int64_t, repeat) = 5;
  /// Calls of the work inside one timed sample; 0 picks enough calls that a sample lasts at least
  /// `min_sample_seconds`: after the warm-up, untimed batches of growing size until one lasts that long.
  TORCH_ARG(int64_t, iterations) = 0;
  /// The shortest sample worth timing when `iterations` is 0, so that short operations are not lost in the
  /// timer's own resolution and overhead.
  TORCH_ARG(double, min_sample_seconds) = 0.02;
  /// When positive, about the most seconds the timed samples may take together: `repeat` is lowered to fit,
  /// never below `min_repeat`. It keeps multi-second cases (an 8192² matmul on two CPU cores) bounded.
  TORCH_ARG(double, budget_seconds) = 0.0;
  /// The fewest samples taken when `budget_seconds` lowers `repeat`.
  TORCH_ARG(int64_t, min_repeat) = 3;
};

/// The result of measure(): statistics of the time of one call, in seconds.
struct Measurement {
  /// Seconds per call: each sample is a timed run of `iterations` calls divided by `iterations`.
  Stats seconds;
  /// Calls per timed sample.
  int64_t iterations = 1;
};

/// Times `work` on `device` with a DeviceTimer: the warm-up calls, then the samples. `work` must only queue
/// work on `device` (or finish it); the timer waits for the device at the end of every sample.
Measurement measure(const Device& device, const MeasureOptions& options, const std::function<void()>& work);

} // namespace dkit::bench
