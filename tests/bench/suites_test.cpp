#include <dkit/bench/suites.h>

#include "../support.h"

#include <dkit/config.h>
#include <dkit/core/compat.h>
#include <dkit/core/format.h>
#include <dkit/device/report.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dkit::bench {
namespace {

using ::dkit::test::error_message;

class SuitesTest : public test::SeedingFixture {};

std::string text_of(const Cell& cell) {
  return std::get<std::string>(cell);
}

int64_t integer_of(const Cell& cell) {
  return std::get<int64_t>(cell);
}

// The summary entry `name` of `result`; a failure, and an empty cell, when there is none.
Cell summary_of(const SuiteResult& result, const std::string& name) {
  const auto it = std::find_if(result.summary.begin(), result.summary.end(),
                               [&](const auto& entry) { return entry.first == name; });
  if (it == result.summary.end()) {
    ADD_FAILURE() << "no summary entry '" << name << "'";
    return {};
  }
  return it->second;
}

TEST_F(SuitesTest, MatmulRunsTinySizesOnTheCpu) {
  std::string progress;
  const SuiteResult result = bench_matmul(SuiteOptions().devices({cpu()}).sizes({8, 16}).repeat(2).progress(
      [&](const std::string& line) { progress += line + "\n"; }));
  ASSERT_TRUE(result.ran());
  EXPECT_EQ(result.suite, "matmul");
  const ResultTable& table = result.table;
  ASSERT_EQ(table.rows().size(), 2u);
  EXPECT_EQ(text_of(table.at(0, "device")), "cpu");
  EXPECT_EQ(text_of(table.at(0, "dtype")), "float32");
  EXPECT_EQ(integer_of(table.at(0, "n")), 8);
  EXPECT_EQ(integer_of(table.at(1, "n")), 16);
  EXPECT_EQ(integer_of(table.at(1, "repeat")), 2);
  EXPECT_TRUE(std::holds_alternative<double>(table.at(1, "gflops")));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(table.at(1, "vs_cpu")));
  const double best_fraction =
      std::max(std::get<double>(table.at(0, "of_best")), std::get<double>(table.at(1, "of_best")));
  EXPECT_EQ(best_fraction, 1.0);
  EXPECT_EQ(progress, "matmul: cpu float32 n=8\nmatmul: cpu float32 n=16\n");
  EXPECT_EQ(result.notes.back(), "no GPU in this run, so no size at which a GPU overtakes the CPU");
  EXPECT_EQ(result.summary.front().first, "cpu_threads");
}

TEST_F(SuitesTest, DefaultDevicesAreTheCpuAndEveryGpu) {
  const std::vector<Device> devices = suite_devices(SuiteOptions());
  ASSERT_EQ(static_cast<int64_t>(devices.size()), 1 + num_gpus());
  EXPECT_EQ(devices.front(), cpu());
  EXPECT_EQ(suite_devices(SuiteOptions().devices({cpu()})), std::vector<Device>{cpu()});
}

TEST_F(SuitesTest, AnUnavailableDeviceIsNamed) {
  if (num_gpus() > 7) {
    GTEST_SKIP() << "cuda:7 exists here";
  }
  EXPECT_EQ(error_message([] { suite_devices(SuiteOptions().devices({gpu(7)})); }),
            "cannot benchmark on 'cuda:7': not available; available devices: " + available_devices());
}

TEST_F(SuitesTest, MatmulRejectsNonPositiveSizes) {
  EXPECT_EQ(error_message([] { bench_matmul(SuiteOptions().devices({cpu()}).sizes({8, 0})); }),
            "sizes must be positive, got 0");
}

