#include <dkit/train/detail/side_by_side.h>

#include <dkit/train/optim.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace dkit::detail {

void append_update_blocks(const FusedStep& step, size_t index, std::vector<UpdateBlock>& blocks) {
  const int64_t numel = step.numel(index);
  for (int64_t begin = 0; begin < numel; begin += kUpdateBlock) {
    blocks.push_back({index, begin, std::min(numel, begin + kUpdateBlock)});
  }
}

namespace {

// Blocks [0, n) that two threads claim from opposite ends, the first from the front and the second from the back,
// so that from step to step each thread mostly updates the same blocks and finds their state in its own cache.
class TwoEndedBlocks {
 public:
  explicit TwoEndedBlocks(size_t n) : ends_(static_cast<uint64_t>(n) << 32) {}

  // The next block for thread `task` (0 or 1), or none when every block is claimed.
  std::optional<size_t> claim(int64_t task) {
    uint64_t ends = ends_.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t front = ends & 0xffffffffu;
      const uint64_t back = ends >> 32;
      if (front >= back) {
        return std::nullopt;
      }
      const uint64_t next = task == 0 ? ends + 1 : ends - (uint64_t{1} << 32);
      if (ends_.compare_exchange_weak(ends, next, std::memory_order_relaxed)) {
        return static_cast<size_t>(task == 0 ? front : back - 1);
      }
    }
  }

 private:
  std::atomic<uint64_t> ends_;
};

// Runs a phase's tasks, `first` then `second`, on the calling thread.
void run_tasks(const SidePhase& phase) {
  for (const std::function<void()>* work : {&phase.first, &phase.second}) {
    if (*work) {
      (*work)();
    }
  }
}

// The phases of one parallel region, none of them `outside`.
void run_region(const std::vector<const SidePhase*>& phases, const FusedStep& step) {
  if (phases.empty()) {
    return;
  }
  struct Progress {
    explicit Progress(const SidePhase& phase) : ready(phase.ready.size()), after(phase.after.size()) {}
    TwoEndedBlocks ready;
    TwoEndedBlocks after;
    std::atomic<size_t> done{0};
    std::atomic<int> finished{0};
  };
  std::vector<std::unique_ptr<Progress>> progress;
  progress.reserve(phases.size());
  for (const SidePhase* phase : phases) {
    progress.push_back(std::make_unique<Progress>(*phase));
  }
  std::atomic<bool> failed{false};
  const bool grad_mode = at::GradMode::is_enabled();
  const auto update = [&](const UpdateBlock& block) { step.update(block.index, block.begin, block.end); };
  const auto wait_until = [&](const auto& condition) {
    while (!condition()) {
      if (failed.load(std::memory_order_acquire)) {
        return false;
      }
      std::this_thread::yield();
    }
    return true;
  };
  const auto run_phases = [&](int64_t task) {
    for (size_t k = 0; k < phases.size(); ++k) {
      const SidePhase& phase = *phases[k];
      Progress& own = *progress[k];
      const size_t total = phase.ready.size() + phase.after.size();
      const auto both_finished = [&] { return own.finished.load(std::memory_order_acquire) == 2; };
      try {
        const std::function<void()>& work = task == 0 ? phase.first : phase.second;
        if (work) {
          work();
        }
        own.finished.fetch_add(1, std::memory_order_release);
        for (std::optional<size_t> b = own.ready.claim(task); b; b = own.ready.claim(task)) {
          update(phase.ready[*b]);
          own.done.fetch_add(1, std::memory_order_release);
        }
        if (!phase.after.empty() && !wait_until(both_finished)) {
          return;
        }
        for (std::optional<size_t> b = own.after.claim(task); b; b = own.after.claim(task)) {
          update(phase.after[*b]);
          own.done.fetch_add(1, std::memory_order_release);
        }
      } catch (...) {
        failed.store(true, std::memory_order_release);
        throw;
      }
      if (!wait_until([&] { return both_finished() && own.done.load(std::memory_order_acquire) == total; })) {
        return;
      }
    }
  };
  at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
    const at::AutoGradMode same_grad_mode(grad_mode);
    if (end - begin == 1) {
      run_phases(begin);
      return;
    }
    for (const SidePhase* phase : phases) {
      run_tasks(*phase);
      std::for_each(phase->ready.begin(), phase->ready.end(), update);
      std::for_each(phase->after.begin(), phase->after.end(), update);
    }
  });
}

