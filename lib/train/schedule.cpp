#include <dkit/train/schedule.h>

#include <dkit/core/error.h>

#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>

namespace dkit {

double warmup_schedule_factor(const WarmupScheduleOptions& options, int64_t step) {
  if (step < options.warmup_steps()) {
    return static_cast<double>(step) / static_cast<double>(options.warmup_steps());
  }
  const int64_t after = step - options.warmup_steps();
  switch (options.decay()) {
    case LrDecay::kConstant:
      return 1.0;
    case LrDecay::kCosine: {
      const int64_t span = std::max<int64_t>(1, options.total_steps() - options.warmup_steps());
      const double progress = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
      return options.min_factor() + (1.0 - options.min_factor()) * 0.5 * (1.0 + std::cos(M_PI * progress));
    }
    case LrDecay::kStep:
      return std::pow(options.gamma(), static_cast<double>(after / options.step_size()));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled LrDecay ", static_cast<int>(options.decay()));
}

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, WarmupScheduleOptions options)
    : LRScheduler(optimizer), options_(options) {
  DKIT_CHECK(options_.warmup_steps() >= 0, "WarmupScheduleOptions::warmup_steps must be at least 0, got ",
             options_.warmup_steps());
  DKIT_CHECK(options_.decay() != LrDecay::kCosine || options_.total_steps() >= 1,
             "WarmupScheduleOptions::total_steps must be at least 1 for a cosine decay, got ", options_.total_steps());
  DKIT_CHECK(options_.step_size() >= 1, "WarmupScheduleOptions::step_size must be at least 1, got ",
             options_.step_size());
  DKIT_CHECK(options_.min_factor() >= 0.0 && options_.min_factor() <= 1.0,
             "WarmupScheduleOptions::min_factor must be in [0, 1], got ", options_.min_factor());
  const double factor = warmup_schedule_factor(options_, 0);
  for (auto& group : optimizer.param_groups()) {
    base_lrs_.push_back(group.options().get_lr());
    group.options().set_lr(base_lrs_.back() * factor);
  }
}

std::vector<double> WarmupLR::get_lrs() {
  const double factor = warmup_schedule_factor(options_, static_cast<int64_t>(step_count_) + 1);
  std::vector<double> lrs;
  lrs.reserve(base_lrs_.size());
  for (const double base : base_lrs_) {
    lrs.push_back(base * factor);
  }
  return lrs;
}

} // namespace dkit
