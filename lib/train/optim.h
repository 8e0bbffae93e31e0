#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dkit {

struct DeviceReport;

/// How dkit's fused optimizers (FusedSGD, FusedAdam, FusedAdamW) update CPU parameters in this process.
enum class FusedKernel {
  /// One pass per parameter, rounding as LibTorch's CPU kernels do when they use fused multiply-adds (the
  /// AVX2 and AVX-512 kernels).
  kFusedMultiplyAdd,
  /// One pass per parameter, rounding each product and sum separately, as LibTorch's baseline CPU kernels do.
  kSeparateRounding,
  /// No pass of dkit's own: a probe found LibTorch rounding in a way neither kernel reproduces, so every step is
  /// LibTorch's.
  kNone,
};

/// Which kernel FusedAdam and FusedAdamW use on the CPU here. The first call runs a probe (once per process): a
/// few Adam and AdamW updates of a probe tensor by LibTorch's own optimizers and by each of dkit's kernels,
/// keeping the kernel whose results are bitwise the same.
FusedKernel fused_adam_kernel();

/// Which kernel FusedSGD uses on the CPU here, found as fused_adam_kernel() is, by a probe of torch::optim::SGD
/// with and without momentum, dampening, Nesterov momentum and weight decay.
FusedKernel fused_sgd_kernel();

/// `fma`, `separate` or `none`, for logs and benchmark notes.
std::string to_string(FusedKernel kernel);

/// The instruction set of the update kernels the fused optimizers run on this CPU: `default`, `avx2` or `avx512`.
std::string fused_kernel_instructions();

/// What the probes behind fused_sgd_kernel() and fused_adam_kernel() found in this process: whether dkit's own
/// updates take the fused optimizers' CPU steps here and, where one does not, why.
struct FusedKernelReport {
  /// fused_kernel_instructions().
  std::string instructions;
  /// fused_sgd_kernel().
  FusedKernel sgd = FusedKernel::kNone;
  /// fused_adam_kernel(), FusedAdam's and FusedAdamW's.
  FusedKernel adam = FusedKernel::kNone;
  /// When `sgd` is kNone, the values of each probe that differed from torch::optim::SGD's, for each kernel tried,
  /// e.g. `fma kernel: SGD: param 17/1003; separate kernel: …`; empty otherwise.
  std::string sgd_mismatch;
  /// The same for `adam`, against torch::optim::Adam and AdamW.
  std::string adam_mismatch;
};

/// Runs both probes if this process has not yet, and says what they found.
FusedKernelReport fused_kernel_report();

/// Adds `fused` to a `dkit devices` report: a line `Optim` (JSON: `fused_updates`), and a warning for each
/// optimizer whose steps are LibTorch's own because a probe found no kernel with its bits.
void add_to_report(const FusedKernelReport& fused, DeviceReport& report);

/// How many distinct threads run the chunks of an `at::parallel_for` over `at::get_num_threads()` items in dkit's
/// kernel code: that number when dkit was compiled with OpenMP (`DKIT_WITH_OPENMP`), 1 otherwise, since
/// at::parallel_for runs its whole range on the calling thread in code built without OpenMP.
int kernel_threads();

/// One step of FusedSGD, FusedAdam or FusedAdamW split into its parameters' updates, which may run in any order
/// and on any threads, each element updated exactly once: then the parameters and the optimizer's state are
/// bitwise what step() makes of them. Made by FusedOptimizer::begin_step(). Example:
/// ```
/// if (std::optional<dkit::FusedStep> step = optimizer.begin_step()) {
///   for (size_t i = 0; i < step->size(); ++i) {
///     step->update(i, 0, step->numel(i));
///   }
/// }
/// ```
class FusedStep {
 public:
  /// How many parameters the step updates: those with a gradient, in the optimizer's order.
  size_t size() const;
  /// The position of `parameter` (the same tensor, not an equal one) among the step's parameters, or -1 when the
  /// step does not update it.
  int64_t index_of(const at::Tensor& parameter) const;
  /// How many elements the parameter at `index` has.
  int64_t numel(size_t index) const;
  /// Updates elements [begin, end) of the parameter at `index` (and of its state) on the calling thread.
  void update(size_t index, int64_t begin, int64_t end) const;
  /// Runs every update, split over LibTorch's intra-op threads as step() splits them.
  void run() const;

  /// The step's parameters and their kernels' arguments; internal to dkit.
  struct Slots;
  /// A step over `slots`; internal to dkit (FusedOptimizer::begin_step() makes steps).
  explicit FusedStep(std::shared_ptr<const Slots> slots);

