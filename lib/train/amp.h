#pragma once

#include <dkit/checkpoint/pickle_value.h>
#include <dkit/core/enum_names.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::optim {
class Optimizer;
} // namespace torch::optim

namespace dkit {

/// The precision a run trains in (`train.precision`).
enum class Precision {
  /// float32 throughout.
  kFloat32,
  /// The forward pass under autocast to bfloat16; parameters, gradients and optimizer state stay float32.
  kBFloat16,
  /// The forward pass under autocast to float16, the loss scaled by a GradScaler.
  kFloat16,
};

/// The name of each Precision, as `train.precision` spells it.
inline constexpr EnumNames<Precision, 3> kPrecisionNames = {{
    {Precision::kFloat32, "fp32"},
    {Precision::kBFloat16, "bf16"},
    {Precision::kFloat16, "fp16"},
}};

/// The name kPrecisionNames gives `precision`.
inline std::string to_string(Precision precision) {
  return std::string(name_of(kPrecisionNames, precision));
}

/// The dtype autocast runs in for `precision`: bfloat16, float16, or float32 for kFloat32 (no autocast).
c10::ScalarType autocast_dtype_of(Precision precision);

/// Throws the error AutocastGuard's constructor would for autocast on `device_type` in `dtype`: a device type
/// other than the CPU and CUDA, a dtype other than bfloat16 and float16, float16 on the CPU before LibTorch 2.2.
void check_autocast(c10::DeviceType device_type, c10::ScalarType dtype);

/// What an AutocastGuard turns on: `torch.autocast`'s arguments.
struct AutocastOptions {
  /// Autocast on `device_type` (kCPU or kCUDA).
  /* implicit */ AutocastOptions(c10::DeviceType device_type) : device_type_(device_type) {}

  /// The device type whose autocast state the guard sets: kCPU or kCUDA.
  TORCH_ARG(c10::DeviceType, device_type);
  /// The dtype eligible ops run in: bfloat16 or float16. Unset, the thread's current one for the device type
  /// (LibTorch's default: bfloat16 on the CPU, float16 on CUDA), as Python's `dtype=None`.
  TORCH_ARG(std::optional<c10::ScalarType>, dtype) = std::nullopt;
  /// Whether autocast is on inside the guard; false makes a region that runs in full precision inside an
  /// autocast one.
  TORCH_ARG(bool, enabled) = true;
  /// Whether autocast keeps the lower-precision copies of leaf tensors (the weights) until the outermost guard
  /// ends. Unset, the thread's current setting (on by default), as Python's `cache_enabled=None`.
  TORCH_ARG(std::optional<bool>, cache_enabled) = std::nullopt;
};

/// Runs the ops of its scope under autocast, as Python's `with torch.autocast(device_type, dtype):`. The
/// constructor saves the thread's autocast state for the device type (on/off, dtype, weight cache), sets the
/// options' and counts one more nesting level; the destructor counts it down, clears the weight cache when the
/// outermost guard ends, and restores the saved state. Guards nest; like Python's, the state is thread-local.
class AutocastGuard {
 public:
  /// Autocast as `options` say. An error names what is not supported: a device type other than the CPU and CUDA,
  /// a dtype other than bfloat16 and float16, float16 on the CPU of a LibTorch older than 2.2.
  explicit AutocastGuard(AutocastOptions options);
  /// Autocast on `device_type` in `dtype`.
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype);
  /// Ends the region and restores the state the constructor found.
  ~AutocastGuard();

  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  AutocastGuard(AutocastGuard&&) = delete;
  AutocastGuard& operator=(AutocastGuard&&) = delete;

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
  bool previous_cache_enabled_;
};

/// Whether autocast is on for `device_type` (kCPU or kCUDA) in this thread.
bool is_autocast_enabled(c10::DeviceType device_type);

/// The dtype autocast runs eligible ops in on `device_type` (kCPU or kCUDA) in this thread.
c10::ScalarType autocast_dtype(c10::DeviceType device_type);

/// A GradScaler's settings; the defaults are PyTorch's.
struct GradScalerOptions {
  /// The scale before the first update.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// What the scale is multiplied by after `growth_interval` steps in a row without inf or NaN gradients (> 1).
  TORCH_ARG(double, growth_factor) = 2.0;
  /// What the scale is multiplied by after a step with inf or NaN gradients (< 1).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// The number of steps in a row without inf or NaN gradients after which the scale grows.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// Whether the scaler scales at all; when false, step() only steps and the rest does nothing.
  TORCH_ARG(bool, enabled) = true;
};

