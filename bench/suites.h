#pragma once

#include <dkit/bench/table.h>
#include <dkit/device/device.h>

#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dkit::bench {

/// What `dkit bench` passes to every suite. Each suite reads the fields that mean something to it and keeps its
/// own defaults for those left at zero or empty. Example:
/// ```
/// auto result = dkit::bench::bench_matmul(SuiteOptions().sizes({50, 100}).repeat(3));
/// ```
struct SuiteOptions {
  /// Devices to measure; empty for every device the suite supports (the CPU and each GPU).
  TORCH_ARG(std::vector<Device>, devices) = {};
  /// Timed samples per case after the warm-up; 0 for the suite's default.
  TORCH_ARG(int64_t, repeat) = 0;
  /// Problem sizes to sweep: matrix sides (matmul, logging, multi-gpu), bytes (transfer), batch sizes (train, optimizers);
  /// empty for the suite's default.
  TORCH_ARG(std::vector<int64_t>, sizes) = {};
  /// Steps in one timed run, for suites that time a loop (logging: 1000; train: enough steps for a quarter of a
  /// second); 0 for the suite's default.
  TORCH_ARG(int64_t, steps) = 0;
  /// Smaller default sizes and fewer steps, for a run of seconds rather than minutes.
  TORCH_ARG(bool, quick) = false;
  /// Python interpreter for the `train`, `optimizers` and `precision` suites' PyTorch side
  /// (bench/python/mlp_train.py); empty for `/usr/bin/python3` when it exists, else `python3` from the PATH; `none`
  /// to leave PyTorch out.
  TORCH_ARG(std::string, python) = "";
  /// The `train`, `optimizers` and `precision` suites' Python script; empty for `mlp_train.py` beside the running
  /// program (where the build copies bench/python/mlp_train.py), else `../share/dkit/mlp_train.py` relative to it
  /// (where `cmake --install` puts it).
  TORCH_ARG(std::string, python_script) = "";
  /// Called with a line as each case starts, so that a long run shows progress; empty for silence.
  TORCH_ARG(std::function<void(const std::string&)>, progress) = nullptr;
};

/// A benchmark suite that `dkit bench NAME` can run.
struct Suite {
  /// The name on the command line, e.g. `matmul`.
  std::string name;
  /// One line for `dkit bench --help`.
  std::string summary;
  /// Why this machine (with these options) cannot run the suite, e.g. `needs 2 GPUs, found 0`; empty when it
  /// can. Null when it always can.
  std::function<std::string(const SuiteOptions&)> unsupported;
  /// Runs the suite.
  std::function<SuiteResult(const SuiteOptions&)> run;
};

/// The devices a suite that runs on the CPU and on GPUs measures: `options.devices()`, or the CPU and every GPU
/// when it is empty; `cuda` without an index becomes `cuda:0`. A device that is not available is an error naming
/// it and the available ones.
std::vector<Device> suite_devices(const SuiteOptions& options);

/// Passes `line` to `options.progress()` when one is set.
void report_progress(const SuiteOptions& options, const std::string& line);

/// The registered suites, in the order `all` runs them: the built-in ones, then those added by register_suite().
/// A new built-in suite (such as `train`) is a `SuiteResult bench_NAME(const SuiteOptions&)` declared here and one
/// entry in the list in suites.cpp's registry(), with an `unsupported` function when some machines cannot run it;
/// `dkit bench NAME`, `dkit bench all`, `--help` and the outputs then pick it up.
const std::vector<Suite>& suites();

/// Adds a suite; its name must be new and not `all`.
void register_suite(Suite suite);

/// The suite called `name`, or null.
const Suite* try_find_suite(std::string_view name);

/// The suite called `name`; an error listing the registered names when there is none.
const Suite& find_suite(std::string_view name);

/// Runs the suite called `name`, or with `all` every registered suite in turn. A suite this machine cannot run
/// is not started: its result is SuiteResult::skipped() with the reason.
std::vector<SuiteResult> run_suites(std::string_view name, const SuiteOptions& options);

/// `matmul`: square matrix products at `sizes` (default 50 ... 8192) on each device, float32 everywhere and
/// bfloat16 on GPUs; median/min/max seconds, GFLOP/s, the fraction of the device's best rate, the speed-up over
/// the CPU and the size from which each GPU beats it.
SuiteResult bench_matmul(const SuiteOptions& options);

