#include <dkit/train/optim.h>

#include <dkit/core/compat.h>
#include <dkit/train/detail/optim_kernels.h>

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
using detail::SgdConstants;
using detail::SgdSlot;

const detail::OptimKernelBuild& widest_build() {
  static const detail::OptimKernelBuild build = detail::optim_kernel_builds().back();
  return build;
}

void update_range(const AdamSlot& s, int64_t begin, int64_t end, bool fma) {
  widest_build().adam_update(s, begin, end, fma);
}

void update_range(const SgdSlot& s, int64_t begin, int64_t end, bool fma) {
  widest_build().sgd_update(s, begin, end, fma);
}

// Splits the parameters into blocks so that one parallel_for covers them all: large parameters are shared between
// LibTorch's intra-op threads as its own element-wise kernels share them, small ones cost no thread hand-off.
template <typename Slot>
void run_slots(const std::vector<Slot>& slots, FusedKernel kernel) {
  constexpr int64_t kBlock = 8192;
  struct Block {
    const Slot* slot;
    int64_t begin;
    int64_t end;
  };
  std::vector<Block> blocks;
  int64_t total = 0;
  for (const Slot& slot : slots) {
    for (int64_t begin = 0; begin < slot.numel; begin += kBlock) {
      blocks.push_back({&slot, begin, std::min(slot.numel, begin + kBlock)});
    }
    total += slot.numel;
  }
  const bool fma = kernel == FusedKernel::kFusedMultiplyAdd;
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
bool fused_adam_step(std::vector<torch::optim::OptimizerParamGroup>& groups, StateMap& states, bool decoupled,
                     FusedKernel kernel) {
  using Key = typename StateMap::key_type;
  if (kernel == FusedKernel::kNone) {
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

SgdConstants sgd_constants_for(const torch::optim::SGDOptions& options, bool first) {
  SgdConstants c;
  c.l2 = options.weight_decay() != 0;
  c.weight_decay = static_cast<float>(options.weight_decay());
  c.momentum = options.momentum() != 0;
  c.momentum_factor = static_cast<float>(options.momentum());
  c.one_minus_dampening = static_cast<float>(1 - options.dampening());
  c.first = first;
  c.nesterov = options.nesterov();
  c.neg_lr = static_cast<float>(-1 * options.lr());
  return c;
}

// One SGD step of every parameter with a gradient by `kernel`; false, with nothing changed, when a parameter, its
// gradient or its momentum buffer is one that the kernels do not handle.
template <typename StateMap>
bool fused_sgd_step(std::vector<torch::optim::OptimizerParamGroup>& groups, StateMap& states, FusedKernel kernel) {
  using Key = typename StateMap::key_type;
  if (kernel == FusedKernel::kNone) {
    return false;
  }
  for (auto& group : groups) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      if (!eligible(p, p) || !eligible(grad, p)) {
        return false;
      }
      if (options.momentum() != 0) {
        const auto found = states.find(compat::optimizer_state_key<Key>(p));
        if (found != states.end() &&
            !eligible(static_cast<const torch::optim::SGDParamState&>(*found->second).momentum_buffer(), p)) {
          return false;
        }
      }
    }
  }
  std::vector<SgdSlot> slots;
  for (auto& group : groups) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      float* buffer = nullptr;
      bool first = false;
      if (options.momentum() != 0) {
        auto& entry = states[compat::optimizer_state_key<Key>(p)];
        if (!entry) {
          auto fresh = std::make_unique<torch::optim::SGDParamState>();
          fresh->momentum_buffer(at::empty_like(p, at::MemoryFormat::Contiguous));
          entry = std::move(fresh);
          first = true;
        }
        buffer = static_cast<torch::optim::SGDParamState&>(*entry).momentum_buffer().data_ptr<float>();
      }
      slots.push_back({p.data_ptr<float>(), grad.data_ptr<float>(), buffer, p.numel(),
                       sgd_constants_for(options, first)});
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
bool adam_kernel_matches(FusedKernel kernel, const Options& options, bool decoupled) {
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

// Runs torch::optim::SGD and `kernel` side by side on a probe parameter for a few steps; true when every value
// is bitwise the same.
bool sgd_kernel_matches(FusedKernel kernel, const torch::optim::SGDOptions& options) {
  constexpr int64_t kSize = 1003;
  at::Tensor reference = probe_values(kSize, 0.37, 0.5, 0.1).set_requires_grad(true);
  at::Tensor mine = reference.detach().clone();
  at::Tensor buffer = at::zeros_like(mine);
  torch::optim::SGD optimizer(std::vector<at::Tensor>{reference}, options);
  for (int64_t step = 1; step <= 3; ++step) {
    const at::Tensor grad = probe_values(kSize, 0.11 * static_cast<double>(step), 0.1, 0.3);
    reference.mutable_grad() = grad.clone();
    optimizer.step();
    const std::vector<SgdSlot> slot = {{mine.data_ptr<float>(), grad.data_ptr<float>(), buffer.data_ptr<float>(),
                                        kSize, sgd_constants_for(options, step == 1)}};
    run_slots(slot, kernel);
  }
  if (!at::equal(reference.detach(), mine)) {
    return false;
  }
  if (options.momentum() == 0) {
    return optimizer.state().empty();
  }
  const auto& state = static_cast<const torch::optim::SGDParamState&>(*optimizer.state().begin()->second);
  return at::equal(state.momentum_buffer(), buffer);
}

FusedKernel probe_sgd_kernel() {
  const at::NoGradGuard no_grad;
  using torch::optim::SGDOptions;
  for (const auto kernel : {FusedKernel::kFusedMultiplyAdd, FusedKernel::kSeparateRounding}) {
    if (sgd_kernel_matches(kernel, SGDOptions(0.1)) &&
        sgd_kernel_matches(kernel, SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01)) &&
        sgd_kernel_matches(kernel, SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01))) {
      return kernel;
    }
  }
  return FusedKernel::kNone;
}

FusedKernel probe_adam_kernel() {
  const at::NoGradGuard no_grad;
  for (const auto kernel : {FusedKernel::kFusedMultiplyAdd, FusedKernel::kSeparateRounding}) {
    const bool adam = adam_kernel_matches<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
        kernel, torch::optim::AdamOptions(1e-3).weight_decay(0.01), /*decoupled=*/false);
    const bool adamw =
        adam_kernel_matches<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
            kernel, torch::optim::AdamWOptions(1e-3).weight_decay(0.01), /*decoupled=*/true);
    if (adam && adamw) {
      return kernel;
    }
  }
  return FusedKernel::kNone;
}