TEST_F(SuitesTest, LoggingRunsTheThreeVariantsAtTinySizes) {
  const SuiteResult result = bench_logging(SuiteOptions().devices({cpu()}).sizes({4}).steps(20).repeat(2));
  ASSERT_TRUE(result.ran());
  const ResultTable& table = result.table;
  ASSERT_EQ(table.rows().size(), 3u);
  EXPECT_EQ(text_of(table.at(0, "variant")), "a:item_every_step");
  EXPECT_EQ(text_of(table.at(1, "variant")), "b:device_tensor");
  EXPECT_EQ(text_of(table.at(2, "variant")), "c:metric_buffer");
  EXPECT_EQ(integer_of(table.at(0, "host_reads")), 20);
  EXPECT_EQ(integer_of(table.at(1, "host_reads")), 1);
  EXPECT_EQ(integer_of(table.at(2, "host_reads")), 1);
  EXPECT_EQ(integer_of(table.at(2, "steps")), 20);
  EXPECT_EQ(integer_of(table.at(2, "repeat")), 2);
  EXPECT_EQ(std::get<double>(table.at(0, "speedup_vs_item")), 1.0);
  EXPECT_EQ(result.notes.size(), 2u);
}

TEST_F(SuitesTest, LoggingFlushesTheMetricBufferInBatches) {
  const SuiteResult result = bench_logging(SuiteOptions().devices({cpu()}).sizes({4}).steps(250).repeat(1));
  EXPECT_EQ(integer_of(result.table.at(2, "host_reads")), 3);
}

TEST_F(SuitesTest, TrainRunsTinyBatchesOnTheCpu) {
  std::string progress;
  const SuiteResult result =
      bench_train(SuiteOptions().devices({cpu()}).sizes({4, 8}).steps(3).repeat(2).python("none").progress(
          [&](const std::string& line) { progress += line + "\n"; }));
  ASSERT_TRUE(result.ran());
  EXPECT_EQ(result.suite, "train");
  const ResultTable& table = result.table;
  ASSERT_EQ(table.rows().size(), 6u);
  EXPECT_EQ(text_of(table.at(0, "device")), "cpu");
  EXPECT_EQ(integer_of(table.at(0, "batch")), 4);
  EXPECT_EQ(integer_of(table.at(3, "batch")), 8);
  EXPECT_EQ(text_of(table.at(0, "variant")), "eager/device");
  EXPECT_EQ(text_of(table.at(1, "variant")), "eager/pageable");
  EXPECT_EQ(text_of(table.at(2, "variant")), "eager/pinned-fallback");
  EXPECT_EQ(text_of(table.at(2, "data")), "ordinary host buffers (no pinning without CUDA)");
  EXPECT_EQ(integer_of(table.at(1, "steps")), 3);
  EXPECT_EQ(integer_of(table.at(1, "repeat")), 2);
  EXPECT_TRUE(std::holds_alternative<double>(table.at(4, "samples_per_s")));
  EXPECT_TRUE(std::holds_alternative<double>(table.at(4, "gflops")));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(table.at(4, "vs_pytorch")));
  EXPECT_EQ(progress, "train: cpu batch 4\ntrain: cpu batch 8\n");
  EXPECT_EQ(result.notes.back(), "PyTorch comparison left out (--python none)");
  EXPECT_NE(result.description.find("6 * batch * 84480 + 13 * 85002 for Adam"), std::string::npos);
}

TEST_F(SuitesTest, LenetTimesTheTrainerBesideTheBareLoop) {
  const SuiteResult result =
      bench_lenet(SuiteOptions().devices({cpu()}).sizes({8}).steps(30).repeat(1).python("none"));
  ASSERT_TRUE(result.ran());
  const ResultTable& table = result.table;
  ASSERT_EQ(table.rows().size(), 2u);
  EXPECT_EQ(text_of(table.at(0, "variant")), "libtorch-loop");
  EXPECT_EQ(text_of(table.at(1, "variant")), "dkit-trainer");
  EXPECT_EQ(integer_of(table.at(1, "batch")), 8);
  EXPECT_EQ(integer_of(table.at(1, "steps")), 50);
  EXPECT_GT(std::get<double>(table.at(1, "samples_per_s")), 0.0);
  EXPECT_DOUBLE_EQ(std::get<double>(table.at(0, "vs_loop")), 1.0);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(table.at(1, "vs_pytorch")));
  EXPECT_EQ(result.notes.back(), "PyTorch comparison left out (--python none)");
}

