#pragma once

#include <cstdint>
#include <string>

namespace dkit::detail {

/// What the training loop does after a step, besides what a stop request adds (a flush and a save).
struct StepPlan {
  /// Flush the metrics window now. In a multi-process run this is the one collective that also carries stop
  /// requests, so every rank flushes at the same steps.
  bool flush = false;
  /// Check for a stop request now, without a collective (a single process checks after every step).
  bool poll_stop = false;
  /// Write a checkpoint now (after a final flush).
  bool save = false;
  /// The run's last step.
  bool last = false;
};

/// When a run flushes, saves and ends: after every `checkpoint_every` steps (0: only at the end), at the run's
/// last step, and at a stop request.
class CheckpointPolicy {
 public:
  /// A policy for a run that ends at `total_steps`; `collective` for a multi-process run.
  CheckpointPolicy(int64_t checkpoint_every, int64_t total_steps, bool collective)
      : checkpoint_every_(checkpoint_every), total_steps_(total_steps), collective_(collective) {}

  /// The plan after `step` (counted from the run's very start); `metrics_full` when the metrics window is full.
  StepPlan after_step(int64_t step, bool metrics_full) const;

 private:
  int64_t checkpoint_every_;
  int64_t total_steps_;
  bool collective_;
};

/// A checkpoint's position in its epoch, and the global batches of the run that wrote it and of the one resuming.
struct BatchPosition {
  /// The epoch it stopped in, from 0.
  int64_t epoch = 0;
  /// Global batches it did in that epoch.
  int64_t epoch_step = 0;
  /// `train.batch_size` of the run that wrote it.
  int64_t saved_batch_size = 0;
  /// Processes of the run that wrote it.
  int64_t saved_world_size = 1;
  /// `train.batch_size` of the resuming run.
  int64_t batch_size = 0;
  /// Processes of the resuming run.
  int64_t world_size = 1;
};

/// The batch of its epoch at which a resumed run continues: `position.epoch_step` when the global batch is
/// unchanged, else the batch after the same number of samples. An error naming `source` when that number is no
/// whole number of the new global batches.
int64_t resumed_epoch_step(const BatchPosition& position, const std::string& source);

} // namespace dkit::detail
