#include <dkit/train/amp.h>

#include <dkit/core/compat.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/device/host_sync.h>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <algorithm>
#include <string>

namespace dkit {
namespace {

bool scaler_kernels_on(const c10::Device& device) {
  return device.is_cuda() || (device.is_cpu() && compat::kAmpScalerKernelsOnCpu);
}

void unscale_with_tensor_ops(const std::vector<at::Tensor>& grads, at::Tensor& found_inf,
                             const at::Tensor& inv_scale) {
  for (const auto& grad : grads) {
    found_inf.masked_fill_(at::isfinite(grad).logical_not().any(), 1.0);
    if (grad.scalar_type() == c10::kBFloat16 || grad.scalar_type() == c10::kHalf) {
      grad.copy_(grad.to(c10::kFloat).mul_(inv_scale));
    } else {
      grad.mul_(inv_scale);
    }
  }
}

void update_scale_with_tensor_ops(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                                  double growth_factor, double backoff_factor, int64_t growth_interval) {
  const auto found = found_inf.ne(0);
  const auto successful = growth_tracker.add(1);
  const auto grows = successful.eq(growth_interval);
  const auto backed_off = scale.to(c10::kDouble).mul(backoff_factor).to(c10::kFloat);
  auto grown = scale.to(c10::kDouble).mul(growth_factor).to(c10::kFloat);
  grown = at::where(at::isfinite(grown), grown, scale);
  scale.copy_(at::where(found, backed_off, at::where(grows, grown, scale)));
  growth_tracker.copy_(at::where(found.logical_or(grows), at::zeros_like(successful), successful));
}

const PickleValue& required_key(const PickleValue& state, const char* key) {
  const PickleValue* value = state.find(key);
  DKIT_CHECK(value != nullptr, "GradScaler state dict has no key '", key, "'");
  return *value;
}

} // namespace

c10::ScalarType autocast_dtype_of(Precision precision) {
  switch (precision) {
    case Precision::kFloat32:
      return c10::kFloat;
    case Precision::kBFloat16:
      return c10::kBFloat16;
    case Precision::kFloat16:
      return c10::kHalf;
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled Precision ", static_cast<int>(precision));
}

void check_autocast(c10::DeviceType device_type, c10::ScalarType dtype) {
  DKIT_CHECK(device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA,
             "autocast supports the cpu and cuda, not ", c10::DeviceTypeName(device_type, true));
  DKIT_CHECK(dtype == c10::kBFloat16 || dtype == c10::kHalf, "autocast on ", c10::DeviceTypeName(device_type, true),
             " supports bfloat16 and float16, not ", dtype_name(dtype));
  DKIT_CHECK(device_type != c10::DeviceType::CPU || dtype != c10::kHalf || compat::kCpuAutocastFloat16,
             "autocast in float16 on the cpu needs LibTorch 2.2 or later (this is ", TORCH_VERSION,
             "): use bfloat16 on the cpu");
}

AutocastGuard::AutocastGuard(AutocastOptions options) : device_type_(options.device_type()) {
  DKIT_CHECK(device_type_ == c10::DeviceType::CPU || device_type_ == c10::DeviceType::CUDA,
             "autocast supports the cpu and cuda, not ", c10::DeviceTypeName(device_type_, true));
  const c10::ScalarType dtype = options.dtype().value_or(compat::autocast_dtype(device_type_));
  if (options.enabled()) {
    check_autocast(device_type_, dtype);
  }
  const bool cache_enabled = options.cache_enabled().value_or(at::autocast::is_autocast_cache_enabled());
  previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  previous_enabled_ = compat::autocast_enabled(device_type_);
  previous_dtype_ = compat::autocast_dtype(device_type_);
  compat::set_autocast_enabled(device_type_, options.enabled());
  compat::set_autocast_dtype(device_type_, dtype);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(cache_enabled);
}

AutocastGuard::AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype)
    : AutocastGuard(AutocastOptions(device_type).dtype(dtype)) {}

AutocastGuard::~AutocastGuard() {
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  compat::set_autocast_enabled(device_type_, previous_enabled_);
  compat::set_autocast_dtype(device_type_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}

bool is_autocast_enabled(c10::DeviceType device_type) {
  return compat::autocast_enabled(device_type);
}

c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
  return compat::autocast_dtype(device_type);
}

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  if (!options_.enabled()) {
    return;
  }
  DKIT_CHECK(options_.growth_factor() > 1.0, "GradScaler: the growth factor must be > 1.0, got ",
             format_number(options_.growth_factor()));
  DKIT_CHECK(options_.backoff_factor() < 1.0, "GradScaler: the backoff factor must be < 1.0, got ",
             format_number(options_.backoff_factor()));
}

