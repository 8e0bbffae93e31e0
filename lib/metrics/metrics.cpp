#include <dkit/metrics/metrics.h>

#include <dkit/core/error.h>

#include <torch/torch.h>

#include <algorithm>
#include <limits>

#if DKIT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dkit {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) {
    text += (text.empty() ? "" : ", ") + name;
  }
  return text;
}

float host_scalar(const at::Tensor& value) {
  float out = 0;
  AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, value.scalar_type(), "MetricBuffer::add",
                             [&] { out = static_cast<float>(*value.data_ptr<scalar_t>()); });
  return out;
}

at::Tensor zeros_on(const Device& device, at::ScalarType dtype) {
  DKIT_CHECK(is_available(device), "metrics device '", device.str(),
             "' is not available; available devices: ", available_devices());
  return at::zeros({}, at::TensorOptions().dtype(dtype).device(device));
}

} // namespace

int64_t MetricRows::rows() const {
  return values.defined() ? values.size(0) : 0;
}

int64_t MetricRows::column(std::string_view name) const {
  const auto found = std::find(names.begin(), names.end(), name);
  DKIT_CHECK(found != names.end(), "unknown metric '", name, "': the buffer has ", join(names));
  return found - names.begin();
}

std::vector<double> MetricRows::values_of(std::string_view name) const {
  const int64_t c = column(name);
  std::vector<double> out;
  out.reserve(static_cast<size_t>(rows()));
  if (rows() == 0) {
    return out;
  }
  const auto cells = values.accessor<float, 2>();
  for (int64_t r = 0; r < rows(); ++r) {
    out.push_back(cells[r][c]);
  }
  return out;
}

double MetricRows::sum(std::string_view name) const {
  double total = 0;
  for (double value : values_of(name)) {
    total += value;
  }
  return total;
}

double MetricRows::mean(std::string_view name) const {
  return rows() == 0 ? kNaN : sum(name) / static_cast<double>(rows());
}

double MetricRows::last(std::string_view name) const {
  const auto all = values_of(name);
  return all.empty() ? kNaN : all.back();
}

MetricBuffer::MetricBuffer(std::vector<std::string> names, const Device& device, int64_t capacity)
    : names_(std::move(names)), device_(with_index(device)), capacity_(capacity) {
  DKIT_CHECK(!names_.empty(), "a MetricBuffer needs at least one metric name");
  DKIT_CHECK(capacity_ >= 1, "MetricBuffer capacity must be at least 1, got ", capacity_);
  for (size_t i = 0; i < names_.size(); ++i) {
    DKIT_CHECK(std::find(names_.begin(), names_.begin() + static_cast<std::ptrdiff_t>(i), names_[i]) ==
                   names_.begin() + static_cast<std::ptrdiff_t>(i),
               "metric '", names_[i], "' is named twice");
  }
  DKIT_CHECK(is_available(device_), "metrics device '", device_.str(),
             "' is not available; available devices: ", available_devices());
  const auto k = static_cast<int64_t>(names_.size());
  buffer_ = at::zeros({capacity_, k}, at::TensorOptions().dtype(at::kFloat).device(device_));
  rows_.reserve(static_cast<size_t>(capacity_));
  for (int64_t r = 0; r < capacity_; ++r) {
    rows_.push_back(buffer_.select(0, r));
  }
#if DKIT_WITH_CUDA
  if (device_.is_cuda()) {
    host_ = at::empty({capacity_, k}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  }
#endif
}

void MetricBuffer::add(std::initializer_list<at::Tensor> values) {
  add_row(values.begin(), values.size());
}

void MetricBuffer::add(const std::vector<at::Tensor>& values) {
  add_row(values.data(), values.size());
}

void MetricBuffer::add_row(const at::Tensor* values, size_t count) {
  TORCH_CHECK(count == names_.size(), "MetricBuffer::add: expected ", names_.size(), " values (", join(names_),
              "), got ", count);
  TORCH_CHECK(size_ < capacity_, "MetricBuffer is full (", capacity_, " rows): flush() it first");
  for (size_t i = 0; i < count; ++i) {
    TORCH_CHECK(values[i].defined() && values[i].dim() == 0, "metric '", names_[i],
                "' must be a 0-d tensor, got ", values[i].defined() ? values[i].sizes() : at::IntArrayRef());
    TORCH_CHECK(values[i].device() == device_, "metric '", names_[i], "' is on ", values[i].device().str(),
                ", the MetricBuffer on ", device_.str());
  }
  if (device_.is_cpu()) {
    float* row = buffer_.data_ptr<float>() + size_ * static_cast<int64_t>(count);
    for (size_t i = 0; i < count; ++i) {
      row[i] = host_scalar(values[i]);
    }
  } else {
    at::NoGradGuard no_grad;
    at::stack_out(rows_[static_cast<size_t>(size_)], at::TensorList(values, count));
  }
  ++size_;
}

MetricRows MetricBuffer::flush() {
  MetricRows out;
  out.names = names_;
  const auto k = static_cast<int64_t>(names_.size());
  if (size_ == 0) {
    out.values = at::empty({0, k}, at::TensorOptions().dtype(at::kFloat));
    return out;
  }
  const at::Tensor filled = buffer_.narrow(0, 0, size_);
  if (host_.defined()) {
    at::Tensor staging = host_.narrow(0, 0, size_);
    staging.copy_(filled);
    out.values = staging.clone();
  } else {
    out.values = filled.to(at::kCPU).clone();
  }
  note_host_sync();
  size_ = 0;
  return out;
}

AverageMeter::AverageMeter(const Device& device) : total_(zeros_on(with_index(device), at::kDouble)) {}

void AverageMeter::add(const at::Tensor& value, int64_t count) {
  TORCH_CHECK(value.defined() && value.dim() == 0, "AverageMeter::add needs a 0-d tensor");
  at::NoGradGuard no_grad;
  total_.add_(value, count);
  count_ += count;
}

double AverageMeter::value() const {
  if (count_ == 0) {
    return kNaN;
  }
  note_host_sync();
  return total_.item<double>() / static_cast<double>(count_);
}

void AverageMeter::reset() {
  total_.zero_();
  count_ = 0;
}

AccuracyMeter::AccuracyMeter(const Device& device) : correct_(zeros_on(with_index(device), at::kLong)) {}

void AccuracyMeter::add(const at::Tensor& logits, const at::Tensor& labels) {
  TORCH_CHECK(logits.dim() == 2 && labels.dim() == 1 && logits.size(0) == labels.size(0),
              "AccuracyMeter::add needs logits [N, C] and labels [N], got ", logits.sizes(), " and ",
              labels.sizes());
  at::NoGradGuard no_grad;
  correct_.add_(logits.argmax(1).eq(labels).sum());
  count_ += labels.size(0);
}

double AccuracyMeter::value() const {
  if (count_ == 0) {
    return kNaN;
  }
  note_host_sync();
  return static_cast<double>(correct_.item<int64_t>()) / static_cast<double>(count_);
}

void AccuracyMeter::reset() {
  correct_.zero_();
  count_ = 0;
}

#if DKIT_WITH_CUDA
ScopedSyncCheck::ScopedSyncCheck(bool error)
    : previous_(static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode())) {
  c10::cuda::warning_state().set_sync_debug_mode(error ? c10::cuda::SyncDebugMode::L_ERROR
                                                       : c10::cuda::SyncDebugMode::L_WARN);
}

ScopedSyncCheck::~ScopedSyncCheck() {
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(previous_));
}
#endif

} // namespace dkit
