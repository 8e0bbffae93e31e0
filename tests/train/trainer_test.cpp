#include <dkit/train/trainer.h>

#include <dkit/checkpoint/safetensors.h>
#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/model/mlp_file.h>
#include <dkit/core/compat.h>
#include <dkit/distributed/data_parallel.h>
#include <dkit/device/host_sync.h>
#include <dkit/device/report.h>
#include <dkit/train/optim.h>

#include "../checkpoint/python.h"
#include "../support.h"
#include "small_run.h"

#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include <torch/version.h>

namespace dkit {
namespace {

using test::error_message;
using test::small_run;
namespace fs = std::filesystem;

class TrainerTest : public test::SeedingFixture {
 protected:
  /// A run of `config` in `dir` with the process settings applied, continuing `resume` (read from "test").
  static TrainSummary train(const FullTrainConfig& config, const std::string& dir,
                            std::optional<TrainingCheckpoint> resume = std::nullopt,
                            std::shared_ptr<StopRequest> stop = nullptr) {
    TrainerOptions options(dir);
    options.process_settings(true).stop(std::move(stop));
    if (resume) {
      options.resume(std::make_shared<const ResumePoint>(resume_point(std::move(*resume), "test")));
    }
    return test::train_config(config, std::move(options));
  }

  static StateDict final_weights(const std::string& dir) {
    return load_training_checkpoint(dir + "/checkpoints/last.pt").model_state_dict;
  }

  static void expect_bitwise_equal(const StateDict& a, const StateDict& b) {
    ASSERT_EQ(a.keys(), b.keys());
    for (const auto& item : a) {
      EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key();
    }
  }

  test::TempDir tmp_;
};

// Every file a run and the export write: PyTorch 2.6 and later read each with torch.load's default
// (weights_only=True). PyTorch 1.13's weights_only unpickler reads the state dicts; it has no opcode for a Python
// float (BINFLOAT, 71), which a training checkpoint's config and optimizer settings need, and that must be the only
// reason it refuses one.
TEST_F(TrainerTest, PythonLoadsEveryFileDkitWritesWithWeightsOnly) {
  DKIT_SKIP_WITHOUT_PYTHON_TORCH();
  const std::string dir = tmp_.file("run");
  train(small_run({"train.checkpoint_every=10"}), dir);
  const LoadedMlp model = load_mlp(dir + "/checkpoints/last.pt");
  export_mlp(tmp_.file("export.pt"), model);
  save_state_dict(*model.net, tmp_.file("module.pt"));
  std::string files = tmp_.file("export.pt") + " " + tmp_.file("module.pt");
  for (const auto& entry : fs::directory_iterator(dir + "/checkpoints")) {
    files += " " + entry.path().string();
  }
  const auto result = test::run_python(tmp_.file("check.py"), R"(import pickle, sys, torch
major, minor = (int(p) for p in torch.__version__.split(".")[:2])
for path in sys.argv[1:]:
    checkpoint = path.endswith(".pt") and "/checkpoints/" in path
    if (major, minor) >= (2, 6):
        root = torch.load(path)
    elif not checkpoint:
        root = torch.load(path, weights_only=True)
    else:
        try:
            torch.load(path, weights_only=True)
            raise SystemExit(path + ": PyTorch " + torch.__version__ + " was expected to refuse its floats")
        except pickle.UnpicklingError as error:
            assert str(error).endswith("Unsupported operand 71"), str(error)
        root = torch.load(path)
    tensors = root["model_state_dict"] if checkpoint else root
    assert tensors["0.weight"].shape == (16, 8), path
print("ok", len(sys.argv) - 1)
)",
                                       files);
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_EQ(result.output, "ok 6\n");
}

TEST_F(TrainerTest, TrainsAndWritesEveryOutput) {
  const TrainSummary summary = train(small_run(), tmp_.file("run"));
  EXPECT_EQ(summary.device, "cpu");
  EXPECT_EQ(summary.steps, 30);
  EXPECT_EQ(summary.samples, 30 * 16);
  EXPECT_GT(summary.train_seconds, 0.0);
  EXPECT_GT(summary.val_metric("accuracy"), 0.8);
  EXPECT_GT(summary.peak_memory_bytes, 0);
  EXPECT_EQ(summary.stopped_by_signal, 0);
  EXPECT_EQ(summary.checkpoint, tmp_.file("run") + "/checkpoints/step-000030.pt");
  for (const char* name : {"train.log", "metrics.csv", "summary.json", "config.yaml", "checkpoints/last.pt"}) {
    EXPECT_TRUE(fs::exists(tmp_.path() / "run" / name)) << name;
  }
  std::ifstream csv(tmp_.file("run/metrics.csv"));
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "step,epoch,loss,accuracy,lr,samples_per_second,val_loss,val_accuracy");
  int rows = 0;
  for (std::string line; std::getline(csv, line);) {
    ++rows;
  }
  EXPECT_EQ(rows, 6 + 3) << "a row per log flush (30 steps / 5) and per epoch";
  const std::string text = test::read_file(tmp_.file("run/summary.json"));
  for (const char* key : {"\"device\"", "\"steps\"", "\"samples\"", "\"train_seconds\"", "\"samples_per_second\"",
                          "\"final_loss\"", "\"val_accuracy\"", "\"peak_memory_bytes\""}) {
    EXPECT_NE(text.find(key), std::string::npos) << key;
  }
}

