#pragma once

// Internal to the `train`, `optimizers` and `precision` suites: the MLP they train, the optimizers they compare, a
// runner of dkit's training step, the matrix products alone, and the PyTorch side (bench/python/mlp_train.py).

#include <dkit/bench/suites.h>
#include <dkit/bench/timing.h>
#include <dkit/checkpoint/optimizer_kind.h>
#include <dkit/data/dataset.h>
#include <dkit/data/loader.h>
#include <dkit/device/device.h>
#include <dkit/metrics/metrics.h>
#include <dkit/model/mlp.h>
#include <dkit/train/amp.h>
#include <dkit/train/step.h>

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dkit::bench::detail {

/// The benchmark MLP: [kFeatures, 256, 256, kClasses], ReLU, no dropout.
inline constexpr int64_t kFeatures = 64;
/// Classes of the benchmark data.
inline constexpr int64_t kClasses = 10;
/// Steps between the runner's metric flushes.
inline constexpr int64_t kLogEvery = 20;

/// The hidden widths of the benchmark MLP.
const std::vector<int64_t>& hidden_sizes();

/// Sum over the layers of in * out: the multiply-adds of one sample's forward pass.
int64_t weight_products();

/// Weights and biases of the benchmark MLP.
int64_t parameter_count();

/// The floating-point operations of one step's matrix products at `batch` rows: 2 * batch * in * out for the
/// forward product of each layer and for its weight gradient, and for its input gradient except the first layer's.
double matmul_flops(int64_t batch);

/// An optimizer as the benchmarks set it up, on both sides.
struct BenchOptimizer {
  /// Its name in tables, e.g. `sgd-nesterov`.
  std::string name;
  /// Which optimizer.
  OptimizerKind kind = OptimizerKind::kSgd;
  /// Learning rate.
  double lr = 0.0;
  /// SGD's momentum.
  double momentum = 0.0;
  /// SGD's Nesterov momentum.
  bool nesterov = false;
  /// SGD's and Adam's L2 penalty, AdamW's decoupled decay.
  double weight_decay = 0.0;

  /// The optimizer over `params`: dkit's fused one (FusedSGD, FusedAdam, FusedAdamW) or LibTorch's own.
  std::unique_ptr<torch::optim::Optimizer> make(const std::vector<at::Tensor>& params, bool fused) const;
  /// The arguments that give mlp_train.py the same optimizer.
  std::vector<std::string> python_arguments() const;
  /// `SGD(lr=0.05, momentum=0.9, nesterov=True)` and the like.
  std::string describe() const;
};

/// The optimizer of bench_optimizers() called `name`; an internal error when there is none.
const BenchOptimizer& find_bench_optimizer(std::string_view name);

/// The optimizers of the `optimizers` suite: SGD plain (lr 0.05), with momentum 0.9, with Nesterov momentum and
/// weight decay 5e-4; Adam (lr 1e-3); AdamW (lr 1e-3, weight decay 0.01).
const std::vector<BenchOptimizer>& bench_optimizers();

/// dkit's training step as dkit::Trainer runs it: its Loader, an Mlp, an optimizer, TrainStep (or a CUDA graph
/// step) in a precision (float16 with a GradScaler, as `train.precision`) and a MetricBuffer flushed every kLogEvery
/// steps, stepping through the data epoch after epoch.
class TrainRunner {
 public:
  /// A runner over `data` on `device` at `batch` rows per step, with `optimizer` (dkit's fused one when `fused`);
  /// `graph` takes the CUDA graph step (CUDA builds, Adam and float32 only). An error when this LibTorch has no
  /// autocast in `precision` on the device.
  TrainRunner(const Dataset& data, const Device& device, int64_t batch, Placement placement,
              const BenchOptimizer& optimizer, bool fused, bool graph, Precision precision = Precision::kFloat32);

  /// Whether the loader pins its buffers.
  bool pinned() const;

  /// One training step.
  void step();

 private:
  Loader loader_;
  int64_t epoch_ = 0;
  Mlp model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<GradScaler> scaler_;
  std::optional<TrainStep> step_;
#if DKIT_WITH_CUDA
  std::unique_ptr<CudaGraphStep> graph_;
#endif
  MetricBuffer metrics_;
};

/// The matrix products of one training step of the benchmark MLP alone, at the same shapes and with the same
/// operand layouts as TrainStep's written-out step: per layer the forward product, the weight gradient and (but
/// for the first layer) the input gradient, into buffers kept from call to call.
class MatmulLimit {
 public:
  /// The products of a step of `batch` rows on `device`, in `dtype` (autocast's products are bfloat16 or float16).
  MatmulLimit(const Device& device, int64_t batch, c10::ScalarType dtype = c10::kFloat);

  /// One step's products.
  void step();

 private:
  std::vector<at::Tensor> weights_;
  std::vector<at::Tensor> inputs_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> output_grads_;
  std::vector<at::Tensor> weight_grads_;
  std::vector<at::Tensor> input_grads_;
};

/// Something timed in turns with others: one call of `step` is one training step, or one call of `timed` times
/// a number of steps by itself (another process that has warmed up by itself).
struct TimedVariant {
  /// A variant called `variant_name`, reading its data from `variant_data`, whose `one_step` is one step.
  TimedVariant(std::string variant_name, std::string variant_data, std::function<void()> one_step)
      : name(std::move(variant_name)), data(std::move(variant_data)), step(std::move(one_step)) {}

  /// A variant called `variant_name` whose `time_steps(n)` runs n steps and returns the seconds they took.
  TimedVariant(std::string variant_name, std::function<double(int64_t)> time_steps)
      : name(std::move(variant_name)), timed(std::move(time_steps)) {}

  /// The row's name.
  std::string name;
  /// What it reads its data from, for the table.
  std::string data;
  /// One step.
  std::function<void()> step;
  /// Runs and times that many steps (instead of `step`).
  std::function<double(int64_t)> timed;
  /// Steps per timed sample, found by time_in_turns().
  int64_t iterations = 1;
  /// Seconds per step of each sample.
  std::vector<double> samples;
};

/// Times the variants in turns, sample by sample, so that a change in the machine's load hits them alike: 10
/// warm-up steps each, then `steps` steps per sample (0: enough for `min_sample_seconds`), `repeat` samples. A
/// variant with `timed` warms up by itself and runs as many steps per sample as the first variant (at least 3).
void time_in_turns(std::vector<TimedVariant>& variants, const Device& device, int64_t steps, int64_t repeat,
                   double min_sample_seconds);

/// mlp_train.py in `--serve` mode: a PyTorch process, warmed up, that times runs of the steps it is asked for, so
/// that its samples can be taken in turns with dkit's (TimedVariant::timed).
class PythonServer {
 public:
  /// Starts `script` with `python` and `arguments` (`--serve` added) and waits for it to report ready; on failure
  /// error() says why.
  PythonServer(const std::string& python, const std::string& script, const std::vector<std::string>& arguments);
  /// Closes its input, so that it ends, and waits for it.
  ~PythonServer();
  PythonServer(const PythonServer&) = delete;
  PythonServer& operator=(const PythonServer&) = delete;

  /// Why it failed (to start, or later); empty while it works.
  const std::string& error() const;
  /// PyTorch's version, as the script reported it.
  const std::string& torch_version() const;
  /// Runs `steps` steps and returns their seconds as the process measured them; NaN, with error() set, when it
  /// failed.
  double time_steps(int64_t steps);

 private:
  std::string read_json_line();
  void fail(const std::string& why);

  std::string python_;
  std::string script_;
  int pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;
  std::string last_other_;
  std::string error_;
  std::string torch_version_;
};

/// How many PyTorch processes the samples of one row come from, at most, where a suite takes them in turns with
/// dkit's: on some machines a process keeps a speed of its own for its whole life (docs/benchmarks.md, "How dkit
/// measures"), so the samples of one process would be a single draw of that speed.
inline constexpr int64_t kPythonProcesses = 3;

/// PyTorch's untimed steps in each process before a row's first sample at `batch` rows (dkit's variants take 10,
/// then calibrate): a fixed count, fewer at batches where that many would pass a fixed count of samples, never
/// under 10; python_warmup_words() names the counts.
int64_t python_warmup(int64_t batch);

/// How the notes say python_warmup(), with its counts: `N warm-up steps (M samples at larger batches, ...)`.
std::string python_warmup_words();

/// Several PythonServer processes of the same arguments, each warmed up, that answer in rotation: time_steps()
/// asks the next one.
class PythonServers {
 public:
  /// Starts `processes` (at least 1) PythonServers of `script` with `python` and `arguments`, one after another;
  /// stops at the first that fails, and error() says why.
  PythonServers(const std::string& python, const std::string& script, const std::vector<std::string>& arguments,
                int64_t processes);

  /// Why one of them failed (to start, or later); empty while all work.
  const std::string& error() const;
  /// PyTorch's version, as the first one reported it.
  const std::string& torch_version() const;
  /// Runs `steps` steps in the next process and returns their seconds as it measured them; NaN, with error() set,
  /// when it failed.
  double time_steps(int64_t steps);
  /// How many of the processes have answered time_steps().
  int64_t processes_answered() const;

 private:
  std::vector<std::unique_ptr<PythonServer>> servers_;
  std::vector<bool> answered_;
  size_t next_ = 0;
};

/// The PyTorch processes of a suite's rows: how many PythonServers each row starts (kPythonProcesses, or as many as
/// the row's samples where it takes fewer), and the fewest that answered in any row.
class PythonRotation {
 public:
  /// For rows of `repeat` samples each.
  explicit PythonRotation(int64_t repeat);

  /// How many processes a row starts.
  int64_t processes() const;
  /// After a batch size's samples: where one of its `servers` failed, sets `skipped` to `left out: ` and why (the
  /// suites then leave out that batch size's PyTorch rows, so none of its processes is counted); otherwise counts
  /// the processes of each that answered.
  void add(const std::vector<std::shared_ptr<PythonServers>>& servers, std::string& skipped);
  /// Adds `python_processes` to `result`'s summary: the fewest processes that answered in a row (none before add()).
  void summarize(SuiteResult& result) const;
  /// How the notes say it: `each row's from N processes in rotation (...)`, or `from one process (...)`.
  std::string words() const;

 private:
  int64_t processes_;
  std::optional<int64_t> fewest_;
};

/// The arguments of mlp_train.py for suite_data(`samples`)'s recipe (`--data blobs:...`) at `batch` on `device`,
/// `warmup` steps first, the loops `loops`, the threads LibTorch uses here.
std::vector<std::string> python_arguments(const Device& device, int64_t batch, int64_t samples, int64_t warmup,
                                          const std::string& loops);

/// The PyTorch side a suite runs, from SuiteOptions::python() and python_script().
struct PythonSide {
  /// The interpreter: the one given, else `/usr/bin/python3` when it exists, else `python3`.
  std::string python;
  /// The script: the one given, else mlp_train.py beside the running program, else where `cmake --install` puts
  /// it relative to the program.
  std::string script;
  /// Why PyTorch is left out (`left out (--python none)`, no script); empty when it runs.
  std::string skipped;
};

/// The PyTorch side `options` ask for.
PythonSide python_side(const SuiteOptions& options);

/// What the `train`, `optimizers` and `precision` suites resolve from SuiteOptions before they time anything.
struct TrainSuiteSetup {
  /// The batch sizes: `options.sizes()`, or the suite's defaults; each checked positive.
  std::vector<int64_t> sizes;
  /// Timed samples per variant: `options.repeat()`, or 5 (3 with `quick`).
  int64_t repeat = 0;
  /// The shortest timed sample when `options.steps()` is 0: 0.25 s (0.05 s with `quick`).
  double min_sample_seconds = 0;
  /// Synthetic samples: at least 4,096 and four times the largest batch.
  int64_t samples = 0;
  /// The synthetic data set: make_synthetic(suite_data(samples)).
  Dataset data;
  /// The PyTorch side.
  PythonSide python;
};

/// The synthetic data the training suites run on, `samples` rows: Gaussian blobs kFeatures wide with kClasses
/// classes, seed 0, the rest SyntheticOptions' defaults. The PyTorch side draws the same recipe (python_arguments()).
SyntheticOptions suite_data(int64_t samples);

/// The setup of a suite run with `options`, whose default batch sizes are `defaults` (`quick_defaults` with
/// `quick`).
TrainSuiteSetup train_suite_setup(const SuiteOptions& options, std::vector<int64_t> defaults,
                                  std::vector<int64_t> quick_defaults);

} // namespace dkit::bench::detail