void GradScaler::check_initialized(const char* function) const {
  DKIT_CHECK(scale_.defined(), "GradScaler: ", function,
             " called before scale(): scale the loss (or outputs) earlier in the iteration");
}

void GradScaler::lazy_init(const c10::Device& device) {
  scale_ = at::full({}, options_.init_scale(), at::TensorOptions().dtype(c10::kFloat).device(device));
  growth_tracker_ = at::full({}, init_growth_tracker_, at::TensorOptions().dtype(c10::kInt).device(device));
}

GradScaler::OptimizerState& GradScaler::state_of(const torch::optim::Optimizer& optimizer) {
  for (auto& state : per_optimizer_states_) {
    if (state.optimizer == &optimizer) {
      return state;
    }
  }
  per_optimizer_states_.push_back(OptimizerState{&optimizer, Stage::kReady, {}});
  return per_optimizer_states_.back();
}

at::Tensor GradScaler::scale(const at::Tensor& outputs) {
  if (!options_.enabled()) {
    return outputs;
  }
  if (!scale_.defined()) {
    lazy_init(outputs.device());
  }
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const auto& output : outputs) {
    scaled.push_back(scale(output));
  }
  return scaled;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    return;
  }
  check_initialized("unscale_()");
  OptimizerState& state = state_of(optimizer);
  DKIT_CHECK(state.stage != Stage::kUnscaled,
             "GradScaler: unscale_() has already been called on this optimizer since the last update().");
  DKIT_CHECK(state.stage != Stage::kStepped, "GradScaler: unscale_() is being called after step().");

  const at::Tensor inv_scale = scale_.to(c10::kDouble).reciprocal().to(c10::kFloat);
  const at::Tensor found_inf = at::full({}, 0.0, at::TensorOptions().dtype(c10::kFloat).device(scale_.device()));

  struct Bucket {
    c10::Device device;
    c10::ScalarType dtype;
    std::vector<at::Tensor> grads;
  };
  std::vector<Bucket> buckets;
  at::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      if (!param.grad().defined()) {
        continue;
      }
      DKIT_CHECK(param.grad().scalar_type() != c10::kHalf, "GradScaler: Attempting to unscale FP16 gradients.");
      const at::Tensor to_unscale = param.grad().is_sparse() ? param.grad()._values() : param.grad();
      auto bucket = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
        return b.device == to_unscale.device() && b.dtype == to_unscale.scalar_type();
      });
      if (bucket == buckets.end()) {
        buckets.push_back(Bucket{to_unscale.device(), to_unscale.scalar_type(), {}});
        bucket = buckets.end() - 1;
      }
      bucket->grads.push_back(to_unscale);
    }
  }

  std::vector<std::pair<c10::Device, at::Tensor>> per_device_found_inf;
  std::vector<std::pair<c10::Device, at::Tensor>> per_device_inv_scale;
  const auto on_device = [](std::vector<std::pair<c10::Device, at::Tensor>>& copies, const at::Tensor& master,
                            const c10::Device& device) -> at::Tensor& {
    for (auto& [copy_device, copy] : copies) {
      if (copy_device == device) {
        return copy;
      }
    }
    copies.emplace_back(device, master.to(device, /*non_blocking=*/true, /*copy=*/true));
    return copies.back().second;
  };
  for (auto& bucket : buckets) {
    at::Tensor& device_found_inf = on_device(per_device_found_inf, found_inf, bucket.device);
    const at::Tensor& device_inv_scale = on_device(per_device_inv_scale, inv_scale, bucket.device);
    if (scaler_kernels_on(bucket.device)) {
      at::_amp_foreach_non_finite_check_and_unscale_(bucket.grads, device_found_inf, device_inv_scale);
    } else {
      unscale_with_tensor_ops(bucket.grads, device_found_inf, device_inv_scale);
    }
  }
  state.found_inf_per_device = std::move(per_device_found_inf);
  state.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  check_initialized("step()");
  DKIT_CHECK(state_of(optimizer).stage != Stage::kStepped,
             "GradScaler: step() has already been called since the last update().");
  if (state_of(optimizer).stage == Stage::kReady) {
    unscale_(optimizer);
  }
  OptimizerState& state = state_of(optimizer);
  DKIT_CHECK(!state.found_inf_per_device.empty(), "GradScaler: No inf checks were recorded for this optimizer.");
  double found = 0.0;
  for (const auto& [device, found_inf] : state.found_inf_per_device) {
    found += found_inf.item<double>();
    note_host_sync();
  }
  const bool steps = found == 0.0;
  if (steps) {
    optimizer.step();
  }
  state.stage = Stage::kStepped;
  return steps;
}