TEST_F(TrainerTest, HotLoopReadsTheDeviceOnlyAtLogFlushesAndValidation) {
  const int64_t before = host_sync_count();
  const TrainSummary summary = train(small_run(), tmp_.file("run"));
  EXPECT_EQ(summary.host_syncs, 6 + 3) << "30 steps flushed every 5, and one validation per epoch";
  EXPECT_EQ(host_sync_count() - before, summary.host_syncs);
}

TEST_F(TrainerTest, ResumeFromACheckpointIsBitwiseExact) {
  const std::vector<std::string> keys = {"model.dropout=0.3", "train.checkpoint_every=7"};
  train(small_run(keys), tmp_.file("whole"));

  auto first = keys;
  first.push_back("train.max_steps=17");
  const TrainSummary part = train(small_run(first), tmp_.file("split"));
  ASSERT_EQ(part.steps, 17);
  const auto found = CheckpointFolder(tmp_.file("split")).load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.step, 17);
  EXPECT_EQ(found->checkpoint.epoch, 1);
  EXPECT_EQ(found->checkpoint.epoch_step, 7);
  const TrainSummary rest =
      train(small_run(keys), tmp_.file("split"), found->checkpoint);
  EXPECT_EQ(rest.steps, 30);
  expect_bitwise_equal(final_weights(tmp_.file("whole")), final_weights(tmp_.file("split")));
}