TEST_F(SuitesTest, TrainSaysWhyThePyTorchSideIsMissing) {
  const SuiteResult result = bench_train(
      SuiteOptions().devices({cpu()}).sizes({4}).steps(2).repeat(1).python_script("/nonexistent/mlp_train.py"));
  EXPECT_EQ(result.table.rows().size(), 3u);
  EXPECT_EQ(result.notes.back(),
            "PyTorch comparison left out: no script at '/nonexistent/mlp_train.py' (give --python-script)");
  const SuiteResult failing =
      bench_train(SuiteOptions().devices({cpu()}).sizes({4}).steps(2).repeat(1).python("/bin/false"));
  EXPECT_EQ(failing.table.rows().size(), 3u);
  EXPECT_EQ(failing.notes.back().rfind("PyTorch comparison left out: /bin/false ", 0), 0u) << failing.notes.back();
  EXPECT_NE(failing.notes.back().find(" --serve did not start (exit status 1)"), std::string::npos)
      << failing.notes.back();
}

TEST_F(SuitesTest, TrainRunsThePythonSideWithoutAShell) {
  test::TempDir dir;
  const std::string script = dir.file("it's a \"script\" $HOME.py");
  std::ofstream(script) << "\n";
  const SuiteResult echoed = bench_train(
      SuiteOptions().devices({cpu()}).sizes({4}).steps(2).repeat(1).python("/bin/echo").python_script(script));
  const std::string prefix = "PyTorch comparison left out: /bin/echo " + script +
                             " --serve did not start (exit status 0): " + script +
                             " --data blobs:4096:64:10:0.5 --hidden 256,256 --batch 4 --warmup 100 ";
  EXPECT_EQ(echoed.notes.back().rfind(prefix, 0), 0u) << echoed.notes.back();
  const SuiteResult large = bench_train(
      SuiteOptions().devices({cpu()}).sizes({2048}).steps(2).repeat(1).python("/bin/echo").python_script(script));
  EXPECT_NE(large.notes.back().find(" --data blobs:8192:64:10:0.5 --hidden 256,256 --batch 2048 --warmup 12 "),
            std::string::npos)
      << large.notes.back();
  const SuiteResult missing =
      bench_train(SuiteOptions().devices({cpu()}).sizes({4}).steps(2).repeat(1).python("/nonexistent/python3"));
  EXPECT_EQ(missing.notes.back(),
            "PyTorch comparison left out: cannot run /nonexistent/python3: No such file or directory");
}

TEST_F(SuitesTest, TrainRunsPyTorchBesideDkitWhenThereIsAPythonWithTorch) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with torch";
  }
  const SuiteResult result =
      bench_train(SuiteOptions().devices({cpu()}).sizes({8}).steps(3).repeat(2).python("/usr/bin/python3"));
  const ResultTable& table = result.table;
  ASSERT_EQ(table.rows().size(), 5u);
  EXPECT_EQ(text_of(table.at(3, "variant")), "pytorch/slicing");
  EXPECT_EQ(text_of(table.at(3, "data")), "device-resident");
  EXPECT_EQ(text_of(table.at(4, "variant")), "pytorch/dataloader");
  EXPECT_EQ(text_of(table.at(4, "data")), "DataLoader(TensorDataset)");
  EXPECT_EQ(integer_of(table.at(3, "steps")), 3);
  EXPECT_EQ(integer_of(table.at(3, "repeat")), 2);
  EXPECT_EQ(integer_of(table.at(4, "repeat")), 2);
  EXPECT_TRUE(std::holds_alternative<double>(table.at(0, "vs_pytorch")));
  EXPECT_TRUE(std::holds_alternative<double>(table.at(4, "samples_per_s")));
  EXPECT_EQ(result.notes.front().rfind("cpu batch 8: dkit eager/", 0), 0u) << result.notes.front();
  EXPECT_EQ(integer_of(summary_of(result, "python_processes")), 2);
  const std::string& note = result.notes.back();
  EXPECT_EQ(note.rfind("pytorch/*: the same MLP, optimizer and loss in PyTorch ", 0), 0u) << note;
  const std::string rotation = "after 100 warm-up steps (25600 samples at larger batches, at least 10 steps), its "
                               "samples taken in turns with dkit's, each row's from 2 processes in rotation (a "
                               "process may keep a speed of its own for its whole life)";
  EXPECT_EQ(note.substr(note.size() - std::min(note.size(), rotation.size())), rotation) << note;
}

