#pragma once

#include <dkit/core/enum_names.h>

#include <torch/arg.h>
#include <torch/optim/schedulers/lr_scheduler.h>

#include <cstdint>
#include <vector>

namespace dkit {

/// How the learning rate falls after the warm-up.
enum class LrDecay {
  /// It stays at the optimizer's learning rate.
  kConstant,
  /// Half a cosine from the learning rate down to `min_factor` times it, over the steps after the warm-up.
  kCosine,
  /// Multiplied by `gamma` every `step_size` steps after the warm-up, as `torch.optim.lr_scheduler.StepLR`.
  kStep,
};

/// The name of each LrDecay (`train.lr_schedule`).
inline constexpr EnumNames<LrDecay, 3> kLrDecayNames = {{
    {LrDecay::kConstant, "constant"},
    {LrDecay::kCosine, "cosine"},
    {LrDecay::kStep, "step"},
}};

/// A learning-rate schedule counted in optimizer steps: a linear warm-up from 0, then a decay.
struct WarmupScheduleOptions {
  /// A schedule over `total_steps` optimizer steps.
  explicit WarmupScheduleOptions(int64_t total_steps = 0) : total_steps_(total_steps) {}

  /// The run's optimizer steps; the cosine reaches its floor there. 0 in warmup_scheduler(): the run's.
  TORCH_ARG(int64_t, total_steps);
  /// Steps of the linear warm-up: the factor is `step / warmup_steps` before it ends.
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// What follows the warm-up.
  TORCH_ARG(LrDecay, decay) = LrDecay::kCosine;
  /// The cosine's floor, as a fraction of the learning rate.
  TORCH_ARG(double, min_factor) = 0.0;
  /// Steps between two decays of kStep.
  TORCH_ARG(int64_t, step_size) = 1000;
  /// The factor of each decay of kStep.
  TORCH_ARG(double, gamma) = 0.1;
};

/// The factor of the learning rate at optimizer step `step` (from 0): the function a Python user gives
/// `torch.optim.lr_scheduler.LambdaLR` for the same schedule.
double warmup_schedule_factor(const WarmupScheduleOptions& options, int64_t step);

/// A LibTorch scheduler of warmup_schedule_factor(): each parameter group's learning rate is its initial one times
/// the factor, set when it is made (step 0) and at each step(), as `LambdaLR` does. Step it after each optimizer
/// step (SchedulerInterval::kStep). Example:
/// ```
/// dkit::WarmupLR schedule(optimizer, dkit::WarmupScheduleOptions(10000).warmup_steps(500));
/// ```
class WarmupLR : public torch::optim::LRScheduler {
 public:
  /// Schedules `optimizer`'s learning rates from their current values.
  WarmupLR(torch::optim::Optimizer& optimizer, WarmupScheduleOptions options);

  /// The options it was made with.
  const WarmupScheduleOptions& options() const {
    return options_;
  }

 private:
  std::vector<double> get_lrs() override;

  WarmupScheduleOptions options_;
  std::vector<double> base_lrs_;
};

} // namespace dkit