void GradScaler::update() {
  if (!options_.enabled()) {
    return;
  }
  check_initialized("update()");
  std::vector<at::Tensor> found_infs;
  for (const auto& state : per_optimizer_states_) {
    for (const auto& [device, found_inf] : state.found_inf_per_device) {
      found_infs.push_back(found_inf.to(scale_.device(), /*non_blocking=*/true));
    }
  }
  DKIT_CHECK(!found_infs.empty(), "GradScaler: No inf checks were recorded prior to update().");
  at::Tensor found_inf_combined = found_infs.front();
  for (size_t i = 1; i < found_infs.size(); ++i) {
    found_inf_combined += found_infs[i];
  }
  if (scaler_kernels_on(scale_.device())) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_combined, options_.growth_factor(),
                           options_.backoff_factor(), options_.growth_interval());
  } else {
    update_scale_with_tensor_ops(scale_, growth_tracker_, found_inf_combined, options_.growth_factor(),
                                 options_.backoff_factor(), options_.growth_interval());
  }
  per_optimizer_states_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled()) {
    return;
  }
  check_initialized("update()");
  scale_.fill_(new_scale);
  per_optimizer_states_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) {
    return 1.0;
  }
  if (!scale_.defined()) {
    return options_.init_scale();
  }
  note_host_sync();
  return scale_.item<double>();
}

int64_t GradScaler::growth_tracker() const {
  if (!options_.enabled()) {
    return 0;
  }
  if (!growth_tracker_.defined()) {
    return init_growth_tracker_;
  }
  note_host_sync();
  return growth_tracker_.item<int64_t>();
}

PickleValue GradScaler::state_dict() const {
  if (!options_.enabled()) {
    return PickleValue::dict();
  }
  return PickleValue::dict({{"scale", get_scale()},
                            {"growth_factor", options_.growth_factor()},
                            {"backoff_factor", options_.backoff_factor()},
                            {"growth_interval", options_.growth_interval()},
                            {"_growth_tracker", growth_tracker()}});
}

void GradScaler::load_state_dict(const PickleValue& state) {
  if (!options_.enabled()) {
    return;
  }
  DKIT_CHECK(state.is_dict(), "GradScaler state dict must be a dict, got ", state.type_name());
  DKIT_CHECK(!state.entries().empty(),
             "GradScaler state dict is empty, possibly because it was saved from a disabled GradScaler");
  const auto number = [&](const char* key) {
    const PickleValue& value = required_key(state, key);
    DKIT_CHECK(value.is_double() || value.is_int(), "GradScaler state dict key '", key, "' must be a float, got ",
               value.type_name());
    return value.to_double();
  };
  const auto integer = [&](const char* key) {
    const PickleValue& value = required_key(state, key);
    DKIT_CHECK(value.is_int(), "GradScaler state dict key '", key, "' must be an int, got ", value.type_name());
    return value.to_int();
  };
  const double scale = number("scale");
  const double growth_factor = number("growth_factor");
  const double backoff_factor = number("backoff_factor");
  const int64_t growth_interval = integer("growth_interval");
  const int64_t growth_tracker = integer("_growth_tracker");
  options_.init_scale(scale).growth_factor(growth_factor).backoff_factor(backoff_factor).growth_interval(
      growth_interval);
  init_growth_tracker_ = growth_tracker;
  if (scale_.defined()) {
    scale_.fill_(scale);
  }
  if (growth_tracker_.defined()) {
    growth_tracker_.fill_(growth_tracker);
  }
}

} // namespace dkit
