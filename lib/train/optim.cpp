#include <dkit/train/optim.h>

#include <dkit/core/compat.h>
#include <dkit/train/detail/adam_kernel.h>

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace dkit {
namespace {

using detail::AdamConstants;
using detail::AdamSlot;

void update_range(const AdamSlot& s, int64_t begin, int64_t end, bool fma) {
  static const auto update = detail::adam_kernel_builds().back().update;
  update(s, begin, end, fma);
}

// Splits the parameters into blocks so that one parallel_for covers them all: large parameters are shared between
// LibTorch's intra-op threads as its own element-wise kernels share them, small ones cost no thread hand-off.
void run_slots(const std::vector<AdamSlot>& slots, FusedAdamKernel kernel) {
  constexpr int64_t kBlock = 8192;
  struct Block {
    const AdamSlot* slot;
    int64_t begin;
    int64_t end;
  };
  std::vector<Block> blocks;
  int64_t total = 0;
  for (const AdamSlot& slot : slots) {
    for (int64_t begin = 0; begin < slot.numel; begin += kBlock) {
      blocks.push_back({&slot, begin, std::min(slot.numel, begin + kBlock)});
    }
    total += slot.numel;
  }
  const bool fma = kernel == FusedAdamKernel::kFusedMultiplyAdd;
  auto run = [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const Block& block = blocks[static_cast<size_t>(b)];
      update_range(*block.slot, block.begin, block.end, fma);
    }
  };
  const auto count = static_cast<int64_t>(blocks.size());
  if (total < at::internal::GRAIN_SIZE || at::get_num_threads() == 1) {
    run(0, count);
    return;
  }
  at::parallel_for(0, count, std::max<int64_t>(1, at::internal::GRAIN_SIZE / kBlock), run);
}

bool eligible(const at::Tensor& tensor, const at::Tensor& like) {
  return tensor.defined() && tensor.device().is_cpu() && tensor.scalar_type() == at::kFloat &&
         tensor.layout() == at::kStrided && tensor.is_contiguous() && tensor.numel() == like.numel() &&
         !tensor.is_neg() && !tensor.is_conj();
}

template <typename Options>
AdamConstants constants_for(const Options& options, int64_t step, bool decoupled) {
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  AdamConstants c;
  c.beta1 = static_cast<float>(beta1);
  c.one_minus_beta1 = static_cast<float>(1 - beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta2 = static_cast<float>(1 - beta2);
  c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(options.eps());
  c.neg_step_size = static_cast<float>(-(options.lr() / bias_correction1));
  if (options.weight_decay() != 0) {
    if (decoupled) {
      c.decoupled = true;
      c.decay = static_cast<float>(1 - options.lr() * options.weight_decay());
    } else {
      c.l2 = true;
      c.weight_decay = static_cast<float>(options.weight_decay());
    }
  }
  return c;
}

// One step of every parameter with a gradient by `kernel`; false, with nothing changed, when a parameter, its
// gradient or its state is one that the kernels do not handle.
template <typename Options, typename State, typename StateMap>
bool fused_step(std::vector<torch::optim::OptimizerParamGroup>& groups, StateMap& states, bool decoupled,
                FusedAdamKernel kernel) {
  using Key = typename StateMap::key_type;
  if (kernel == FusedAdamKernel::kNone) {
    return false;
  }
  for (auto& group : groups) {
    const auto& options = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      if (options.amsgrad() || !eligible(p, p) || !eligible(grad, p)) {
        return false;
      }
      const auto found = states.find(compat::optimizer_state_key<Key>(p));
      if (found != states.end()) {
        const auto& state = static_cast<const State&>(*found->second);
        if (!eligible(state.exp_avg(), p) || !eligible(state.exp_avg_sq(), p)) {
          return false;
        }
      }
    }
  }
  std::vector<AdamSlot> slots;
  for (auto& group : groups) {
    const auto& options = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      auto& entry = states[compat::optimizer_state_key<Key>(p)];
      if (!entry) {
        auto fresh = std::make_unique<State>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        entry = std::move(fresh);
      }
      auto& state = static_cast<State&>(*entry);
      state.step(state.step() + 1);
      slots.push_back({p.data_ptr<float>(), grad.data_ptr<float>(), state.exp_avg().template data_ptr<float>(),
                       state.exp_avg_sq().template data_ptr<float>(), p.numel(),
                       constants_for(options, state.step(), decoupled)});
    }
  }
  run_slots(slots, kernel);
  return true;
}

at::Tensor probe_values(int64_t n, double frequency, double scale, double offset) {
  return at::sin(at::arange(n, at::TensorOptions().dtype(at::kDouble)) * frequency + offset)
      .mul_(scale)
      .to(at::kFloat);
}

