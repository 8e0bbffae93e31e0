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

/// How many elements of a parameter one update block holds: FusedStep::run() and append_update_blocks() cut
/// parameters alike.
inline constexpr int64_t kUpdateBlock = 8192;

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
  /// Whether the tasks run outside the parallel region instead, `first` then `second` on the calling thread, each
  /// of LibTorch's operations in them on all of LibTorch's intra-op threads (as outside any run); the threads then
  /// share the phase's updates before the next phase begins.
  bool outside = false;
};

/// Runs `phases` in order in one parallel region on two of LibTorch's intra-op threads: in each phase, `first` on
/// one thread and `second` on the other, each of LibTorch's operations in them on its one thread, then both
/// threads share `ready`'s updates of `step` and, once both tasks have finished, `after`'s. A phase begins when
/// all of the one before has run, so its tasks may read what the other thread wrote there. A phase marked
/// `outside` ends the region, runs its tasks on the calling thread, and the run goes on in a new region. Where
/// there is one thread (LibTorch's intra-op threads are 1, dkit was built without OpenMP, or the call is inside a
/// parallel region) it runs the same in that order. Returns when everything has run; rethrows what a task threw.
void run_side_by_side(const std::vector<SidePhase>& phases, const FusedStep& step);

/// An operation of the written-out backward pass that TrainStep may take off LibTorch's intra-op threads, on
/// row-major float32 operands: `c[m×n] = a[m×k]·b[k×n]` (a layer's input gradient), `c[m×n] = aᵀ·b` with `a`
/// row-major `[k×m]` (a weight gradient), or `c[n] = ` the column sums of `a[k×n]` (a bias gradient; `m` is 1).
enum class BackwardOp { kProduct, kTransposedProduct, kColumnSums };

/// Where a side-by-side run computes a BackwardOp: whole on one thread, or each half of the output's rows on
/// one of two threads.
enum class OpSplit { kOneThread, kRowHalves };

/// Whether `op` of these sizes, computed inside a parallel region as `split` says, gives the same bits as outside
/// one, where LibTorch's operation may use every intra-op thread (as the textbook step's does). It need not: a BLAS
/// may tile a product on one thread differently from how it shares it between threads (OpenBLAS 0.3.21's Haswell
/// kernels do, its SkylakeX kernels do not). Found once per process for each argument set and thread count, by
/// computing `op` both ways on random operands (from a generator of its own; at least 4,096 output elements, or 256
/// draws of them): the order of a BLAS's sums depends on the sizes, not on the values.
bool splits_bitwise(BackwardOp op, OpSplit split, int64_t m, int64_t k, int64_t n);

/// How many of splits_bitwise()'s probes this process has run (each argument set and thread count once).
int64_t split_probes_run();

} // namespace dkit::detail