/// Gradient scaling for float16 training, with the semantics of Python's `torch.amp.GradScaler`: scale() the
/// loss before backward, step() unscales the optimizer's gradients (or unscale_() does, earlier, to clip them) and
/// steps it unless a gradient holds an inf or NaN, update() then backs the scale off after such a step or grows it
/// after `growth_interval` clean ones. The scale and growth tracker live on the device of the first tensor scaled,
/// and nothing reads them back to the host but step() (whether to step), get_scale(), growth_tracker() and
/// state_dict(). Uses ATen's `_amp_*` kernels where the build has them for the device (CUDA; the CPU from
/// LibTorch 2.3), the same arithmetic in plain tensor operations otherwise, with bitwise the same results.
class GradScaler {
 public:
  /// A scaler with `options`; an error when growth_factor <= 1 or backoff_factor >= 1.
  explicit GradScaler(GradScalerOptions options = {});

  /// `outputs` times the scale (unchanged when disabled). The first call puts the scale on `outputs`' device.
  at::Tensor scale(const at::Tensor& outputs);
  /// Each of `outputs` times the scale.
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  /// Divides `optimizer`'s gradients by the scale in place and records, per device, whether any is inf or NaN.
  /// Once per optimizer between updates, before step(); an error otherwise, and for float16 gradients.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Unscales `optimizer`'s gradients unless unscale_() did, then calls `optimizer.step()` unless one of them held
  /// an inf or NaN. Returns whether it stepped. Once per optimizer between updates.
  bool step(torch::optim::Optimizer& optimizer);

  /// Backs the scale off if a step since the last update found an inf or NaN, grows it after `growth_interval`
  /// clean updates in a row, and makes every optimizer ready for the next iteration.
  void update();
  /// Sets the scale to `new_scale` instead (the growth tracker stays), and makes every optimizer ready.
  void update(double new_scale);

  /// The current scale (a host read), init_scale before the first scale(), 1 when disabled.
  double get_scale() const;
  /// The number of updates in a row without inf or NaN gradients since the scale last changed (a host read).
  int64_t growth_tracker() const;
  /// The scale's growth factor.
  double growth_factor() const {
    return options_.growth_factor();
  }
  /// Sets the scale's growth factor.
  void set_growth_factor(double factor) {
    options_.growth_factor(factor);
  }
  /// The scale's backoff factor.
  double backoff_factor() const {
    return options_.backoff_factor();
  }
  /// Sets the scale's backoff factor.
  void set_backoff_factor(double factor) {
    options_.backoff_factor(factor);
  }
  /// The growth interval.
  int64_t growth_interval() const {
    return options_.growth_interval();
  }
  /// Sets the growth interval.
  void set_growth_interval(int64_t interval) {
    options_.growth_interval(interval);
  }
  /// Whether the scaler scales.
  bool is_enabled() const {
    return options_.enabled();
  }

  /// The state in the layout of Python's `GradScaler.state_dict()`: a dict of "scale", "growth_factor",
  /// "backoff_factor" (floats), "growth_interval" and "_growth_tracker" (ints); empty when disabled. Take it after
  /// update().
  PickleValue state_dict() const;
  /// Restores a state_dict() (dkit's or Python's); does nothing when disabled. An error names a missing or
  /// mistyped key, or says the dict is empty (saved from a disabled scaler).
  void load_state_dict(const PickleValue& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptimizerState {
    const torch::optim::Optimizer* optimizer = nullptr;
    Stage stage = Stage::kReady;
    std::vector<std::pair<c10::Device, at::Tensor>> found_inf_per_device;
  };

  void check_initialized(const char* function) const;
  void lazy_init(const c10::Device& device);
  OptimizerState& state_of(const torch::optim::Optimizer& optimizer);

  GradScalerOptions options_;
  int64_t init_growth_tracker_ = 0;
  at::Tensor scale_;
  at::Tensor growth_tracker_;
  std::vector<OptimizerState> per_optimizer_states_;
};

} // namespace dkit