// The same samples mapped from .npy files (int32, int64 or uint16 labels, a folder or two files) or a safetensors file
// train the same weights bitwise as in memory: the same split, the same streaming scaling statistics, the scaling
// per batch.
TEST_F(TrainerTest, MappedFilesTrainTheSameWeightsAsTheSameDataInMemory) {
  const FullTrainConfig in_memory = small_run({"data.scaling=minmax"});
  const Dataset data = make_synthetic(SyntheticOptions(200, 8, 3).seed(static_cast<uint64_t>(in_memory.seed)));
  fs::create_directories(tmp_.file("npy"));
  test::write_npy(tmp_.file("npy/x.npy"), data.features);
  test::write_npy(tmp_.file("npy/y.npy"), data.labels.to(at::kInt));
  test::write_npy(tmp_.file("labels.npy"), data.labels);
  test::write_npy(tmp_.file("labels_u2.npy"), data.labels.to(at::kShort), "<u2");
  StateDict tensors("state dict key");
  tensors.insert("x", data.features);
  tensors.insert("y", data.labels);
  write_safetensors(tmp_.file("data.safetensors"), tensors);

  const TrainSummary expected = train(in_memory, tmp_.file("memory"));
  const std::vector<std::vector<std::string>> mapped = {
      {"data.source=npy", "data.path=" + tmp_.file("npy")},
      {"data.source=npy", "data.path=" + tmp_.file("npy/x.npy"), "data.targets=" + tmp_.file("labels.npy")},
      {"data.source=npy", "data.path=" + tmp_.file("npy/x.npy"), "data.targets=" + tmp_.file("labels_u2.npy")},
      {"data.source=safetensors", "data.path=" + tmp_.file("data.safetensors")}};
  for (size_t i = 0; i < mapped.size(); ++i) {
    auto keys = mapped[i];
    keys.push_back("data.scaling=minmax");
    const TrainSummary got = train(small_run(keys), tmp_.file("mapped" + std::to_string(i)));
    EXPECT_EQ(got.steps, expected.steps);
    expect_bitwise_equal(final_weights(tmp_.file("memory")), final_weights(tmp_.file("mapped" + std::to_string(i))));
  }
  EXPECT_EQ(error_message([&] {
              train(small_run({"data.source=npy", "data.path=" + tmp_.file("npy/x.npy")}), tmp_.file("bad"));
            }),
            "config key 'data.targets' is required when data.path is a .npy file (" + tmp_.file("npy/x.npy") +
                "): name the .npy file of labels, or make data.path a folder of x.npy and y.npy");
  EXPECT_EQ(error_message([&] {
              train(small_run({"data.source=npy", "data.path=" + tmp_.file("none.npy")}), tmp_.file("bad"));
            }),
            "config key 'data.path' names " + tmp_.file("none.npy") +
                ", which does not exist: give the .npy file of inputs or a folder of x.npy and y.npy");
  StateDict only_x("state dict key");
  only_x.insert("x", data.features);
  write_safetensors(tmp_.file("x.safetensors"), only_x);
  EXPECT_EQ(error_message([&] {
              train(small_run({"data.source=safetensors", "data.path=" + tmp_.file("x.safetensors")}),
                    tmp_.file("bad"));
            }),
            tmp_.file("x.safetensors") + " has no tensor 'y' (the labels); it holds 'x'");
}

TEST_F(TrainerTest, ResumeWithTheWrittenOutBackwardAndFusedAdamIsBitwiseExact) {
  const std::vector<std::string> keys = {"train.checkpoint_every=4", "threads=2", "model.hidden=[32,16]"};
  train(small_run(keys), tmp_.file("whole"));
  auto first = keys;
  first.push_back("train.max_steps=13");
  train(small_run(first), tmp_.file("split"));
  const auto found = CheckpointFolder(tmp_.file("split")).load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.step, 13);
  const TrainSummary rest =
      train(small_run(keys), tmp_.file("split"), found->checkpoint);
  EXPECT_EQ(rest.steps, 30);
  expect_bitwise_equal(final_weights(tmp_.file("whole")), final_weights(tmp_.file("split")));
}

TEST_F(TrainerTest, ResumeWithFusedSgdAndNesterovMomentumIsBitwiseExact) {
  const std::vector<std::string> keys = {"train.optimizer=sgd", "train.lr=0.05", "train.nesterov=true",
                                         "train.weight_decay=0.001", "train.checkpoint_every=4", "threads=2",
                                         "model.hidden=[32,16]"};
  train(small_run(keys), tmp_.file("whole"));
  auto first = keys;
  first.push_back("train.max_steps=13");
  train(small_run(first), tmp_.file("split"));
  const auto found = CheckpointFolder(tmp_.file("split")).load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.step, 13);
  const TrainSummary rest = train(small_run(keys), tmp_.file("split"), found->checkpoint);
  EXPECT_EQ(rest.steps, 30);
  expect_bitwise_equal(final_weights(tmp_.file("whole")), final_weights(tmp_.file("split")));
}