TEST_F(SuitesTest, OptimizersTimesEachFusedOptimizerAgainstLibTorchsAndTheMatmulLimit) {
  std::string progress;
  const SuiteResult result =
      bench_optimizers(SuiteOptions().devices({cpu()}).sizes({4, 8}).steps(3).repeat(2).python("none").progress(
          [&](const std::string& line) { progress += line + "\n"; }));
  ASSERT_TRUE(result.ran());
  EXPECT_EQ(result.suite, "optimizers");
  const ResultTable& table = result.table;
  const std::vector<std::string> optimizers = {"sgd", "sgd-momentum", "sgd-nesterov-wd", "adam", "adamw"};
  ASSERT_EQ(table.rows().size(), 2 * optimizers.size() * 3);
  std::string expected_progress;
  size_t row = 0;
  for (const int64_t batch : {4, 8}) {
    for (const auto& optimizer : optimizers) {
      expected_progress += "optimizers: cpu batch " + std::to_string(batch) + " " + optimizer + "\n";
      for (const char* variant : {"dkit", "dkit/libtorch-optimizer", "matmul-limit"}) {
        SCOPED_TRACE(::testing::Message() << "row " << row);
        EXPECT_EQ(integer_of(table.at(row, "batch")), batch);
        EXPECT_EQ(text_of(table.at(row, "optimizer")), optimizer);
        EXPECT_EQ(text_of(table.at(row, "variant")), variant);
        EXPECT_EQ(integer_of(table.at(row, "steps")), 3);
        EXPECT_EQ(integer_of(table.at(row, "repeat")), 2);
        EXPECT_TRUE(std::holds_alternative<std::monostate>(table.at(row, "vs_pytorch")));
        ++row;
      }
      EXPECT_EQ(std::get<double>(table.at(row - 1, "vs_limit")), 1.0);
    }
  }
  EXPECT_EQ(progress, expected_progress);
  const double step_fastest = std::get<double>(table.at(0, "min_ms"));
  const double limit_fastest = std::get<double>(table.at(2, "min_ms"));
  EXPECT_EQ(result.notes.front(), "cpu batch 4 sgd: dkit's step " +
                                      format_fixed(std::get<double>(table.at(0, "median_ms")), 3) + " ms, " +
                                      format_fixed(std::get<double>(table.at(0, "vs_limit")), 2) +
                                      "x its matrix products alone (" +
                                      format_fixed(std::get<double>(table.at(2, "median_ms")), 3) +
                                      " ms; fastest samples " + format_fixed(step_fastest / limit_fastest, 2) + "x)");
  EXPECT_EQ(result.notes.back(), "PyTorch comparison left out (--python none)");
  EXPECT_NE(std::find(result.notes.begin(), result.notes.end(),
                      "optimizers: sgd = SGD(lr=0.05), sgd-momentum = SGD(lr=0.05, momentum=0.9), sgd-nesterov-wd = "
                      "SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-04), adam = Adam(lr=0.001), "
                      "adamw = AdamW(lr=0.001, weight_decay=0.01)"),
            result.notes.end());
}