 private:
  std::shared_ptr<const Slots> slots_;
};

/// What FusedSGD, FusedAdam and FusedAdamW share beside their LibTorch optimizer: a step that can be taken a
/// parameter at a time.
class FusedOptimizer {
 public:
  virtual ~FusedOptimizer() = default;
  /// Begins a step as step() begins it (creates missing state, counts the step, reads each group's options as
  /// they are now) and returns the updates it leaves to run, which the caller must run before the next step;
  /// std::nullopt, with nothing changed, when step() would be LibTorch's (see each optimizer).
  virtual std::optional<FusedStep> begin_step() = 0;
};

/// `torch::optim::SGD` whose step() updates each float32 CPU parameter in one pass over its elements (gradient,
/// weight decay, momentum buffer and parameter together, split over LibTorch's intra-op threads for large
/// parameters), instead of up to five LibTorch operations per parameter, each a pass of its own with a dispatch
/// and, for weight decay and Nesterov momentum, a temporary. The results are bitwise those of torch::optim::SGD
/// (see fused_sgd_kernel()). The state is torch::optim::SGD's (`SGDParamState`, made on the first step with
/// momentum as LibTorch makes it), so state dicts and dkit's training checkpoints are unchanged, and it is a
/// `torch::optim::SGD` to everything that asks. Steps with a parameter it does not handle (not on the CPU, not
/// float32, not contiguous, a sparse gradient) are torch::optim::SGD::step(). Example:
/// ```
/// dkit::FusedSGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
/// ```
class FusedSGD : public torch::optim::SGD, public FusedOptimizer {
 public:
  /// SGD over `param_groups` with `defaults` for the options a group leaves unset; runs the probe of
  /// fused_sgd_kernel() if this process has not yet.
  explicit FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups, torch::optim::SGDOptions defaults);
  /// SGD over `params`, as torch::optim::SGD's constructor of the same form.
  explicit FusedSGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults);

  /// One SGD update of every parameter with a gradient; `closure`, when given, is evaluated first and its loss
  /// returned.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Begins an SGD step to be run a parameter at a time (see FusedOptimizer).
  std::optional<FusedStep> begin_step() override;
};

/// `torch::optim::Adam` whose step() updates each float32 CPU parameter in one pass over its elements (gradient,
/// both moments and the parameter together, split over LibTorch's intra-op threads for large parameters), instead
/// of eight LibTorch operations per parameter, each a pass of its own with a dispatch and temporaries. The results
/// are bitwise those of torch::optim::Adam (see fused_adam_kernel()). The state is torch::optim::Adam's
/// (`AdamParamState`), so state dicts and dkit's training checkpoints are unchanged, and it is a
/// `torch::optim::Adam` to everything that asks. Steps with a parameter it does not handle (not on the CPU, not
/// float32, not contiguous, a sparse gradient, `amsgrad`) are torch::optim::Adam::step(). Example:
/// ```
/// dkit::FusedAdam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
/// ```
class FusedAdam : public torch::optim::Adam, public FusedOptimizer {
 public:
  /// Adam over `param_groups` with `defaults` for the options a group leaves unset; runs the probe of
  /// fused_adam_kernel() if this process has not yet.
  explicit FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     torch::optim::AdamOptions defaults = {});
  /// Adam over `params`, as torch::optim::Adam's constructor of the same form.
  explicit FusedAdam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults = {});

  /// One Adam update of every parameter with a gradient; `closure`, when given, is evaluated first and its loss
  /// returned.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Begins an Adam step to be run a parameter at a time (see FusedOptimizer).
  std::optional<FusedStep> begin_step() override;
};

/// `torch::optim::AdamW` (decoupled weight decay) with FusedAdam's one-pass CPU update: bitwise the results of
/// torch::optim::AdamW, whose state and type it keeps.
class FusedAdamW : public torch::optim::AdamW, public FusedOptimizer {
 public:
  /// AdamW over `param_groups` with `defaults` for the options a group leaves unset; runs the probe of
  /// fused_adam_kernel() if this process has not yet.
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      torch::optim::AdamWOptions defaults = {});
  /// AdamW over `params`, as torch::optim::AdamW's constructor of the same form.
  explicit FusedAdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults = {});

  /// One AdamW update of every parameter with a gradient; `closure`, when given, is evaluated first and its loss
  /// returned.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Begins an AdamW step to be run a parameter at a time (see FusedOptimizer).
  std::optional<FusedStep> begin_step() override;
};

} // namespace dkit