/// `logging`: `steps` (default 1000) matmuls of each size (default 100 and 500) whose Frobenius norm is logged
/// (a) with `.item()` every step, (b) into a preallocated device tensor read once at the end, (c) through a
/// metric buffer flushed in batches; time per step and the ratio to (a).
SuiteResult bench_logging(const SuiteOptions& options);

/// `transfer`: host-to-device and device-to-host copies of 4 KiB ... 1 GiB from pageable memory, pinned memory,
/// and pinned memory with `non_blocking` on a side stream while a compute kernel runs; GB/s and the fraction
/// of the best rate in the run. Needs a CUDA GPU.
SuiteResult bench_transfer(const SuiteOptions& options);

/// `multi-gpu`: two matmuls one after the other on one GPU vs one on each of two GPUs at once; speed-up and
/// scaling efficiency. Needs two GPUs.
SuiteResult bench_multi_gpu(const SuiteOptions& options);

/// `train`: MLP [64, 256, 256, 10] training steps (dkit::TrainStep with FusedAdam, on-device metrics) at batch
/// sizes `sizes` (default 32 ... 8192) on each device: data device-resident vs pageable vs pinned through
/// dkit::Loader, a CUDA-graph step on GPUs, and the same MLP in PyTorch (`python`) side by side; ms per step,
/// samples/s, GFLOP/s and the ratio to PyTorch's faster loop.
SuiteResult bench_train(const SuiteOptions& options);

/// `optimizers`: MLP [64, 256, 256, 10] training steps at batch sizes `sizes` (default 64, 256, 1024) with each
/// optimizer dkit fuses (SGD plain, with momentum, with Nesterov momentum and weight decay; Adam; AdamW): dkit's
/// step with its fused optimizer and with LibTorch's own, the step's matrix products alone (the limit), and
/// PyTorch eager with the same optimizer side by side; ms per step, the ratio to the limit and to PyTorch.
SuiteResult bench_optimizers(const SuiteOptions& options);

/// `precision`: MLP [64, 256, 256, 10] training steps with Adam at batch sizes `sizes` (default 64, 256, 1024) in
/// each precision this LibTorch can autocast to on the device (fp32, bf16, fp16): dkit's step as `train.precision`
/// runs it, the step's matrix products alone in that dtype, and PyTorch eager under torch.autocast side by side;
/// ms per step, the ratio to fp32 and to PyTorch, and the CPU's flags for bfloat16 and float16.
SuiteResult bench_precision(const SuiteOptions& options);

/// `lenet`: d2l's LeNet training steps on the CPU at batch sizes `sizes` (default 64, 256) on Fashion-MNIST (or
/// synthetic images without it): a bare hand-written LibTorch loop, dkit's Trainer with a ModuleTask over the same
/// module and batches, and PyTorch eager side by side; ms per step, the Trainer's cost over the loop, and the ratio
/// to PyTorch. `steps` (default 300) is rounded up to a multiple of 50, the steps between two reads of the loss.
SuiteResult bench_lenet(const SuiteOptions& options);

/// Why `transfer` cannot run with these options; empty when it can.
std::string transfer_unsupported(const SuiteOptions& options);

/// Why `multi-gpu` cannot run with these options (`needs 2 GPUs, found N`); empty when it can.
std::string multi_gpu_unsupported(const SuiteOptions& options);

/// Every result as one JSON document: dkit's and LibTorch's versions, the UTC date and time, the machine (CPU
/// threads, BLAS, GPUs) and each suite's result.
std::string results_to_json(const std::vector<SuiteResult>& results);

/// The CSV files for `--csv PATH`: PATH itself for a single result; `STEM-SUITE.EXT` beside it for each result
/// when there are several (`all`). Pairs of path and contents.
std::vector<std::pair<std::string, std::string>> csv_outputs(const std::string& path,
                                                             const std::vector<SuiteResult>& results);

/// Writes `text` to `path`, replacing it; an error naming the file when it cannot.
void write_text_file(const std::string& path, const std::string& text);

} // namespace dkit::bench