TEST_F(SuitesTest, OptimizersSaysWhyThePyTorchSideIsMissing) {
  const SuiteResult result =
      bench_optimizers(SuiteOptions().devices({cpu()}).sizes({4}).steps(2).repeat(1).python("/bin/false"));
  EXPECT_EQ(result.table.rows().size(), 5u * 3u);
  EXPECT_EQ(result.notes.back().rfind("PyTorch comparison left out: /bin/false ", 0), 0u) << result.notes.back();
  EXPECT_NE(result.notes.back().find(" --serve did not start (exit status 1)"), std::string::npos)
      << result.notes.back();
}

TEST_F(SuitesTest, OptimizersRunsPyTorchWithTheSameOptimizerWhenThereIsAPythonWithTorch) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with torch";
  }
  const SuiteResult result =
      bench_optimizers(SuiteOptions().devices({cpu()}).sizes({8}).steps(2).repeat(1).python("/usr/bin/python3"));
  const ResultTable& table = result.table;
  ASSERT_EQ(table.rows().size(), 5u * 4u);
  for (size_t optimizer = 0; optimizer < 5; ++optimizer) {
    SCOPED_TRACE(::testing::Message() << "optimizer " << optimizer);
    EXPECT_EQ(text_of(table.at(4 * optimizer + 3, "variant")), "pytorch/slicing");
    EXPECT_EQ(integer_of(table.at(4 * optimizer + 3, "steps")), 3) << "at least 3 steps";
    EXPECT_TRUE(std::holds_alternative<double>(table.at(4 * optimizer, "vs_pytorch")));
  }
  EXPECT_EQ(result.notes.back().rfind("pytorch/slicing: the same MLP, optimizer and loss in PyTorch ", 0), 0u)
      << result.notes.back();
  const std::string one_process = "its samples taken in turns with dkit's, each row's from one process (a process "
                                  "may keep a speed of its own for its whole life)";
  EXPECT_EQ(result.notes.back().substr(result.notes.back().size() - one_process.size()), one_process)
      << result.notes.back();
  EXPECT_EQ(integer_of(summary_of(result, "python_processes")), 1);
  const double fastest = std::get<double>(table.at(3, "min_ms")) / std::get<double>(table.at(0, "min_ms"));
  EXPECT_NE(result.notes.front().find("x PyTorch's samples/s (fastest samples " + format_fixed(fastest, 2) + "x)"),
            std::string::npos)
      << result.notes.front();
}

// The precisions this LibTorch can autocast to on the CPU, as the `precision` suite should find them.
std::vector<std::string> cpu_precisions() {
  std::vector<std::string> names = {"fp32", "bf16"};
  if (compat::kCpuAutocastFloat16) {
    names.emplace_back("fp16");
  }
  return names;
}