// train.precision: bf16 runs the step as autocast and autograd would, written out on the CPU; a run stopped and
// resumed ends with the same weights bitwise, as in fp32.
TEST_F(TrainerTest, Bf16ResumeFromACheckpointIsBitwiseExact) {
  const std::vector<std::string> keys = {"train.precision=bf16", "train.checkpoint_every=7"};
  const TrainSummary whole = train(small_run(keys), tmp_.file("whole"));
  EXPECT_EQ(whole.steps, 30);
  auto first = keys;
  first.push_back("train.max_steps=17");
  train(small_run(first), tmp_.file("split"));
  const auto found = CheckpointFolder(tmp_.file("split")).load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_TRUE(found->checkpoint.scaler_state_dict.is_none()) << "bf16 needs no loss scaler";
  train(small_run(keys), tmp_.file("split"), found->checkpoint);
  expect_bitwise_equal(final_weights(tmp_.file("whole")), final_weights(tmp_.file("split")));
  const std::string log = test::read_file(tmp_.file("whole/train.log"));
  EXPECT_NE(log.find("precision: the forward pass under autocast to bfloat16"), std::string::npos) << log;
  EXPECT_NE(log.find("each step: dkit's written-out backward pass, "), std::string::npos) << log;
}

TEST_F(TrainerTest, LogSaysHowEachStepRuns) {
  train(small_run(), tmp_.file("run"));
  const std::string log = test::read_file(tmp_.file("run/train.log"));
  const FusedKernelReport fused = fused_kernel_report();
  const std::string updates =
      fused.adam == FusedKernel::kNone
          ? "LibTorch's optimizer (this LibTorch rounds it otherwise than dkit's kernels: see dkit devices)"
          : "dkit's one-pass updates (" + fused.instructions + " kernels, " + to_string(fused.adam) + " rounding)";
  EXPECT_NE(log.find("each step: dkit's written-out backward pass, " + updates + "\n"), std::string::npos) << log;
}

TEST_F(TrainerTest, Bf16WeightsDifferFromFp32Weights) {
  train(small_run(), tmp_.file("fp32"));
  train(small_run({"train.precision=bf16"}), tmp_.file("bf16"));
  const StateDict fp32 = final_weights(tmp_.file("fp32"));
  const StateDict bf16 = final_weights(tmp_.file("bf16"));
  EXPECT_EQ(bf16["0.weight"].scalar_type(), torch::kFloat) << "the parameters stay float32";
  EXPECT_FALSE(torch::equal(fp32["0.weight"], bf16["0.weight"])) << "the bf16 run did not autocast";
}

// fp16 on the CPU: a clear error where LibTorch cannot autocast to float16 there (1.13), else a run whose
// checkpoint carries the loss scaler's state under 'scaler' and resumes bitwise.
TEST_F(TrainerTest, Fp16OnTheCpuResumesWithItsScalerOrIsRefused) {
  const std::vector<std::string> keys = {"train.precision=fp16", "train.checkpoint_every=7"};
  if (!compat::kCpuAutocastFloat16) {
    EXPECT_EQ(error_message([&] { train(small_run(keys), tmp_.file("run")); }),
              std::string("train.precision fp16 on cpu: autocast in float16 on the cpu needs LibTorch 2.2 or later "
                          "(this is ") +
                  TORCH_VERSION + "): use bfloat16 on the cpu");
    return;
  }
  train(small_run(keys), tmp_.file("whole"));
  const std::string log = test::read_file(tmp_.file("whole/train.log"));
  const std::string warning =
      "train.precision fp16 on cpu: this CPU has neither AVX512_FP16 nor AMX-FP16, so LibTorch's float16 products "
      "run many times slower than float32 ones (24-32x on a Zen 5); bf16 is the fast low precision of CPUs";
  EXPECT_EQ(log.find(warning) != std::string::npos, !cpu_has_float16_arithmetic()) << log;
  auto first = keys;
  first.push_back("train.max_steps=17");
  train(small_run(first), tmp_.file("split"));
  const auto found = CheckpointFolder(tmp_.file("split")).load_newest();
  ASSERT_TRUE(found.has_value());
  const PickleValue& scaler = found->checkpoint.scaler_state_dict;
  ASSERT_TRUE(scaler.is_dict());
  EXPECT_EQ(scaler.find("growth_interval")->to_int(), 2000);
  EXPECT_LE(scaler.find("scale")->to_double(), 65536.0);
  EXPECT_LE(scaler.find("_growth_tracker")->to_int(), 17);
  train(small_run(keys), tmp_.file("split"), found->checkpoint);
  expect_bitwise_equal(final_weights(tmp_.file("whole")), final_weights(tmp_.file("split")));
}

