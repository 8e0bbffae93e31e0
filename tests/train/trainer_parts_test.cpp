#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/train/detail/checkpoint_policy.h>
#include <dkit/train/detail/run_folder.h>
#include <dkit/train/trainer.h>

#include "../support.h"
#include "small_run.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dkit {
namespace {

using test::error_message;
using test::small_run;
namespace fs = std::filesystem;

class TrainerPartsTest : public test::SeedingFixture {
 protected:
  test::TempDir tmp_;
};

TEST_F(TrainerPartsTest, ASingleProcessFlushesWhenTheWindowIsFullAndSavesEveryNSteps) {
  const detail::CheckpointPolicy policy(/*checkpoint_every=*/4, /*total_steps=*/10, /*collective=*/false);
  const detail::StepPlan plain = policy.after_step(3, /*metrics_full=*/false);
  EXPECT_FALSE(plain.flush);
  EXPECT_TRUE(plain.poll_stop);
  EXPECT_FALSE(plain.save);
  EXPECT_FALSE(plain.last);
  EXPECT_TRUE(policy.after_step(3, /*metrics_full=*/true).flush);
  EXPECT_TRUE(policy.after_step(8, false).save);
  EXPECT_FALSE(policy.after_step(8, false).flush) << "the save flushes on its own";
  const detail::StepPlan last = policy.after_step(10, false);
  EXPECT_TRUE(last.save);
  EXPECT_TRUE(last.last);
}

TEST_F(TrainerPartsTest, ProcessesAgreeOnStopsOnlyAtFlushesEveryRankMakes) {
  const detail::CheckpointPolicy policy(/*checkpoint_every=*/0, /*total_steps=*/10, /*collective=*/true);
  EXPECT_FALSE(policy.after_step(4, false).poll_stop);
  EXPECT_FALSE(policy.after_step(4, false).flush);
  EXPECT_FALSE(policy.after_step(4, false).save) << "checkpoint_every 0 saves only at the end";
  EXPECT_TRUE(policy.after_step(5, true).flush);
  EXPECT_TRUE(policy.after_step(10, false).flush) << "the last step's save is a point every rank reaches";
  EXPECT_TRUE(policy.after_step(10, false).save);
}

TEST_F(TrainerPartsTest, AResumedEpochContinuesAfterTheSameNumberOfSamples) {
  detail::BatchPosition position;
  position.epoch = 1;
  position.epoch_step = 6;
  position.saved_batch_size = 8;
  position.saved_world_size = 2;
  position.batch_size = 16;
  position.world_size = 1;
  EXPECT_EQ(detail::resumed_epoch_step(position, "x.pt"), 6) << "the global batch is 16 both times";
  position.batch_size = 48;
  EXPECT_EQ(detail::resumed_epoch_step(position, "x.pt"), 2);
  position.batch_size = 64;
  EXPECT_EQ(error_message([&] { detail::resumed_epoch_step(position, "x.pt"); }),
            "cannot resume from x.pt: it stopped after 6 global batches of 16 (2 process(es) x train.batch_size 8) in "
            "epoch 2, 96 samples, which is no whole number of this run's global batches of 64 (1 process(es) x "
            "train.batch_size 64); resume with a global batch of 16");
  position.epoch_step = 0;
  EXPECT_EQ(detail::resumed_epoch_step(position, "x.pt"), 0) << "an epoch's start is a start for every batch size";
}

TEST_F(TrainerPartsTest, TheRunFolderEchoesLinesFromTheStartAndWarningsAlways) {
  std::vector<LogLine> seen;
  detail::RunFolder run(tmp_.file("run"), /*writes=*/true, [&](const LogLine& line) { seen.push_back(line); });
  run.log(LogLevel::kInfo, "setting up");
  run.log(LogLevel::kWarning, "careful");
  run.echo();
  run.log(LogLevel::kInfo, "training", /*headline=*/true);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].text, "careful");
  EXPECT_EQ(seen[0].level, LogLevel::kWarning);
  EXPECT_EQ(seen[1].text, "training");
  EXPECT_TRUE(seen[1].headline);
  const std::string log = test::read_file(tmp_.file("run/train.log"));
  for (const char* line : {"[info] setting up\n", "[warning] careful\n", "[info] training\n"}) {
    EXPECT_NE(log.find(line), std::string::npos) << line << " in:\n" << log;
  }
  EXPECT_TRUE(fs::is_directory(tmp_.file("run/checkpoints")));
}