TEST_F(SuitesTest, PrecisionTimesEachPrecisionAndItsProductsAgainstFp32) {
  std::string progress;
  const SuiteResult result =
      bench_precision(SuiteOptions().devices({cpu()}).sizes({4, 8}).steps(3).repeat(2).python("none").progress(
          [&](const std::string& line) { progress += line + "\n"; }));
  ASSERT_TRUE(result.ran());
  EXPECT_EQ(result.suite, "precision");
  EXPECT_EQ(progress, "precision: cpu batch 4\nprecision: cpu batch 8\n");
  const ResultTable& table = result.table;
  const std::vector<std::string> precisions = cpu_precisions();
  ASSERT_EQ(table.rows().size(), 2 * precisions.size() * 2);
  size_t row = 0;
  for (const int64_t batch : {4, 8}) {
    for (const auto& precision : precisions) {
      for (const char* variant : {"dkit", "matmul"}) {
        SCOPED_TRACE(::testing::Message() << "row " << row);
        EXPECT_EQ(integer_of(table.at(row, "batch")), batch);
        EXPECT_EQ(text_of(table.at(row, "precision")), precision);
        EXPECT_EQ(text_of(table.at(row, "variant")), variant);
        EXPECT_EQ(integer_of(table.at(row, "steps")), 3);
        EXPECT_EQ(integer_of(table.at(row, "repeat")), 2);
        const double fp32_median = std::get<double>(table.at(row - row % (2 * precisions.size()) + row % 2,
                                                             "median_ms"));
        EXPECT_DOUBLE_EQ(std::get<double>(table.at(row, "vs_fp32")),
                         fp32_median / std::get<double>(table.at(row, "median_ms")));
        EXPECT_TRUE(std::holds_alternative<std::monostate>(table.at(row, "vs_pytorch")));
        ++row;
      }
    }
  }
  const double dkit_ratio = std::get<double>(table.at(2, "vs_fp32"));
  const double matmul_ratio = std::get<double>(table.at(3, "vs_fp32"));
  EXPECT_EQ(result.notes.front(), "cpu batch 4: bf16 trains at " + format_fixed(dkit_ratio, 2) +
                                      "x fp32's samples/s in dkit; its matrix products alone run at " +
                                      format_fixed(matmul_ratio, 2) + "x fp32's");
  EXPECT_NE(std::find_if(result.notes.begin(), result.notes.end(),
                         [](const std::string& note) {
                           return note.rfind("CPU flags for bfloat16 and float16 (/proc/cpuinfo): avx512_bf16 ", 0) ==
                                  0;
                         }),
            result.notes.end());
  if (!compat::kCpuAutocastFloat16) {
    EXPECT_NE(std::find(result.notes.begin(), result.notes.end(),
                        std::string("cpu fp16: left out: autocast in float16 on the cpu needs LibTorch 2.2 or later "
                                    "(this is ") +
                            TORCH_VERSION + "): use bfloat16 on the cpu"),
              result.notes.end());
  }
  EXPECT_EQ(result.notes.back(), "PyTorch comparison left out (--python none)");
}

TEST_F(SuitesTest, PrecisionRunsPyTorchUnderAutocastWhenThereIsAPythonWithTorch) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no /usr/bin/python3 with torch";
  }
  const SuiteResult result =
      bench_precision(SuiteOptions().devices({cpu()}).sizes({8}).steps(2).repeat(2).python("/usr/bin/python3"));
  const ResultTable& table = result.table;
  ASSERT_GE(table.rows().size(), 6u);
  EXPECT_EQ(text_of(table.at(2, "variant")), "pytorch");
  EXPECT_EQ(text_of(table.at(2, "precision")), "fp32");
  EXPECT_EQ(text_of(table.at(5, "variant")), "pytorch");
  EXPECT_EQ(text_of(table.at(5, "precision")), "bf16");
  EXPECT_DOUBLE_EQ(std::get<double>(table.at(3, "vs_pytorch")),
            std::get<double>(table.at(5, "median_ms")) / std::get<double>(table.at(3, "median_ms")));
  EXPECT_DOUBLE_EQ(std::get<double>(table.at(5, "vs_fp32")),
            std::get<double>(table.at(2, "median_ms")) / std::get<double>(table.at(5, "median_ms")));
  EXPECT_NE(result.notes.front().find("x fp32's samples/s in dkit, "), std::string::npos) << result.notes.front();
  EXPECT_EQ(result.notes.back().rfind("pytorch: the same MLP, Adam and loss in PyTorch ", 0), 0u)
      << result.notes.back();
  // Two samples a row, each from a process of its own: both processes of every PyTorch row answered.
  EXPECT_EQ(integer_of(table.at(5, "repeat")), 2);
  EXPECT_EQ(integer_of(summary_of(result, "python_processes")), 2);
  const std::string two_processes = "its samples taken in turns with dkit's, each row's from 2 processes in rotation "
                                    "(a process may keep a speed of its own for its whole life)";
  EXPECT_EQ(result.notes.back().substr(result.notes.back().size() - two_processes.size()), two_processes)
      << result.notes.back();
}

TEST_F(SuitesTest, TransferReportsWhyItNeedsAGpu) {
  if (num_gpus() > 0) {
    GTEST_SKIP() << "a GPU is visible";
  }
  const SuiteResult result = bench_transfer(SuiteOptions());
  EXPECT_FALSE(result.ran());
  EXPECT_EQ(result.status, "skipped");
  EXPECT_EQ(result.reason, "needs a CUDA GPU: " + cuda_unavailable_reason());
  EXPECT_EQ(text_of(result.table.at(0, "reason")), result.reason);
}

