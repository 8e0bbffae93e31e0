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

/// Runs `first` and `second` at once on two of LibTorch's intra-op threads, each of LibTorch's operations in them
/// on its one thread; then both threads share `ready`'s updates of `step` and, once both tasks have finished,
/// `after`'s. Where there is one thread (LibTorch's intra-op threads are 1, dkit was built without OpenMP, or the
/// call is inside a parallel region) it runs the same in that order. Returns when everything has run; rethrows
/// what a task threw.
void run_side_by_side(const std::function<void()>& first, const std::function<void()>& second, const FusedStep& step,
                      const std::vector<UpdateBlock>& ready, const std::vector<UpdateBlock>& after);

} // namespace dkit::detail
