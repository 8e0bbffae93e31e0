#include <dkit/checkpoint/training_checkpoint.h>

#include "../process.h"
#include "../support.h"

#include <algorithm>
#include <filesystem>
#include <random>
#include <sstream>

#ifdef DKIT_CNN_RUN_PATH

namespace dkit {
namespace {

using test::Process;

/// Runs dkit_cnn_run (tests/train/cnn_run.cpp), a CNN with BatchNorm and dropout trained by the Trainer, in
/// processes of its own, kills them and continues them.
class CnnProcessTest : public test::SeedingFixture {
 protected:
  std::vector<std::string> argv(const std::string& out, const std::vector<std::string>& extra) const {
    std::vector<std::string> args{DKIT_CNN_RUN_PATH, "--out", tmp_.file(out)};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  TrainingCheckpoint last(const std::string& out) const {
    return load_training_checkpoint(tmp_.file(out + "/checkpoints/last.pt"));
  }

  static bool same_tensors(const PickleValue& a, const PickleValue& b) {
    std::vector<at::Tensor> left;
    std::vector<at::Tensor> right;
    for_each_tensor(a, [&](const std::string&, const PickleValue& t) { left.push_back(t.to_tensor()); });
    for_each_tensor(b, [&](const std::string&, const PickleValue& t) { right.push_back(t.to_tensor()); });
    bool same = left.size() == right.size() && !left.empty();
    for (size_t i = 0; same && i < left.size(); ++i) {
      same = torch::equal(left[i], right[i]);
    }
    return same;
  }

  // The training steps metrics.csv holds a row for, in order.
  std::vector<int64_t> logged_steps(const std::string& out) const {
    std::istringstream csv(test::read_file(tmp_.file(out + "/metrics.csv")));
    std::vector<int64_t> steps;
    std::string line;
    std::getline(csv, line);
    while (std::getline(csv, line)) {
      if (!line.empty() && line.back() == ',') {
        steps.push_back(std::stoll(line.substr(0, line.find(','))));
      }
    }
    return steps;
  }

  test::TempDir tmp_;
};

// kill -9 at steps drawn from the seed, each read off the run's own progress lines, then the same command again,
// which continues from the newest checkpoint: parameters, BatchNorm's buffers, the optimizer's momentum, the
// scheduler's position and the task's own count end bitwise as in a run never killed, and metrics.csv holds each
// step once. In float32, under bfloat16 autocast, and with a StepLR stepping each epoch.
TEST_F(CnnProcessTest, KilledAtStepsDrawnFromTheSeedAndContinuedEndsBitwiseEqual) {
  const std::vector<std::vector<std::string>> variants = {
      {}, {"--precision", "bf16"}, {"--scheduler", "1"}};
  std::mt19937 generator(23);
  for (size_t v = 0; v < variants.size(); ++v) {
    SCOPED_TRACE("variant " + std::to_string(v));
    const std::string reference = "reference" + std::to_string(v);
    Process whole(argv(reference, variants[v]), tmp_.file(reference));
    ASSERT_EQ(whole.wait(), 0) << whole.err();
    const std::string run = "run" + std::to_string(v);
    std::uniform_int_distribution<int64_t> steps(1, 140);
    std::vector<int64_t> kills{steps(generator), steps(generator), steps(generator)};
    for (const int64_t target : kills) {
      Process victim(argv(run, variants[v]), tmp_.file(run), {}, test::ErrTo::kPipe);
      ASSERT_TRUE(test::read_until_step(victim, target)) << "the run ended before step " << target << ":\n"
                                                          << victim.err();
      victim.signal(SIGKILL);
      ASSERT_EQ(victim.wait(), 128 + SIGKILL) << "the run ended before the kill";
    }
    Process rest(argv(run, variants[v]), tmp_.file(run + "-rest"));
    ASSERT_EQ(rest.wait(), 0) << rest.err();
    const TrainingCheckpoint a = last(reference);
    const TrainingCheckpoint b = last(run);
    ASSERT_EQ(b.step, 200);
    for (const auto& item : a.model_state_dict) {
      EXPECT_TRUE(torch::equal(item.value(), b.model_state_dict[item.key()])) << item.key();
    }
    EXPECT_TRUE(b.model_state_dict.contains("norm.running_var"));
    EXPECT_TRUE(same_tensors(a.optimizer_state_dict, b.optimizer_state_dict));
    EXPECT_EQ(b.task_state.find("steps")->to_int(), 200);
    if (variants[v].size() == 2 && variants[v][0] == "--scheduler") {
      EXPECT_EQ(b.scheduler_state_dict.find("step_count")->to_int(), 3) << "saved before the last epoch's end";
    }
    std::vector<int64_t> every(200);
    for (int64_t i = 0; i < 200; ++i) {
      every[static_cast<size_t>(i)] = i + 1;
    }
    EXPECT_EQ(logged_steps(run), every);
  }
}

// The conveniences together, killed between the batches of an accumulation window and during the warm-up: three
// batches to a step (the last window of each epoch two), the gradients clipped, a warm-up of 20 steps then a cosine
// stepped each step, the two best checkpoints by val_loss kept. The continued run ends bitwise as the one never
// killed, with the same best files, and metrics.csv holds each optimizer step once.
TEST_F(CnnProcessTest, AccumulatingClippingAndWarmingUpKilledAndContinuedEndsBitwiseEqual) {
  const std::vector<std::string> extra{"--accumulate", "3", "--clip", "0.5", "--warmup", "20", "--save-top-k", "2",
                                       "--checkpoint-every", "5"};
  Process whole(argv("reference", extra), tmp_.file("reference"));
  ASSERT_EQ(whole.wait(), 0) << whole.err();
  std::mt19937 generator(29);
  std::uniform_int_distribution<int64_t> steps(1, 60);
  for (const int64_t target : {int64_t{3}, steps(generator), steps(generator)}) {
    Process victim(argv("run", extra), tmp_.file("run"), {}, test::ErrTo::kPipe);
    ASSERT_TRUE(test::read_until_step(victim, target)) << "the run ended before step " << target << ":\n"
                                                        << victim.err();
    victim.signal(SIGKILL);
    ASSERT_EQ(victim.wait(), 128 + SIGKILL) << "the run ended before the kill";
  }
  Process rest(argv("run", extra), tmp_.file("run-rest"));
  ASSERT_EQ(rest.wait(), 0) << rest.err();
  const TrainingCheckpoint a = last("reference");
  const TrainingCheckpoint b = last("run");
  ASSERT_EQ(b.step, 4 * 17) << "50 batches an epoch make 17 steps of 3 batches or fewer";
  for (const auto& item : a.model_state_dict) {
    EXPECT_TRUE(torch::equal(item.value(), b.model_state_dict[item.key()])) << item.key();
  }
  EXPECT_TRUE(same_tensors(a.optimizer_state_dict, b.optimizer_state_dict));
  EXPECT_EQ(b.task_state.find("steps")->to_int(), 200);
  EXPECT_EQ(b.scheduler_state_dict.find("step_count")->to_int(), 68);
  const auto best_files = [&](const std::string& out) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(tmp_.file(out + "/checkpoints"))) {
      if (entry.path().filename().string().rfind("best-", 0) == 0) {
        names.push_back(entry.path().filename().string());
      }
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  EXPECT_EQ(best_files("run").size(), 2u);
  EXPECT_EQ(best_files("run"), best_files("reference"));
  std::vector<int64_t> every(68);
  for (int64_t i = 0; i < 68; ++i) {
    every[static_cast<size_t>(i)] = i + 1;
  }
  EXPECT_EQ(logged_steps("run"), every);
}

} // namespace
} // namespace dkit

#endif