TEST_F(SuitesTest, TransferWithOnlyTheCpuSelectedIsSkipped) {
  const std::string why = transfer_unsupported(SuiteOptions().devices({cpu()}));
  EXPECT_EQ(why, num_gpus() == 0 ? "needs a CUDA GPU: " + cuda_unavailable_reason()
                                 : "needs a CUDA GPU, and --device selected none");
}

TEST_F(SuitesTest, MultiGpuSaysItNeedsTwoGpus) {
  const SuiteResult result = bench_multi_gpu(SuiteOptions().devices({cpu()}));
  EXPECT_FALSE(result.ran());
  if (num_gpus() == 0) {
    EXPECT_EQ(result.reason, "needs 2 GPUs, found 0: " + cuda_unavailable_reason());
  } else {
    EXPECT_EQ(result.reason, "needs 2 GPUs, found 0 among the devices selected");
  }
  EXPECT_EQ(format_result(result), "multi-gpu: skipped: " + result.reason + "\n");
}

TEST_F(SuitesTest, AllRunsEverySupportedSuiteAndListsTheOthers) {
  std::string progress;
  const std::vector<SuiteResult> results =
      run_suites("all", SuiteOptions().devices({cpu()}).sizes({4}).steps(5).repeat(1).python("none").progress(
                            [&](const std::string& line) { progress += line + "\n"; }));
  ASSERT_GE(results.size(), 5u);
  EXPECT_EQ(results[0].suite, "matmul");
  EXPECT_EQ(results[1].suite, "logging");
  EXPECT_EQ(results[2].suite, "transfer");
  EXPECT_EQ(results[3].suite, "multi-gpu");
  EXPECT_TRUE(results[0].ran());
  EXPECT_TRUE(results[1].ran());
  EXPECT_FALSE(results[2].ran());
  EXPECT_FALSE(results[3].ran());
  EXPECT_EQ(results[4].suite, "train");
  EXPECT_TRUE(results[4].ran());
  EXPECT_EQ(results[5].suite, "optimizers");
  EXPECT_TRUE(results[5].ran());
  EXPECT_EQ(results[6].suite, "precision");
  EXPECT_TRUE(results[6].ran());
  EXPECT_NE(progress.find("multi-gpu: skipped: needs 2 GPUs, found 0"), std::string::npos);
}

TEST_F(SuitesTest, FindsSuitesByName) {
  EXPECT_EQ(find_suite("logging").name, "logging");
  EXPECT_EQ(try_find_suite("nope"), nullptr);
  EXPECT_EQ(error_message([] { find_suite("nope"); }),
            "unknown benchmark suite 'nope'; the suites are matmul, logging, transfer, multi-gpu, train, optimizers, "
            "precision, lenet, all");
}

TEST_F(SuitesTest, RegisteredSuiteRunsByNameAndComesLast) {
  if (try_find_suite("test-echo") == nullptr) {
    register_suite({"test-echo", "a suite for this test", nullptr, [](const SuiteOptions& options) {
                      ResultTable table("test-echo", {{"steps", ColumnKind::kInteger}});
                      table.add_row({options.steps()});
                      return SuiteResult("test-echo", "echoes its options", std::move(table));
                    }});
  }
  const std::vector<SuiteResult> results = run_suites("test-echo", SuiteOptions().steps(7));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(integer_of(results[0].table.at(0, "steps")), 7);
  EXPECT_EQ(suites().back().name, "test-echo");
  EXPECT_EQ(error_message([] { register_suite({"matmul", "", nullptr, bench_matmul}); }),
            "a benchmark suite called 'matmul' is already registered");
  EXPECT_EQ(error_message([] { register_suite({"all", "", nullptr, bench_matmul}); }),
            "a benchmark suite cannot be called 'all'");
  EXPECT_EQ(error_message([] { register_suite({"empty", "", nullptr, nullptr}); }),
            "benchmark suite 'empty' has nothing to run");
}