// Runs LibTorch's optimizer and `kernel` side by side on a probe parameter for a few steps; true when every value
// is bitwise the same.
template <typename Optimizer, typename Options, typename State>
bool kernel_matches(FusedAdamKernel kernel, const Options& options, bool decoupled) {
  constexpr int64_t kSize = 1003;
  at::Tensor reference = probe_values(kSize, 0.37, 0.5, 0.1).set_requires_grad(true);
  at::Tensor mine = reference.detach().clone();
  at::Tensor exp_avg = at::zeros_like(mine);
  at::Tensor exp_avg_sq = at::zeros_like(mine);
  Optimizer optimizer(std::vector<at::Tensor>{reference}, options);
  for (int64_t step = 1; step <= 3; ++step) {
    const at::Tensor grad = probe_values(kSize, 0.11 * static_cast<double>(step), 0.1, 0.3);
    reference.mutable_grad() = grad.clone();
    optimizer.step();
    std::vector<AdamSlot> slot = {{mine.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                               exp_avg_sq.data_ptr<float>(), kSize, constants_for(options, step, decoupled)}};
    run_slots(slot, kernel);
  }
  const auto& state = static_cast<const State&>(*optimizer.state().begin()->second);
  return at::equal(reference.detach(), mine) && at::equal(state.exp_avg(), exp_avg) &&
         at::equal(state.exp_avg_sq(), exp_avg_sq);
}

FusedAdamKernel probe_kernel() {
  const at::NoGradGuard no_grad;
  for (const auto kernel : {FusedAdamKernel::kFusedMultiplyAdd, FusedAdamKernel::kSeparateRounding}) {
    const bool adam = kernel_matches<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
        kernel, torch::optim::AdamOptions(1e-3).weight_decay(0.01), /*decoupled=*/false);
    const bool adamw =
        kernel_matches<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
            kernel, torch::optim::AdamWOptions(1e-3).weight_decay(0.01), /*decoupled=*/true);
    if (adam && adamw) {
      return kernel;
    }
  }
  return FusedAdamKernel::kNone;
}

} // namespace

namespace detail {

std::vector<AdamKernelBuild> adam_kernel_builds() {
  std::vector<AdamKernelBuild> builds = {{"default", &DEFAULT::adam_update}};
#if DKIT_ADAM_KERNEL_AVX
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    builds.push_back({"avx2", &AVX2::adam_update});
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      builds.push_back({"avx512", &AVX512::adam_update});
    }
  }
#endif
  return builds;
}

} // namespace detail

FusedAdamKernel fused_adam_kernel() {
  static const FusedAdamKernel kernel = probe_kernel();
  return kernel;
}

int kernel_threads() {
  const int64_t items = at::get_num_threads();
  std::mutex mutex;
  std::set<std::thread::id> threads;
  at::parallel_for(0, items, 1, [&](int64_t /*begin*/, int64_t /*end*/) {
    const std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  return static_cast<int>(threads.size());
}

std::string to_string(FusedAdamKernel kernel) {
  switch (kernel) {
    case FusedAdamKernel::kFusedMultiplyAdd: return "fma";
    case FusedAdamKernel::kSeparateRounding: return "separate";
    case FusedAdamKernel::kNone: return "none";
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled FusedAdamKernel ", static_cast<int>(kernel));
}

FusedAdam::FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups, torch::optim::AdamOptions defaults)
    : torch::optim::Adam(std::move(param_groups), std::move(defaults)) {
  fused_adam_kernel();
}

FusedAdam::FusedAdam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults)
    : torch::optim::Adam(std::move(params), std::move(defaults)) {
  fused_adam_kernel();
}

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       torch::optim::AdamWOptions defaults)
    : torch::optim::AdamW(std::move(param_groups), std::move(defaults)) {
  fused_adam_kernel();
}

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults)
    : torch::optim::AdamW(std::move(params), std::move(defaults)) {
  fused_adam_kernel();
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    const at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const at::NoGradGuard no_grad;
  if (!fused_step<torch::optim::AdamOptions, torch::optim::AdamParamState>(param_groups_, state_,
                                                                            /*decoupled=*/false,
                                                                            fused_adam_kernel())) {
    torch::optim::Adam::step();
  }
  return loss;
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    const at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const at::NoGradGuard no_grad;
  if (!fused_step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(param_groups_, state_,
                                                                              /*decoupled=*/true,
                                                                              fused_adam_kernel())) {
    torch::optim::AdamW::step();
  }
  return loss;
}

} // namespace dkit
