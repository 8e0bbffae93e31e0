#include <dkit/train/optim.h>

#include <dkit/core/compat.h>
#include <dkit/device/report.h>
#include <dkit/train/detail/optim_kernels.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

namespace dkit {

struct FusedStep::Slots {
  explicit Slots(FusedKernel fused_kernel) : kernel(fused_kernel) {}

  FusedKernel kernel;
  std::vector<const c10::TensorImpl*> params;
  std::vector<detail::SgdSlot> sgd;
  std::vector<detail::AdamSlot> adam;
};

namespace {

// How many elements of a parameter one update block holds: large parameters are shared between threads by blocks.
constexpr int64_t kUpdateBlock = 8192;

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
  struct Block {
    const Slot* slot;
    int64_t begin;
    int64_t end;
  };
  std::vector<Block> blocks;
  int64_t total = 0;
  for (const Slot& slot : slots) {
    for (int64_t begin = 0; begin < slot.numel; begin += kUpdateBlock) {
      blocks.push_back({&slot, begin, std::min(slot.numel, begin + kUpdateBlock)});
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
  at::parallel_for(0, count, std::max<int64_t>(1, at::internal::GRAIN_SIZE / kUpdateBlock), run);
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

// Begins a step of every parameter with a gradient by `kernel`: its state made and counted, its update's
// arguments returned; null, with nothing changed, when a parameter, its gradient or its state is one that the
// kernels do not handle.
template <typename Options, typename State, typename StateMap>
std::shared_ptr<FusedStep::Slots> begin_adam_step(std::vector<torch::optim::OptimizerParamGroup>& groups,
                                                  StateMap& states, bool decoupled, FusedKernel kernel) {
  using Key = typename StateMap::key_type;
  if (kernel == FusedKernel::kNone) {
    return nullptr;
  }
  struct Entry {
    const Options* options;
    at::Tensor* param;
    Key key;
    State* state;
  };
  std::vector<Entry> entries;
  for (auto& group : groups) {
    const auto& options = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      if (options.amsgrad() || !eligible(p, p) || !eligible(grad, p)) {
        return nullptr;
      }
      Key key = compat::optimizer_state_key<Key>(p);
      State* state = nullptr;
      const auto found = states.find(key);
      if (found != states.end()) {
        state = &static_cast<State&>(*found->second);
        if (!eligible(state->exp_avg(), p) || !eligible(state->exp_avg_sq(), p)) {
          return nullptr;
        }
      }
      entries.push_back({&options, &p, std::move(key), state});
    }
  }
  auto slots = std::make_shared<FusedStep::Slots>(kernel);
  const Options* constants_options = nullptr;
  int64_t constants_step = 0;
  AdamConstants constants;
  for (Entry& e : entries) {
    at::Tensor& p = *e.param;
    if (e.state == nullptr) {
      auto& entry = states[std::move(e.key)];
      if (!entry) {
        auto fresh = std::make_unique<State>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        entry = std::move(fresh);
      }
      e.state = &static_cast<State&>(*entry);
    }
    State& state = *e.state;
    state.step(state.step() + 1);
    if (e.options != constants_options || state.step() != constants_step) {
      constants = constants_for(*e.options, state.step(), decoupled);
      constants_options = e.options;
      constants_step = state.step();
    }
    slots->params.push_back(p.unsafeGetTensorImpl());
    slots->adam.push_back({p.data_ptr<float>(), p.grad().data_ptr<float>(), state.exp_avg().template data_ptr<float>(),
                           state.exp_avg_sq().template data_ptr<float>(), p.numel(), constants});
  }
  return slots;
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

// Begins an SGD step of every parameter with a gradient by `kernel`: missing momentum buffers made, the updates'
// arguments returned; null, with nothing changed, when a parameter, its gradient or its momentum buffer is one
// that the kernels do not handle.
template <typename StateMap>
std::shared_ptr<FusedStep::Slots> begin_sgd_step(std::vector<torch::optim::OptimizerParamGroup>& groups,
                                                 StateMap& states, FusedKernel kernel) {
  using Key = typename StateMap::key_type;
  if (kernel == FusedKernel::kNone) {
    return nullptr;
  }
  struct Entry {
    const torch::optim::SGDOptions* options;
    at::Tensor* param;
    std::optional<Key> key;
  };
  std::vector<Entry> entries;
  for (auto& group : groups) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      if (!eligible(p, p) || !eligible(grad, p)) {
        return nullptr;
      }
      std::optional<Key> key;
      if (options.momentum() != 0) {
        key = compat::optimizer_state_key<Key>(p);
        const auto found = states.find(*key);
        if (found != states.end() &&
            !eligible(static_cast<const torch::optim::SGDParamState&>(*found->second).momentum_buffer(), p)) {
          return nullptr;
        }
      }
      entries.push_back({&options, &p, std::move(key)});
    }
  }
  auto slots = std::make_shared<FusedStep::Slots>(kernel);
  for (Entry& e : entries) {
    at::Tensor& p = *e.param;
    float* buffer = nullptr;
    bool first = false;
    if (e.key) {
      auto& entry = states[std::move(*e.key)];
      if (!entry) {
        auto fresh = std::make_unique<torch::optim::SGDParamState>();
        fresh->momentum_buffer(at::empty_like(p, at::MemoryFormat::Contiguous));
        entry = std::move(fresh);
        first = true;
      }
      buffer = static_cast<torch::optim::SGDParamState&>(*entry).momentum_buffer().data_ptr<float>();
    }
    slots->params.push_back(p.unsafeGetTensorImpl());
    slots->sgd.push_back({p.data_ptr<float>(), p.grad().data_ptr<float>(), buffer, p.numel(),
                          sgd_constants_for(*e.options, first)});
  }
  return slots;
}

std::optional<FusedStep> fused_step(std::shared_ptr<const FusedStep::Slots> slots) {
  return slots ? std::optional<FusedStep>(FusedStep(std::move(slots))) : std::nullopt;
}

at::Tensor probe_values(int64_t n, double frequency, double scale, double offset) {
  return at::sin(at::arange(n, at::TensorOptions().dtype(at::kDouble)) * frequency + offset)
      .mul_(scale)
      .to(at::kFloat);
}

// `name N/M` when `mine` differs from `reference` in N of its M values, empty when they are bitwise the same.
std::string difference(const char* name, const at::Tensor& reference, const at::Tensor& mine) {
  if (at::equal(reference, mine)) {
    return "";
  }
  return std::string(name) + " " + std::to_string(reference.ne(mine).sum().item<int64_t>()) + "/" +
         std::to_string(reference.numel());
}

// The non-empty parts, joined with `separator`.
std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const std::string& part : parts) {
    if (!part.empty()) {
      out += (out.empty() ? "" : separator) + part;
    }
  }
  return out;
}