TEST_F(SuitesTest, CsvOutputsOneFilePerSuiteWhenThereAreSeveral) {
  const std::vector<SuiteResult> one = {SuiteResult::skipped("transfer", "no GPU")};
  const auto single = csv_outputs("out/results.csv", one);
  ASSERT_EQ(single.size(), 1u);
  EXPECT_EQ(single[0].first, "out/results.csv");
  EXPECT_EQ(single[0].second, "suite,status,reason\ntransfer,skipped,no GPU\n");
  const std::vector<SuiteResult> two = {SuiteResult::skipped("transfer", "no GPU"),
                                        SuiteResult::skipped("multi-gpu", "no GPUs")};
  const auto several = csv_outputs("out/results.csv", two);
  ASSERT_EQ(several.size(), 2u);
  EXPECT_EQ(several[0].first, "out/results-transfer.csv");
  EXPECT_EQ(several[1].first, "out/results-multi-gpu.csv");
  EXPECT_EQ(csv_outputs("results", two)[0].first, "results-transfer.csv");
}

TEST_F(SuitesTest, JsonDocumentCarriesVersionsMachineAndSuites) {
  const std::string json = results_to_json({SuiteResult::skipped("multi-gpu", "needs 2 GPUs, found 0")});
  EXPECT_EQ(json.rfind(std::string(R"({"dkit_version":")") + DKIT_VERSION + R"(","torch_version":")", 0), 0u);
  EXPECT_NE(json.find(R"("machine":{"cpu_threads":)"), std::string::npos);
  EXPECT_NE(json.find(R"("suites":[{"suite":"multi-gpu","status":"skipped","reason":"needs 2 GPUs, found 0")"),
            std::string::npos);
  EXPECT_EQ(json.back(), '\n');
}

TEST_F(SuitesTest, WritesTextFilesAndNamesTheOneItCannotWrite) {
  test::TempDir dir;
  write_text_file(dir.file("a.csv"), "x\n1\n");
  EXPECT_EQ(test::read_file(dir.file("a.csv")), "x\n1\n");
  const std::string missing = dir.file("no/such/dir/a.csv");
  EXPECT_EQ(error_message([&] { write_text_file(missing, "x"); }),
            "cannot write '" + missing + "': No such file or directory");
}

TEST_F(SuitesTest, MatmulComparesEachGpuWithTheCpu_CUDA) {
  const SuiteResult result = bench_matmul(SuiteOptions().devices({cpu(), gpu(0)}).sizes({64}).repeat(2));
  ASSERT_EQ(result.table.rows().size(), 3u);
  EXPECT_EQ(text_of(result.table.at(2, "dtype")), "bfloat16");
  EXPECT_TRUE(std::holds_alternative<double>(result.table.at(1, "vs_cpu")));
}

TEST_F(SuitesTest, TrainComparesEagerAndGraphStepsOnTheGpu_CUDA) {
  const SuiteResult result =
      bench_train(SuiteOptions().devices({gpu(0)}).sizes({32}).steps(5).repeat(2).python("none"));
  ASSERT_EQ(result.table.rows().size(), 4u);
  EXPECT_EQ(text_of(result.table.at(2, "variant")), "eager/pinned");
  EXPECT_EQ(text_of(result.table.at(3, "variant")), "graph/device");
  EXPECT_NE(result.notes.front().find("the CUDA graph step runs"), std::string::npos);
}

TEST_F(SuitesTest, TransferRunsTinySizes_CUDA) {
  const SuiteResult result = bench_transfer(SuiteOptions().sizes({4096}).repeat(2));
  ASSERT_TRUE(result.ran());
  EXPECT_EQ(result.table.rows().size(), 6u);
  EXPECT_EQ(text_of(result.table.at(2, "memory")), "pinned_overlap");
}

} // namespace
} // namespace dkit::bench
