#pragma once

#include <dkit/config.h>
#include <dkit/device/device.h>
#include <dkit/device/host_sync.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace dkit {

/// The rows MetricBuffer::flush() read back: one row per add(), one column per metric name.
struct MetricRows {
  /// The metric names, in column order.
  std::vector<std::string> names;
  /// float32 `[rows, names.size()]` on the CPU.
  at::Tensor values;

  /// Number of rows.
  int64_t rows() const;
  /// Column of `name`; an unknown name is an error listing the known ones.
  int64_t column(std::string_view name) const;
  /// Every value of `name`, oldest first.
  std::vector<double> values_of(std::string_view name) const;
  /// Sum of the values of `name`; 0 when there are no rows.
  double sum(std::string_view name) const;
  /// Mean of the values of `name`; NaN when there are no rows.
  double mean(std::string_view name) const;
  /// Newest value of `name`; NaN when there are no rows.
  double last(std::string_view name) const;
};

/// Named scalar metrics (loss, correct count, ...) kept on the device, one row per training step, in a buffer
/// allocated once. add() queues a device-side write and never waits for the device; flush() reads all the
/// filled rows back in one device-to-host transfer (into a page-locked buffer on CUDA) and starts over. Example:
/// ```
/// dkit::MetricBuffer metrics({"loss", "correct"}, device, /*capacity=*/log_every);
/// metrics.add({loss, (logits.argmax(1) == labels).sum()});
/// if (metrics.full()) { auto rows = metrics.flush(); log(rows.mean("loss")); }
/// ```
class MetricBuffer {
 public:
  /// A buffer of `capacity` rows for the metrics `names` on `device`.
  MetricBuffer(std::vector<std::string> names, const Device& device, int64_t capacity);

  /// Appends one row: one 0-d tensor per name, in order, on the buffer's device, of any dtype (converted to
  /// float32). Gradients are not tracked. Adding to a full buffer is an error. On a GPU the row is written by a
  /// queued `stack` into the buffer; on the CPU the values are copied in directly, with no dispatcher call.
  void add(std::initializer_list<at::Tensor> values);
  /// Appends one row, as the initializer_list overload.
  void add(const std::vector<at::Tensor>& values);

  /// The filled rows, in one device-to-host transfer, counted once in host_sync_count(); the buffer is empty
  /// afterwards. An empty buffer returns no rows and reads nothing.
  MetricRows flush();

  /// Rows added since the last flush().
  int64_t size() const {
    return size_;
  }
  /// Rows the buffer holds.
  int64_t capacity() const {
    return capacity_;
  }
  /// Whether no row is left free.
  bool full() const {
    return size_ == capacity_;
  }
  /// Whether no row has been added since the last flush().
  bool empty() const {
    return size_ == 0;
  }
  /// The metric names, in column order.
  const std::vector<std::string>& names() const {
    return names_;
  }
  /// The device the rows live on.
  const Device& device() const {
    return device_;
  }

 private:
  void add_row(const at::Tensor* values, size_t count);

  std::vector<std::string> names_;
  Device device_;
  int64_t capacity_;
  int64_t size_ = 0;
  at::Tensor buffer_;
  std::vector<at::Tensor> rows_;
  at::Tensor host_;
};

/// The running mean of a value (Flashlight's AverageValueMeter), its total kept on the device: add() never waits
/// for the device, value() reads it once.
class AverageMeter {
 public:
  /// A meter whose total lives on `device`.
  explicit AverageMeter(const Device& device);

  /// Adds `value` (a 0-d tensor on the meter's device, e.g. a batch's mean loss) with weight `count`.
  void add(const at::Tensor& value, int64_t count = 1);
  /// The weighted mean of everything added: one host sync; NaN when nothing was added.
  double value() const;
  /// Sum of `value * count` so far: a float64 0-d tensor on the device, read without a sync.
  const at::Tensor& total() const {
    return total_;
  }
  /// Sum of the weights so far (kept on the host).
  int64_t count() const {
    return count_;
  }
  /// Starts again from nothing.
  void reset();

 private:
  at::Tensor total_;
  int64_t count_ = 0;
};

/// Classification accuracy, its correct count kept on the device.
class AccuracyMeter {
 public:
  /// A meter whose count lives on `device`.
  explicit AccuracyMeter(const Device& device);

  /// Counts the rows of `logits` (`[N, C]`) whose largest entry is at `labels` (`[N]`).
  void add(const at::Tensor& logits, const at::Tensor& labels);
  /// Correct predictions over all samples added: one host sync; NaN when nothing was added.
  double value() const;
  /// Correct predictions so far: an int64 0-d tensor on the device, read without a sync.
  const at::Tensor& correct() const {
    return correct_;
  }
  /// Samples added so far (kept on the host).
  int64_t count() const {
    return count_;
  }
  /// Starts again from nothing.
  void reset();

 private:
  at::Tensor correct_;
  int64_t count_ = 0;
};

#if DKIT_WITH_CUDA
/// Makes every CUDA synchronisation that LibTorch performs within its scope (`.item()`, blocking copies to the
/// host, stream synchronisation) an error (or a warning), through `c10::cuda::warning_state()`'s sync debug mode,
/// as `torch.cuda.set_sync_debug_mode` does. The mode is process-wide; the previous one is restored at scope exit.
/// A test wraps a hot loop in one to prove that it never waits for the GPU. CUDA builds only.
class ScopedSyncCheck {
 public:
  /// Errors on a sync when `error`, otherwise warns.
  explicit ScopedSyncCheck(bool error = true);
  /// Puts back the mode found at construction.
  ~ScopedSyncCheck();
  ScopedSyncCheck(const ScopedSyncCheck&) = delete;
  ScopedSyncCheck& operator=(const ScopedSyncCheck&) = delete;

 private:
  int previous_;
};
#endif

} // namespace dkit