// Runs LibTorch's optimizer and `kernel` side by side on a probe parameter for a few steps; empty when every value
// is bitwise the same, otherwise which values differ.
template <typename Optimizer, typename Options, typename State>
std::string adam_kernel_difference(FusedKernel kernel, const Options& options, bool decoupled) {
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
  return join({difference("param", reference.detach(), mine), difference("exp_avg", state.exp_avg(), exp_avg),
               difference("exp_avg_sq", state.exp_avg_sq(), exp_avg_sq)},
              ", ");
}

// Runs torch::optim::SGD and `kernel` side by side on a probe parameter for a few steps; empty when every value
// is bitwise the same, otherwise which values differ.
std::string sgd_kernel_difference(FusedKernel kernel, const torch::optim::SGDOptions& options) {
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
  std::string params = difference("param", reference.detach(), mine);
  if (options.momentum() == 0) {
    return join({params, optimizer.state().empty() ? "" : "state"}, ", ");
  }
  const auto& state = static_cast<const torch::optim::SGDParamState&>(*optimizer.state().begin()->second);
  return join({params, difference("momentum_buffer", state.momentum_buffer(), buffer)}, ", ");
}

// A probe's verdict: the first kernel whose results are bitwise LibTorch's, or kNone and, for each kernel tried,
// what differed.
struct ProbeOutcome {
  FusedKernel kernel = FusedKernel::kNone;
  std::string mismatch;
};

// Tries each kernel with `differences(kernel)`, which names each probe that does not match (empty parts match).
template <typename Differences>
ProbeOutcome probe(Differences differences) {
  const at::NoGradGuard no_grad;
  std::vector<std::string> mismatches;
  for (const auto kernel : {FusedKernel::kFusedMultiplyAdd, FusedKernel::kSeparateRounding}) {
    const std::string mismatch = join(differences(kernel), "; ");
    if (mismatch.empty()) {
      return {kernel, ""};
    }
    mismatches.push_back(to_string(kernel) + " kernel: " + mismatch);
  }
  return {FusedKernel::kNone, join(mismatches, "; ")};
}

// `label: differences`, or empty when there are none.
std::string labelled(const char* label, const std::string& differences) {
  return differences.empty() ? "" : std::string(label) + ": " + differences;
}

ProbeOutcome probe_sgd_kernel() {
  using torch::optim::SGDOptions;
  return probe([](FusedKernel kernel) {
    return std::vector<std::string>{
        labelled("SGD", sgd_kernel_difference(kernel, SGDOptions(0.1))),
        labelled("SGD with momentum, dampening and weight decay",
                 sgd_kernel_difference(kernel, SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(0.01))),
        labelled("SGD with Nesterov momentum and weight decay",
                 sgd_kernel_difference(kernel, SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01)))};
  });
}

ProbeOutcome probe_adam_kernel() {
  return probe([](FusedKernel kernel) {
    return std::vector<std::string>{
        labelled("Adam",
                 adam_kernel_difference<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
                     kernel, torch::optim::AdamOptions(1e-3).weight_decay(0.01), /*decoupled=*/false)),
        labelled("AdamW", adam_kernel_difference<torch::optim::AdamW, torch::optim::AdamWOptions,
                                                 torch::optim::AdamWParamState>(
                              kernel, torch::optim::AdamWOptions(1e-3).weight_decay(0.01), /*decoupled=*/true))};
  });
}