// Runs `compute(part)` for part 0, and for part 1 when `both`, inside a parallel region, each on a thread of its own
// where there are two.
template <typename Compute>
void in_region(bool both, const Compute& compute) {
  at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) {
      if (part == 0 || both) {
        compute(part);
      }
    }
  });
}

std::atomic<int64_t> split_probes{0};

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.numel()) * a.element_size()) == 0;
}

bool probe_split(BackwardOp op, OpSplit split, int64_t m, int64_t k, int64_t n) {
  const at::NoGradGuard no_grad;
  constexpr int64_t kElements = 4096;
  constexpr int64_t kMostDraws = 256;
  const int64_t outputs = std::max<int64_t>(1, m * n);
  const int64_t draws = std::min(kMostDraws, (kElements + outputs - 1) / outputs);
  at::Generator generator = at::detail::createCPUGenerator(/*seed_in=*/0x5eed);
  const auto options = at::TensorOptions().dtype(at::kFloat);
  const bool sums = op == BackwardOp::kColumnSums;
  const bool transposed = op == BackwardOp::kTransposedProduct;
  const int64_t top = split == OpSplit::kRowHalves ? (m + 1) / 2 : m;
  struct Draw {
    at::Tensor a;
    at::Tensor b;
    at::Tensor whole;
    at::Tensor split;
  };
  std::vector<Draw> all(static_cast<size_t>(draws));
  for (Draw& d : all) {
    if (sums) {
      d.a = at::randn({k, n}, generator, options);
      d.whole = at::empty({n}, options);
      d.split = at::empty({n}, options);
      at::sum_out(d.whole, d.a, {0});
    } else {
      d.a = transposed ? at::randn({k, m}, generator, options).t() : at::randn({m, k}, generator, options);
      d.b = at::randn({k, n}, generator, options);
      d.whole = at::empty({m, n}, options);
      d.split = at::empty({m, n}, options);
      at::mm_out(d.whole, d.a, d.b);
    }
  }
  in_region(/*both=*/split == OpSplit::kRowHalves, [&](int64_t part) {
    const int64_t begin = part == 0 ? 0 : top;
    const int64_t count = part == 0 ? top : m - top;
    for (Draw& d : all) {
      if (sums) {
        at::sum_out(d.split, d.a, {0});
      } else if (count > 0) {
        at::Tensor out = d.split.narrow(0, begin, count);
        at::mm_out(out, d.a.narrow(0, begin, count), d.b);
      }
    }
  });
  return std::all_of(all.begin(), all.end(), [](const Draw& d) { return same_bits(d.whole, d.split); });
}

} // namespace

void run_side_by_side(const std::vector<SidePhase>& phases, const FusedStep& step) {
  std::vector<const SidePhase*> region;
  // The updates of each `outside` phase, shared in the region after it; reserved so that pointers stay valid.
  std::vector<SidePhase> carried;
  carried.reserve(phases.size());
  for (const SidePhase& phase : phases) {
    if (!phase.outside) {
      region.push_back(&phase);
      continue;
    }
    run_region(region, step);
    region.clear();
    run_tasks(phase);
    if (!phase.ready.empty() || !phase.after.empty()) {
      SidePhase& updates = carried.emplace_back();
      updates.ready = phase.ready;
      updates.ready.insert(updates.ready.end(), phase.after.begin(), phase.after.end());
      region.push_back(&updates);
    }
  }
  run_region(region, step);
}

bool splits_bitwise(BackwardOp op, OpSplit split, int64_t m, int64_t k, int64_t n) {
  TORCH_INTERNAL_ASSERT(m >= 0 && k >= 0 && n >= 0, "negative sizes ", m, "x", k, "x", n);
  TORCH_INTERNAL_ASSERT(op != BackwardOp::kColumnSums || (m == 1 && split == OpSplit::kOneThread),
                        "column sums have one output row and run on one thread");
  TORCH_INTERNAL_ASSERT(!at::in_parallel_region(), "splits_bitwise() compares with LibTorch's threads outside a region");
  using Key = std::array<int64_t, 6>;
  static std::mutex mutex;
  static std::map<Key, bool> found;
  const Key key = {static_cast<int64_t>(op), static_cast<int64_t>(split), m, k, n, at::get_num_threads()};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto it = found.find(key);
  if (it != found.end()) {
    return it->second;
  }
  const bool same = probe_split(op, split, m, k, n);
  found.emplace(key, same);
  split_probes.fetch_add(1, std::memory_order_relaxed);
  return same;
}

int64_t split_probes_run() {
  return split_probes.load(std::memory_order_relaxed);
}

} // namespace dkit::detail