TEST_F(TrainerPartsTest, ARankThatDoesNotWriteLeavesTheDiskAlone) {
  detail::RunFolder run(tmp_.file("run"), /*writes=*/false, nullptr);
  run.log(LogLevel::kWarning, "careful");
  run.write_config("seed: 1\n");
  run.open_metrics({"accuracy"}, /*resumed_step=*/std::nullopt);
  run.add_train_row(1, 1, 0.5, {0.5}, 0.1, 10.0);
  run.write_summary(TrainSummary{});
  EXPECT_FALSE(fs::exists(tmp_.file("run")));
}

TEST_F(TrainerPartsTest, TheCallerSeesEveryFlushAndEveryHeadline) {
  std::vector<ProgressUpdate> updates;
  std::vector<std::string> headlines;
  TrainerOptions options(tmp_.file("run"));
  options.on_progress([&](const ProgressUpdate& update) { updates.push_back(update); })
      .on_log([&](const LogLine& line) {
        if (line.headline) {
          headlines.push_back(line.text);
        }
      });
  test::train_config(small_run(), std::move(options));
  ASSERT_EQ(updates.size(), 6u) << "30 steps flushed every 5";
  for (size_t i = 0; i < updates.size(); ++i) {
    EXPECT_EQ(updates[i].step, 5 * static_cast<int64_t>(i + 1));
    EXPECT_EQ(updates[i].total_steps, 30);
    EXPECT_EQ(updates[i].text.rfind("epoch ", 0), 0u) << updates[i].text;
  }
  ASSERT_EQ(headlines.size(), 4u) << "the start line and one per epoch";
  EXPECT_EQ(headlines[0].rfind("training ", 0), 0u) << headlines[0];
  EXPECT_EQ(headlines[3].rfind("epoch 3/3 done at step 30: val loss ", 0), 0u) << headlines[3];
}

TEST_F(TrainerPartsTest, WithoutAValidationPartTheEpochAndFinalLinesSaySoRatherThanPrintNan) {
  std::vector<std::string> lines;
  TrainerOptions options(tmp_.file("run"));
  options.on_log([&](const LogLine& line) { lines.push_back(line.text); });
  const TrainSummary summary = test::train_config(small_run({"data.val_fraction=0"}), std::move(options));
  EXPECT_TRUE(std::isnan(summary.val_metric("accuracy")));
  ASSERT_GE(lines.size(), 2u);
  const std::string steps = std::to_string(summary.steps);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "epoch 3/3 done at step " + steps + " (no validation part)"),
            lines.end());
  EXPECT_EQ(lines.back().rfind("done: " + steps + " steps, ", 0), 0u) << lines.back();
  for (const std::string& line : lines) {
    EXPECT_EQ(line.find("nan"), std::string::npos) << line;
  }
}

TEST_F(TrainerPartsTest, WithoutBeingAskedTheTrainerLeavesTheProcessSettingsAlone) {
  const int threads = at::get_num_threads();
  const int others = threads == 1 ? 2 : 1;
  test::train_config(small_run({"threads=" + std::to_string(others)}), TrainerOptions(tmp_.file("run")));
  EXPECT_EQ(at::get_num_threads(), threads);
  test::train_config(small_run({"threads=" + std::to_string(others)}),
          TrainerOptions(tmp_.file("asked")).process_settings(true));
  EXPECT_EQ(at::get_num_threads(), others);
  at::set_num_threads(threads);
}

TEST_F(TrainerPartsTest, ResumingAFolderWithoutCheckpointsIsAnError) {
  fs::create_directories(tmp_.file("empty"));
  EXPECT_EQ(error_message([&] { resume_run(tmp_.file("empty")); }),
            "cannot resume '" + tmp_.file("empty") + "': no readable checkpoint in '" + tmp_.file("empty") +
                "/checkpoints'");
}

TEST_F(TrainerPartsTest, AResumePointCarriesTheSavedConfigWithTheOverrides) {
  test::train_config(small_run({"train.max_steps=4"}), TrainerOptions(tmp_.file("run")));
  const ResumePoint point = resume_run(tmp_.file("run"), {"train.batch_size=32"});
  EXPECT_EQ(point.saved_batch_size, 16);
  EXPECT_EQ(FullTrainConfig(point.config).batch_size, 32);
  EXPECT_EQ(point.source, tmp_.file("run") + "/checkpoints/last.pt");
  EXPECT_EQ(point.checkpoint->step, 4);
  EXPECT_TRUE(point.skipped.empty());
}

} // namespace
} // namespace dkit