// Evaluates `closure` (with gradients) when there is one, then runs `update` without them; returns the closure's
// loss, as LibTorch's optimizers' step(closure) do.
template <typename Update>
at::Tensor closure_then(const torch::optim::Optimizer::LossClosure& closure, Update update) {
  at::Tensor loss;
  if (closure != nullptr) {
    const at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const at::NoGradGuard no_grad;
  update();
  return loss;
}

} // namespace

namespace detail {

std::vector<OptimKernelBuild> optim_kernel_builds() {
  std::vector<OptimKernelBuild> builds = {DEFAULT::build()};
#if DKIT_OPTIM_KERNELS_AVX
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    builds.push_back(AVX2::build());
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      builds.push_back(AVX512::build());
    }
  }
#endif
  return builds;
}

} // namespace detail

FusedKernel fused_adam_kernel() {
  static const FusedKernel kernel = probe_adam_kernel();
  return kernel;
}

FusedKernel fused_sgd_kernel() {
  static const FusedKernel kernel = probe_sgd_kernel();
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

std::string to_string(FusedKernel kernel) {
  switch (kernel) {
    case FusedKernel::kFusedMultiplyAdd: return "fma";
    case FusedKernel::kSeparateRounding: return "separate";
    case FusedKernel::kNone: return "none";
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled FusedKernel ", static_cast<int>(kernel));
}

FusedSGD::FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups, torch::optim::SGDOptions defaults)
    : torch::optim::SGD(std::move(param_groups), std::move(defaults)) {
  fused_sgd_kernel();
}

FusedSGD::FusedSGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults)
    : torch::optim::SGD(std::move(params), std::move(defaults)) {
  fused_sgd_kernel();
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

torch::Tensor FusedSGD::step(LossClosure closure) {
  return closure_then(closure, [this] {
    if (!fused_sgd_step(param_groups_, state_, fused_sgd_kernel())) {
      torch::optim::SGD::step();
    }
  });
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  return closure_then(closure, [this] {
    using torch::optim::AdamOptions;
    using torch::optim::AdamParamState;
    if (!fused_adam_step<AdamOptions, AdamParamState>(param_groups_, state_, /*decoupled=*/false,
                                                      fused_adam_kernel())) {
      torch::optim::Adam::step();
    }
  });
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  return closure_then(closure, [this] {
    using torch::optim::AdamWOptions;
    using torch::optim::AdamWParamState;
    if (!fused_adam_step<AdamWOptions, AdamWParamState>(param_groups_, state_, /*decoupled=*/true,
                                                        fused_adam_kernel())) {
      torch::optim::AdamW::step();
    }
  });
}

} // namespace dkit