TEST_F(TrainerTest, DivergingLossStopsWithAClearError) {
  const std::string message = error_message([&] {
    train(small_run({"train.optimizer=sgd", "train.lr=1e30", "train.momentum=0"}), tmp_.file("run"));
  });
  EXPECT_EQ(message.rfind("training diverged: the loss is ", 0), 0u) << message;
  EXPECT_NE(message.find("no checkpoint was written after it, the last good one is in '" + tmp_.file("run") +
                         "/checkpoints'; lower train.lr"),
            std::string::npos)
      << message;
  EXPECT_FALSE(fs::exists(tmp_.file("run/checkpoints/last.pt")));
}

TEST_F(TrainerTest, StopRequestFinishesTheStepAndWritesACheckpoint) {
  auto stop = std::make_shared<StopRequest>();
  stop->request(SIGTERM);
  const TrainSummary summary = train(small_run(), tmp_.file("run"), std::nullopt, stop);
  EXPECT_EQ(summary.stopped_by_signal, SIGTERM);
  EXPECT_EQ(summary.steps, 1);
  EXPECT_EQ(load_training_checkpoint(tmp_.file("run/checkpoints/last.pt")).step, 1);
}

TEST_F(TrainerTest, ResumeOnChangedDataIsRefused) {
  const std::string csv = tmp_.file("data.csv");
  const auto write_data = [&](int offset) {
    std::ofstream out(csv);
    for (int i = 0; i < 40; ++i) {
      out << (i % 2) + offset << "," << i % 7 << "," << i % 2 << "\n";
    }
  };
  write_data(0);
  const FullTrainConfig config(parse_config("", "test", ".",
                                            {"device=cpu", "data.path=" + csv, "train.epochs=1",
                                             "model.hidden=[4]", "train.batch_size=8"}));
  train(config, tmp_.file("run"));
  write_data(1);
  const auto found = CheckpointFolder(tmp_.file("run")).load_newest();
  ASSERT_TRUE(found.has_value());
  const std::string message = error_message([&] {
    train(config, tmp_.file("run"), found->checkpoint);
  });
  EXPECT_EQ(message.rfind("cannot resume from test: the training data changed since it was written (checksum fnv1a64:", 0),
            0u)
      << message;
}

TEST_F(TrainerTest, ResumeWithAnotherBatchSizeContinuesAtTheSameSample) {
  train(small_run({"train.max_steps=4"}), tmp_.file("run"));
  const auto found = CheckpointFolder(tmp_.file("run")).load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->checkpoint.world_size, 1);
  const TrainSummary rest = train(small_run({"train.batch_size=32"}), tmp_.file("run"),
                                  found->checkpoint);
  EXPECT_EQ(rest.steps, 4 + 3 + 2 * 5) << "64 samples were done: 3 batches of 32 finish epoch 1, then 2 epochs of 5";
  EXPECT_NE(test::read_file(tmp_.file("run/train.log")).find("the global batch changed from 16 to 32: epoch 1 continues at batch 2 (after sample 64)"),
            std::string::npos);
}

TEST_F(TrainerTest, ResumeBetweenTwoBatchesOfTheNewSizeIsRefused) {
  train(small_run({"train.max_steps=3"}), tmp_.file("run"));
  const auto found = CheckpointFolder(tmp_.file("run")).load_newest();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(error_message([&] {
              train(small_run({"train.batch_size=32"}), tmp_.file("run"),
                    found->checkpoint);
            }),
            "cannot resume from test: it stopped after 3 global batches of 16 (1 process(es) x train.batch_size 16) in "
            "epoch 1, 48 samples, which is no whole number of this run's global batches of 32 (1 process(es) x "
            "train.batch_size 32); resume with a global batch of 16");
}

TEST_F(TrainerTest, DataParallelWhereLibTorchCannotIsAnError) {
  if (data_parallel_available()) {
    GTEST_SKIP() << "this build has DataParallel";
  }
  EXPECT_EQ(error_message([&] { train(small_run({"dist.data_parallel=true"}), tmp_.file("run")); }),
            "dist.data_parallel is not available: " + data_parallel_unavailable_reason() +
                " (see `dkit devices`); set dist.data_parallel: false");
}

