#include <dkit/train/detail/checkpoint_policy.h>

#include <dkit/core/error.h>

namespace dkit::detail {

StepPlan CheckpointPolicy::after_step(int64_t step, bool metrics_full) const {
  StepPlan plan;
  plan.last = step >= total_steps_;
  const bool due = checkpoint_every_ > 0 && step % checkpoint_every_ == 0;
  plan.save = plan.last || due;
  plan.flush = collective_ ? metrics_full || plan.save : metrics_full;
  plan.poll_stop = !collective_;
  return plan;
}

int64_t resumed_epoch_step(const BatchPosition& p, const std::string& source) {
  const int64_t saved_global = p.saved_batch_size * p.saved_world_size;
  const int64_t global = p.batch_size * p.world_size;
  if (saved_global == global || p.epoch_step == 0) {
    return p.epoch_step;
  }
  const int64_t samples_done = p.epoch_step * saved_global;
  DKIT_CHECK(samples_done % global == 0, "cannot resume from ", source, ": it stopped after ", p.epoch_step,
             " global batches of ", saved_global, " (", p.saved_world_size, " process(es) x train.batch_size ",
             p.saved_batch_size, ") in epoch ", p.epoch + 1, ", ", samples_done,
             " samples, which is no whole number of this run's global batches of ", global, " (", p.world_size,
             " process(es) x train.batch_size ", p.batch_size, "); resume with a global batch of ", saved_global);
  return samples_done / global;
}

} // namespace dkit::detail
