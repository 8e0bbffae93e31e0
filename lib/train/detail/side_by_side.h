#pragma once

// Internal to dkit (TrainStep's backward pass beside the fused optimizers' updates); not one of the installed
// headers.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace dkit {
class FusedStep;
} // namespace dkit

namespace dkit::detail {

/// Elements [begin, end) of the parameter at `index` of a FusedStep.
struct UpdateBlock {
  size_t index;
  int64_t begin;
  int64_t end;
};

/// Appends the update of `step`'s parameter at `index` to `blocks`, cut into blocks small enough to share
/// between threads.
void append_update_blocks(const FusedStep& step, size_t index, std::vector<UpdateBlock>& blocks);

/// One stage of a side-by-side run: two tasks at once, then the updates both threads share.
struct SidePhase {
  /// The task of one thread (none when empty).
  std::function<void()> first;
  /// The task of the other thread (none when empty).
  std::function<void()> second;
  /// Updates the threads share as soon as each has finished its task.
  std::vector<UpdateBlock> ready;
  /// Updates the threads share once both tasks have finished.
  std::vector<UpdateBlock> after;
};

/// Runs `phases` in order in one parallel region on two of LibTorch's intra-op threads: in each phase, `first` on
/// one thread and `second` on the other, each of LibTorch's operations in them on its one thread, then both
/// threads share `ready`'s updates of `step` and, once both tasks have finished, `after`'s. A phase begins when
/// all of the one before has run, so its tasks may read what the other thread wrote there. Where there is one
/// thread (LibTorch's intra-op threads are 1, dkit was built without OpenMP, or the call is inside a parallel
/// region) it runs the same in that order. Returns when everything has run; rethrows what a task threw.
void run_side_by_side(const std::vector<SidePhase>& phases, const FusedStep& step);

} // namespace dkit::detail
