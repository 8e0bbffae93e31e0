#include <dkit/checkpoint/training_checkpoint.h>

#include "../process.h"
#include "../support.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#ifdef DKIT_APP_PATH

namespace dkit {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using test::Process;
using test::run_process;

/// Runs the real `dkit` command in child processes, kills it, and resumes it.
class TrainProcessTest : public test::SeedingFixture {
 protected:
  TrainProcessTest() {
    config_ = tmp_.file("config.yaml");
    std::ofstream(config_) << "device: cpu\nthreads: 1\nseed: 5\n"
                              "data: {source: synthetic, samples: 4000, features: 32, classes: 4}\n"
                              "model: {hidden: [128, 128], dropout: 0.1}\n"
                              "train: {epochs: 8, batch_size: 32, log_every: 25, checkpoint_every: 25}\n";
  }

  std::vector<std::string> train(const std::string& out) const {
    return {DKIT_APP_PATH, "train", "--config", config_, "--out", out, "--no-progress"};
  }

  static std::vector<std::string> resume(const std::string& out) {
    return {DKIT_APP_PATH, "train", "--resume", out, "--no-progress"};
  }

  static StateDict weights(const std::string& run) {
    return load_training_checkpoint(run + "/checkpoints/last.pt").model_state_dict;
  }

  static bool bitwise_equal(const StateDict& a, const StateDict& b) {
    if (a.keys() != b.keys()) {
      return false;
    }
    for (const auto& item : a) {
      if (!torch::equal(item.value(), b[item.key()])) {
        return false;
      }
    }
    return true;
  }

  /// How long the uninterrupted reference run took: until its first checkpoint, and in all.
  struct Timing {
    double first_checkpoint = 0;
    double total = 0;
  };

  /// Trains without interruption into `reference`, timing it.
  Timing train_reference() {
    const auto start = Clock::now();
    Process reference(train(tmp_.file("reference")), tmp_.file("reference"));
    const Timing timing{wait_for_checkpoint(tmp_.file("reference"), reference), 0};
    EXPECT_EQ(reference.wait(), 0) << reference.err();
    return {timing.first_checkpoint, std::chrono::duration<double>(Clock::now() - start).count()};
  }

  /// Seconds until `run`'s first checkpoint appears (or the process ends).
  static double wait_for_checkpoint(const std::string& run, Process& process) {
    const auto start = Clock::now();
    while (!fs::exists(run + "/checkpoints/last.pt") && !process.finished()) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  test::TempDir tmp_;
  std::string config_;
};

TEST_F(TrainProcessTest, KilledAtRandomMomentsThenResumedEndsBitwiseEqual) {
  const Timing reference = train_reference();
  const StateDict expected = weights(tmp_.file("reference"));
  std::mt19937 generator(11);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  int mid_run_kills = 0;
  for (int round = 0; round < 12 && Clock::now() < deadline; ++round) {
    const std::string run = tmp_.file("run" + std::to_string(round));
    bool finished_before_kill = false;
    {
      Process victim(train(run), run);
      // One round in four kills at any moment of start-up, the others once checkpoints are being written.
      if (round % 4 == 0) {
        std::uniform_real_distribution<double> moment(0.0, reference.first_checkpoint);
        std::this_thread::sleep_for(std::chrono::duration<double>(moment(generator)));
      } else {
        wait_for_checkpoint(run, victim);
        std::uniform_real_distribution<double> moment(0.0, reference.total - reference.first_checkpoint);
        std::this_thread::sleep_for(std::chrono::duration<double>(moment(generator)));
      }
      finished_before_kill = victim.finished();
      victim.signal(SIGKILL);
      victim.wait();
    }
    const bool has_checkpoint = fs::exists(run + "/checkpoints/last.pt");
    mid_run_kills += has_checkpoint && !finished_before_kill ? 1 : 0;
    Process again(has_checkpoint ? resume(run) : train(run), run + "-again");
    ASSERT_EQ(again.wait(), 0) << again.err();
    EXPECT_TRUE(bitwise_equal(weights(run), expected)) << "round " << round << ": resumed weights differ";
  }
  EXPECT_GE(mid_run_kills, 3) << "too few kills landed between the first checkpoint and the end";
}

TEST_F(TrainProcessTest, SigtermWritesACheckpointExitsWith143AndResumesExactly) {
  train_reference();
  const std::string run = tmp_.file("run");
  Process victim(train(run), run);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline && !victim.finished()) {
    std::ifstream csv(run + "/metrics.csv");
    int lines = 0;
    for (std::string line; std::getline(csv, line);) {
      ++lines;
    }
    if (lines >= 3) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_FALSE(victim.finished()) << "the run ended before it could be signalled";
  victim.signal(SIGTERM);
  EXPECT_EQ(victim.wait(), 143);
  const std::string err = victim.err();
  EXPECT_NE(err.find("dkit: stopped by signal 15 after step "), std::string::npos) << err;
  EXPECT_NE(err.find("; continue with: dkit train --resume " + run), std::string::npos) << err;
  Process again(resume(run), run + "-again");
  ASSERT_EQ(again.wait(), 0) << again.err();
  EXPECT_TRUE(bitwise_equal(weights(run), weights(tmp_.file("reference"))));
}

} // namespace
} // namespace dkit

#endif