TEST_F(TrainerTest, RunFolderWhoseParentIsMissingIsAnError) {
  EXPECT_EQ(error_message([&] { train(small_run(), tmp_.file("missing/run")); }),
            "cannot create the run folder '" + tmp_.file("missing/run") + "': its parent '" + tmp_.file("missing") +
                "' does not exist");
}

TEST_F(TrainerTest, SummaryJsonWritesShortestRoundTripNumbersAndNullForNonFinite) {
  TrainSummary summary;
  summary.device = "cpu";
  summary.steps = 30;
  summary.train_seconds = 0.1;
  summary.samples_per_second = 1.0 / 3.0;
  summary.final_loss = std::numeric_limits<double>::quiet_NaN();
  summary.val_loss = std::numeric_limits<double>::quiet_NaN();
  summary.val_metrics = {{"accuracy", std::numeric_limits<double>::infinity()}};
  summary.checkpoint = "run/checkpoints/last.pt";
  EXPECT_EQ(summary_to_json(summary),
            R"({"device":"cpu","steps":30,"samples":0,"train_seconds":0.1,"samples_per_second":0.3333333333333333,)"
            R"("final_loss":null,"val_loss":null,"val_accuracy":null,"peak_memory_bytes":0,"host_syncs":0,"stopped_by_signal":0,)"
            R"("stop_reason":"none","checkpoint":"run/checkpoints/last.pt"})"
            "\n");
}

// check_syncs makes the steps' synchronisations errors; where there is nothing it could check, the run is refused.
TEST_F(TrainerTest, CheckSyncsWithoutACudaDeviceIsRefused) {
  const auto refused = [&](const FullTrainConfig& config) {
    TrainerOptions options(tmp_.file("run"));
    options.check_syncs(true);
    return error_message([&] { test::train_config(config, std::move(options)); });
  };
  EXPECT_EQ(refused(small_run({"device=cpu"})),
            DKIT_WITH_CUDA ? "check_syncs (dkit train --check-syncs) needs a CUDA device; the run's device is cpu"
                           : "check_syncs (dkit train --check-syncs) needs a CUDA build; this one is CPU only");
  EXPECT_FALSE(fs::exists(tmp_.file("run/checkpoints/last.pt")));
}

// On a GPU the whole loop runs under the check: every step and batch hand-over, for the pinned ring and the data on
// the device, the written-out step (fp32) and autograd (bf16); the only reads of the device are the flushes and
// validations. (Pageable batches are copied the blocking way, by definition.)
TEST_F(TrainerTest, StepsNeverSynchronizeWithTheGpu_CUDA) {
  for (const std::string placement : {"pinned", "device"}) {
    for (const std::string precision : {"fp32", "bf16"}) {
      const std::string dir = tmp_.file("run-" + placement + "-" + precision);
      TrainerOptions options(dir);
      options.process_settings(true).check_syncs(true);
      const TrainSummary summary =
          test::train_config(small_run({"device=cuda", "loader.placement=" + placement, "train.precision=" + precision}),
                  std::move(options));
      EXPECT_EQ(summary.steps, 30) << placement << " " << precision;
      EXPECT_EQ(summary.host_syncs, 6 + 3) << placement << " " << precision;
    }
  }
  TrainerOptions options(tmp_.file("fp16"));
  options.check_syncs(true);
  EXPECT_EQ(error_message([&] {
              test::train_config(small_run({"device=cuda", "train.precision=fp16"}), std::move(options));
            }),
            "check_syncs (dkit train --check-syncs) cannot check train.precision=fp16: its loss scaler reads the "
            "device every step");
}

TEST_F(TrainerTest, AbsentDeviceIsAnErrorBeforeTraining) {
  const std::string message = error_message([&] { train(small_run({"device=cuda:7"}), tmp_.file("run")); });
  EXPECT_EQ(message.rfind("device 'cuda:7' is not available: ", 0), 0u) << message;
  EXPECT_FALSE(fs::exists(tmp_.file("run/checkpoints/last.pt")));
}

} // namespace
} // namespace dkit
