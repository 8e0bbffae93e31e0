#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace dkit {

class ProcessGroupContext;

/// How GradientReducer groups gradients into buckets.
struct GradientReducerOptions {
  /// Largest bucket, in bytes: PyTorch DDP's `bucket_cap_mb=25`.
  TORCH_ARG(int64_t, bucket_cap_bytes) = 25 * 1024 * 1024;
  /// Largest first bucket (the last layers, whose gradients backward produces first), smaller so that
  /// communication starts early: DDP's 1 MiB.
  TORCH_ARG(int64_t, first_bucket_cap_bytes) = 1024 * 1024;
};

/// Sums gradients over the ranks of a ProcessGroupContext as PyTorch's DistributedDataParallel does: the
/// parameters, in reverse order (the order backward produces their gradients), are packed into flat buckets;
/// a hook on each parameter copies its gradient into its bucket during backward, and a bucket's allreduce starts
/// as soon as its last gradient arrives, so that communication overlaps the rest of backward. Buckets start in
/// the same order on every rank. synchronize() waits for them and points each parameter's `.grad` at its slice of
/// the summed bucket. Example:
/// ```
/// dkit::GradientReducer reducer(model->parameters(), group);
/// (loss_sum / global_samples).backward();   // buckets start from the hooks
/// reducer.synchronize();                     // every .grad is the sum over the ranks
/// optimizer.step();
/// ```
/// The sum, not the mean: divide each rank's loss by the global batch's sample count, and the sum of the ranks'
/// gradients is the gradient of the mean over the global batch, exactly as one process with the whole batch gets
/// it (to float rounding). A rank with no samples in a short last batch still takes part, with zero gradients.
///
/// A gradient a parameter already holds when backward reaches it (accumulated over earlier batches, as with DDP's
/// `no_sync`) is summed along with the new one. The reducer does not make the ranks start from the same weights:
/// broadcast rank 0's parameters and buffers first (broadcast_module(); dkit::Trainer does).
class GradientReducer {
 public:
  /// Hooks `parameters` (all on the group's device) and sizes the buckets.
  GradientReducer(std::vector<at::Tensor> parameters, std::shared_ptr<ProcessGroupContext> group,
                  GradientReducerOptions options = {});
  /// Removes the hooks.
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// After backward(): starts the buckets whose parameters got no gradient in this pass (with the gradient they
  /// hold from earlier batches, or zeros), waits for every bucket, and sets each parameter's `.grad` to its slice of
  /// its summed bucket. A lost rank is a dkit::Error naming it (see ProcessGroupContext::wait()).
  void synchronize();

  /// The position of `parameter` in the constructor's list (the same tensor, not an equal one), or -1.
  int64_t index_of(const at::Tensor& parameter) const;

  /// Takes parameter `index`'s gradient from a backward pass that autograd does not run (dkit::TrainStep's
  /// written-out one) as the parameter's hook takes autograd's: copied into its bucket, whose allreduce starts as soon
  /// as the bucket is complete. Once per parameter and backward pass, before synchronize(); a second call adds to the
  /// first, as a second hook call does. The parameter's `.grad` may be defined (the written-out pass's buffer).
  void mark_ready(int64_t index, const at::Tensor& gradient);

  /// While false, backward's gradients stay on each rank, accumulating in `.grad` as without a reducer, and
  /// synchronize() must not be called: DDP's `no_sync`, for all but the last batch of an accumulation. True by default.
  void set_enabled(bool enabled);
  /// Whether the hooks hand gradients to the buckets (see set_enabled()).
  bool enabled() const;
  /// The parameter indices (positions in the constructor's list) in each bucket, in launch order.
  std::vector<std::vector<int64_t>> buckets() const;

  /// How many buckets the last backward started from its hooks, before synchronize(): all of them when every
  /// parameter got a gradient.
  int64_t buckets_started_in_backward() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace dkit