const ProbeOutcome& adam_probe() {
  static const ProbeOutcome outcome = probe_adam_kernel();
  return outcome;
}

const ProbeOutcome& sgd_probe() {
  static const ProbeOutcome outcome = probe_sgd_kernel();
  return outcome;
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
  return adam_probe().kernel;
}

FusedKernel fused_sgd_kernel() {
  return sgd_probe().kernel;
}

std::string fused_kernel_instructions() {
  return widest_build().name;
}

FusedKernelReport fused_kernel_report() {
  return {fused_kernel_instructions(), sgd_probe().kernel, adam_probe().kernel, sgd_probe().mismatch,
          adam_probe().mismatch};
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

void add_to_report(const FusedKernelReport& fused, DeviceReport& report) {
  report.extras.push_back({"Optim",
                           "fused_updates",
                           "fused CPU updates, " + fused.instructions + " kernels: SGD " + to_string(fused.sgd) +
                               ", Adam and AdamW " + to_string(fused.adam),
                           {{"instructions", fused.instructions},
                            {"sgd", to_string(fused.sgd)},
                            {"adam", to_string(fused.adam)},
                            {"sgd_mismatch", fused.sgd_mismatch},
                            {"adam_mismatch", fused.adam_mismatch}}});
  const auto warn = [&](FusedKernel kernel, const char* optimizers, const char* fused_types_take,
                        const std::string& mismatch) {
    if (kernel == FusedKernel::kNone) {
      report.warnings.push_back("LibTorch " + report.torch_version + " updates " + optimizers +
                                " with other bits than either of dkit's kernels (" + mismatch + "), so " +
                                fused_types_take + " LibTorch's own, slower steps; please report this line");
    }
  };
  warn(fused.sgd, "SGD", "FusedSGD takes", fused.sgd_mismatch);
  warn(fused.adam, "Adam and AdamW", "FusedAdam and FusedAdamW take", fused.adam_mismatch);
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
    if (const std::optional<FusedStep> updates = begin_step()) {
      updates->run();
    } else {
      torch::optim::SGD::step();
    }
  });
}

std::optional<FusedStep> FusedSGD::begin_step() {
  return fused_step(begin_sgd_step(param_groups_, state_, fused_sgd_kernel()));
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  return closure_then(closure, [this] {
    if (const std::optional<FusedStep> updates = begin_step()) {
      updates->run();
    } else {
      torch::optim::Adam::step();
    }
  });
}

std::optional<FusedStep> FusedAdam::begin_step() {
  return fused_step(begin_adam_step<torch::optim::AdamOptions, torch::optim::AdamParamState>(
      param_groups_, state_, /*decoupled=*/false, fused_adam_kernel()));
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  return closure_then(closure, [this] {
    if (const std::optional<FusedStep> updates = begin_step()) {
      updates->run();
    } else {
      torch::optim::AdamW::step();
    }
  });
}

std::optional<FusedStep> FusedAdamW::begin_step() {
  return fused_step(begin_adam_step<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
      param_groups_, state_, /*decoupled=*/true, fused_adam_kernel()));
}

FusedStep::FusedStep(std::shared_ptr<const Slots> slots) : slots_(std::move(slots)) {
  TORCH_INTERNAL_ASSERT(slots_ != nullptr && (slots_->sgd.empty() || slots_->adam.empty()) &&
                            slots_->params.size() == slots_->sgd.size() + slots_->adam.size(),
                        "a fused step is of one optimizer, a slot per parameter");
}

size_t FusedStep::size() const {
  return slots_->params.size();
}

int64_t FusedStep::index_of(const at::Tensor& parameter) const {
  const auto& params = slots_->params;
  const auto found = std::find(params.begin(), params.end(), parameter.unsafeGetTensorImpl());
  return found == params.end() ? -1 : static_cast<int64_t>(found - params.begin());
}

int64_t FusedStep::numel(size_t index) const {
  TORCH_CHECK(index < size(), "FusedStep::numel: no parameter ", index, " in a step of ", size());
  return slots_->sgd.empty() ? slots_->adam[index].numel : slots_->sgd[index].numel;
}

void FusedStep::run() const {
  if (!slots_->sgd.empty()) {
    run_slots(slots_->sgd, slots_->kernel);
  }
  if (!slots_->adam.empty()) {
    run_slots(slots_->adam, slots_->kernel);
  }
}

void FusedStep::update(size_t index, int64_t begin, int64_t end) const {
  TORCH_CHECK(0 <= begin && begin <= end && end <= numel(index), "FusedStep::update: elements [", begin, ", ", end,
              ") of parameter ", index, ", which has ", numel(index));
  const bool fma = slots_->kernel == FusedKernel::kFusedMultiplyAdd;
  if (slots_->sgd.empty()) {
    update_range(slots_->adam[index], begin, end, fma);
  } else {
    update_range(slots_->sgd[index], begin, end, fma);
  }
}

} // namespace dkit
