#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/compat.h>

#include "../process.h"
#include "../support.h"
#include "network.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#ifdef DKIT_APP_PATH

namespace dkit {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using test::Process;

/// Runs the real `dkit train` as several processes over loopback, the way torchrun or a user starting each rank by
/// hand would.
class DistributedTrainTest : public test::SeedingFixture {
 protected:
  void SetUp() override {
    DKIT_SKIP_WITHOUT_GLOO();
  }

  DistributedTrainTest() {
    // 1010 samples, 808 for training: 26 global batches of 32 per epoch, the last one of 8 samples, all of which
    // rank 0 takes (rank 1 has none).
    config_ = tmp_.file("config.yaml");
    std::ofstream(config_) << "device: cpu\nthreads: 1\nseed: 3\n"
                              "data: {source: synthetic, samples: 1010, features: 16, classes: 4, val_fraction: 0.2}\n"
                              "model: {hidden: [32, 32], dropout: 0.0}\n"
                              "train: {epochs: 3, batch_size: 16, optimizer: sgd, momentum: 0.9, lr: 0.05, "
                              "log_every: 10, checkpoint_every: 0}\n"
                              "dist: {timeout: 20}\n";
  }

  std::vector<std::string> train(const std::string& out, const std::vector<std::string>& sets = {}) const {
    std::vector<std::string> args{DKIT_APP_PATH, "train", "--config", config_, "--out", out, "--no-progress"};
    for (const auto& set : sets) {
      args.push_back("--set");
      args.push_back(set);
    }
    return args;
  }

  static std::vector<std::string> resume(const std::string& out, const std::vector<std::string>& sets = {}) {
    std::vector<std::string> args{DKIT_APP_PATH, "train", "--resume", out, "--no-progress"};
    for (const auto& set : sets) {
      args.push_back("--set");
      args.push_back(set);
    }
    return args;
  }

  static std::vector<std::string> rank_env(int rank, int world_size, int port) {
    return {"RANK=" + std::to_string(rank),          "WORLD_SIZE=" + std::to_string(world_size),
            "LOCAL_RANK=" + std::to_string(rank),    "LOCAL_WORLD_SIZE=" + std::to_string(world_size),
            "MASTER_ADDR=127.0.0.1",                 "MASTER_PORT=" + std::to_string(port)};
  }

  /// Starts `argv_of(rank)` as each of `world_size` ranks; rank 0's stderr goes to `rank0_err`.
  std::vector<std::unique_ptr<Process>> start_ranks(int world_size,
                                                    const std::function<std::vector<std::string>(int)>& argv_of,
                                                    const std::string& name,
                                                    test::ErrTo rank0_err = test::ErrTo::kFile) {
    const int port = test::free_port();
    std::vector<std::unique_ptr<Process>> ranks;
    for (int r = 0; r < world_size; ++r) {
      ranks.push_back(std::make_unique<Process>(argv_of(r), tmp_.file(name + "-rank" + std::to_string(r)),
                                                rank_env(r, world_size, port),
                                                r == 0 ? rank0_err : test::ErrTo::kFile));
    }
    return ranks;
  }

  /// Runs every rank to its end; expects each to succeed.
  void run_ranks(int world_size, const std::function<std::vector<std::string>(int)>& argv_of, const std::string& name) {
    auto ranks = start_ranks(world_size, argv_of, name);
    for (size_t r = 0; r < ranks.size(); ++r) {
      EXPECT_EQ(ranks[r]->wait(), 0) << name << " rank " << r << ":\n" << ranks[r]->err();
    }
  }

  static StateDict weights(const std::string& run) {
    return load_training_checkpoint(run + "/checkpoints/last.pt").model_state_dict;
  }

  /// The largest absolute difference between two state dicts with the same keys.
  static double max_difference(const StateDict& a, const StateDict& b) {
    EXPECT_EQ(a.keys(), b.keys());
    double worst = 0;
    for (const auto& item : a) {
      if (b.contains(item.key())) {
        worst = std::max(worst, (item.value() - b[item.key()]).abs().max().item<double>());
      }
    }
    return worst;
  }

  test::TempDir tmp_;
  std::string config_;
};

// Kept tight: the two runs differ only in how each step's gradient sum is split between two matrix products and
// one addition, so the weights agree to float32 rounding after all 78 steps. Adam divides each gradient by the root
// of its running square, which magnifies those rounding differences where that is small.
constexpr double kTolerance = 1e-5;
constexpr double kAdamTolerance = 1e-4;

TEST_F(DistributedTrainTest, TwoRanksEndWithTheWeightsOfOneProcessWithTwiceTheBatch) {
  for (const std::string optimizer : {"sgd", "adam"}) {
    const std::string single = tmp_.file("single-" + optimizer);
    const std::string multi = tmp_.file("multi-" + optimizer);
    ASSERT_EQ(test::run_process(train(single, {"train.batch_size=32", "train.optimizer=" + optimizer}), single), 0)
        << test::read_file(single + ".err");
    run_ranks(
        2,
        [&](int r) {
          return train(r == 0 ? multi : multi + "-rank1", {"train.optimizer=" + optimizer});
        },
        "multi-" + optimizer);
    EXPECT_FALSE(fs::exists(multi + "-rank1")) << "only rank 0 writes a run folder";
    const std::string log = test::read_file(multi + "/train.log");
    EXPECT_NE(log.find("each step: dkit's written-out backward pass"), std::string::npos) << log;
    const StateDict a = weights(single);
    const StateDict b = weights(multi);
    for (const auto& key : b.keys()) {
      EXPECT_NE(key.rfind("module.", 0), 0u) << key;
    }
    const double difference = max_difference(a, b);
    std::cout << "[ MEASURED ] " << optimizer << ": largest weight difference, 2 ranks x 16 vs 1 x 32 after 78 steps: "
              << difference << "\n";
    RecordProperty("max_weight_difference_" + optimizer, std::to_string(difference));
    EXPECT_LT(difference, optimizer == "adam" ? kAdamTolerance : kTolerance) << optimizer;
    const auto single_checkpoint = load_training_checkpoint(single + "/checkpoints/last.pt");
    const auto multi_checkpoint = load_training_checkpoint(multi + "/checkpoints/last.pt");
    EXPECT_EQ(multi_checkpoint.step, 78);
    EXPECT_EQ(multi_checkpoint.step, single_checkpoint.step);
    EXPECT_EQ(multi_checkpoint.world_size, 2);
    EXPECT_EQ(single_checkpoint.world_size, 1);
    const std::string summary = test::read_file(multi + "/summary.json");
    EXPECT_NE(summary.find("\"steps\":78,\"samples\":2424,"), std::string::npos) << summary;
  }
}

TEST_F(DistributedTrainTest, CheckpointsMoveBetweenOneAndTwoProcesses) {
  const std::string reference = tmp_.file("reference");
  ASSERT_EQ(test::run_process(train(reference, {"train.batch_size=32"}), reference), 0) << test::read_file(reference + ".err");
  const StateDict expected = weights(reference);

  // Two ranks stop at step 30 (epoch 2, batch 4); one process continues with the same global batch.
  const std::string from_two = tmp_.file("from-two");
  run_ranks(2, [&](int) { return train(from_two, {"train.max_steps=30"}); }, "from-two");
  EXPECT_EQ(load_training_checkpoint(from_two + "/checkpoints/last.pt").step, 30);
  const std::string single_copy = tmp_.file("from-two-copy");
  fs::copy(from_two, single_copy, fs::copy_options::recursive);
  ASSERT_EQ(test::run_process(resume(from_two, {"train.batch_size=32", "train.max_steps=0"}), from_two + "-resumed"), 0)
      << test::read_file(from_two + "-resumed.err");
  EXPECT_LT(max_difference(weights(from_two), expected), kTolerance);

  // One process stops at step 30; two ranks, both reading its checkpoint folder, continue.
  const std::string from_one = tmp_.file("from-one");
  ASSERT_EQ(test::run_process(train(from_one, {"train.batch_size=32", "train.max_steps=30"}), from_one), 0)
      << test::read_file(from_one + ".err");
  run_ranks(2, [&](int) { return resume(from_one, {"train.batch_size=16", "train.max_steps=0"}); }, "from-one");
  EXPECT_LT(max_difference(weights(from_one), expected), kTolerance);
  EXPECT_EQ(load_training_checkpoint(from_one + "/checkpoints/last.pt").world_size, 2);

  // One process with half the global batch continues the two ranks' epoch at the same sample.
  ASSERT_EQ(test::run_process(resume(single_copy, {"train.max_steps=0"}), single_copy + "-resumed"), 0)
      << test::read_file(single_copy + "-resumed.err");
  EXPECT_NE(test::read_file(single_copy + "/train.log")
                .find("the global batch changed from 32 to 16: epoch 2 continues at batch 8 (after sample 128)"),
            std::string::npos);
}

TEST_F(DistributedTrainTest, SigtermToOneRankStopsEveryRankAtTheSameStep) {
  const std::vector<std::string> longer = {"train.epochs=40", "train.checkpoint_every=0"};
  const std::string reference = tmp_.file("reference");
  run_ranks(2, [&](int) { return train(reference, longer); }, "reference");
  const std::string run = tmp_.file("run");
  // Rank 0 logs to a one-page pipe, so it is at most a page of lines (about 700 of the 1040 steps) past step 30
  // when the signal is sent.
  auto ranks = start_ranks(2, [&](int) { return train(run, longer); }, "run", test::ErrTo::kPipe);
  ASSERT_TRUE(test::read_until_step(*ranks[0], 30)) << "the run ended before it could be signalled";
  ranks[1]->signal(SIGTERM);
  EXPECT_EQ(ranks[0]->wait(), 143) << ranks[0]->err();
  EXPECT_EQ(ranks[1]->wait(), 143) << ranks[1]->err();
  const std::string err = ranks[0]->err();
  EXPECT_NE(err.find("dkit: stopped by signal 15 after step "), std::string::npos) << err;
  EXPECT_EQ(ranks[1]->out(), "") << "only rank 0 prints the summary";
  const auto stopped = load_training_checkpoint(run + "/checkpoints/last.pt");
  EXPECT_GT(stopped.step, 0);
  EXPECT_LT(stopped.step, 40 * 26);
  EXPECT_NE(err.find("after step " + std::to_string(stopped.step) + ";"), std::string::npos) << err;
  run_ranks(2, [&](int) { return resume(run); }, "resumed");
  EXPECT_EQ(max_difference(weights(run), weights(reference)), 0.0) << "a resumed two-rank run continues exactly";
}

TEST_F(DistributedTrainTest, AKilledRankMakesTheOtherFailNamingIt) {
  for (const int victim : {1, 0}) {
    const std::string run = tmp_.file("run" + std::to_string(victim));
    auto ranks = start_ranks(2, [&](int) { return train(run, {"train.epochs=1000"}); }, "kill" + std::to_string(victim),
                             test::ErrTo::kPipe);
    ASSERT_TRUE(test::read_until_step(*ranks[0], 20)) << ranks[0]->err();
    const int survivor = 1 - victim;
    ranks[victim]->signal(SIGKILL);
    const auto killed = Clock::now();
    // A hang guard only: the survivor's own limit is dist.timeout (20 s); the time is printed, not judged.
    ASSERT_TRUE(ranks[survivor]->wait_for(std::chrono::seconds(300)))
        << "rank " << survivor << " still runs 300 s after rank " << victim << " was killed (dist.timeout 20)";
    const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
    std::cout << "[ MEASURED ] rank " << survivor << " exited " << seconds << " s after rank " << victim
              << " was killed\n";
    EXPECT_EQ(ranks[survivor]->wait(), 1);
    const std::string err = ranks[survivor]->err();
    const std::string lost = "\ndkit: error: rank " + std::to_string(victim) + " of 2 (host ";
    EXPECT_NE(("\n" + err).find(lost), std::string::npos) << err;
    const std::string why = victim == 1 ? ") is gone: its heartbeat stopped"
                                        : ") is gone: the rendezvous store it hosted at 127.0.0.1:";
    EXPECT_NE(err.find(why), std::string::npos) << err;
    EXPECT_NE(err.find("; rank " + std::to_string(survivor) + " stops: the "), std::string::npos) << err;
    std::cout << "[ MESSAGE  ] " << err.substr(err.find("dkit: error:"));
  }
}

// Every rank prints its own error, not only rank 0: here rank 1 cannot read its data (a file missing on its
// machine), says so, and rank 0 quotes it.
TEST_F(DistributedTrainTest, ARankOtherThanZeroPrintsItsOwnErrorAndRankZeroQuotesIt) {
  const std::string run = tmp_.file("own");
  const std::string missing = tmp_.file("missing.csv");
  auto ranks = start_ranks(2, [&](int r) {
    return r == 0 ? train(run) : train(run, {"data.source=csv", "data.path=" + missing});
  }, "own");
  EXPECT_EQ(ranks[1]->wait(), 1);
  const std::string own = "cannot open CSV file '" + missing + "': No such file or directory";
  // From dkit's first line on, one line; before it, LibTorch 2.14's Gloo logs its connections to stderr itself.
  const std::string rank1 = ranks[1]->err();
  EXPECT_EQ(rank1.substr(std::min(rank1.find("dkit: error: "), rank1.size())), "dkit: error: " + own + "\n") << rank1;
  EXPECT_EQ(ranks[0]->wait(), 1);
  const std::string err = ranks[0]->err();
  EXPECT_NE(("\n" + err).find("\ndkit: error: rank 1 of 2 (host "), std::string::npos) << err;
  EXPECT_NE(err.find(") failed: " + own + "; rank 0 stops: "), std::string::npos) << err;
}

#ifdef DKIT_CNN_RUN_PATH
// The Trainer of any module over c10d: two ranks of batch 16 take the steps one process of batch 32 takes (a CNN
// without BatchNorm or dropout, whose step does not depend on how its batch is split).
TEST_F(DistributedTrainTest, TwoRanksOfACnnTrainAsOneProcessWithTheWholeBatch) {
  const std::vector<std::string> common{"--epochs", "1", "--max-steps", "20", "--batch-norm", "0", "--dropout", "0",
                                        "--log-every", "5", "--checkpoint-every", "0"};
  const auto cnn = [&](const std::string& out, const std::string& batch) {
    std::vector<std::string> args{DKIT_CNN_RUN_PATH, "--out", out, "--batch-size", batch};
    args.insert(args.end(), common.begin(), common.end());
    return args;
  };
  Process single(cnn(tmp_.file("single"), "32"), tmp_.file("single"));
  ASSERT_EQ(single.wait(), 0) << single.err();
  run_ranks(2, [&](int) { return cnn(tmp_.file("two"), "16"); }, "two");
  const TrainingCheckpoint one = load_training_checkpoint(tmp_.file("single/checkpoints/last.pt"));
  const TrainingCheckpoint two = load_training_checkpoint(tmp_.file("two/checkpoints/last.pt"));
  EXPECT_EQ(two.step, 20);
  EXPECT_EQ(two.world_size, 2);
  EXPECT_LE(max_difference(one.model_state_dict, two.model_state_dict), 1e-6);
}

// Accumulation and clipping over c10d: two ranks of batch 8, each summing two batches into a step whose gradients are
// summed over the ranks once and then clipped, take the steps one process of batch 32 takes with the same clip.
TEST_F(DistributedTrainTest, TwoRanksAccumulatingAndClippingTrainAsOneProcessWithTheWholeBatch) {
  const std::vector<std::string> common{"--epochs", "1", "--max-steps", "10", "--batch-norm", "0", "--dropout", "0",
                                        "--log-every", "5", "--checkpoint-every", "0", "--clip", "0.5"};
  const auto cnn = [&](const std::string& out, const std::string& batch, const std::string& accumulate) {
    std::vector<std::string> args{DKIT_CNN_RUN_PATH, "--out", out, "--batch-size", batch, "--accumulate", accumulate};
    args.insert(args.end(), common.begin(), common.end());
    return args;
  };
  Process single(cnn(tmp_.file("single"), "32", "1"), tmp_.file("single"));
  ASSERT_EQ(single.wait(), 0) << single.err();
  run_ranks(2, [&](int) { return cnn(tmp_.file("two"), "8", "2"); }, "two");
  const TrainingCheckpoint one = load_training_checkpoint(tmp_.file("single/checkpoints/last.pt"));
  const TrainingCheckpoint two = load_training_checkpoint(tmp_.file("two/checkpoints/last.pt"));
  EXPECT_EQ(two.step, 10);
  EXPECT_EQ(two.epoch_step, 20) << "two global batches of 16 a step";
  EXPECT_LE(max_difference(one.model_state_dict, two.model_state_dict), 1e-6);
}

// A spent max_time stops every rank at the same step, at the metrics flush that carries stop requests, with a
// checkpoint; rank 0 says why in its log and in summary.json.
TEST_F(DistributedTrainTest, MaxTimeStopsEveryRankAtTheSameStep) {
  auto ranks = start_ranks(2, [&](int) {
    return std::vector<std::string>{DKIT_CNN_RUN_PATH, "--out", tmp_.file("timed"), "--epochs", "1", "--batch-size",
                                    "16", "--log-every", "5", "--max-time", "1e-9"};
  }, "timed");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ranks[static_cast<size_t>(r)]->wait(), 0) << ranks[static_cast<size_t>(r)]->err();
  }
  EXPECT_NE(ranks[0]->err().find("stopped after step 5: max_time of 1e-09 s spent"), std::string::npos)
      << ranks[0]->err();
  EXPECT_EQ(load_training_checkpoint(tmp_.file("timed/checkpoints/last.pt")).step, 5);
  EXPECT_NE(test::read_file(tmp_.file("timed/summary.json")).find("\"stop_reason\":\"max_time\""),
            std::string::npos);
}

// With BatchNorm each rank's running statistics move with its own half of the batch; rank 0's are broadcast after
// every step, as DistributedDataParallel's broadcast_buffers does, so every step starts from rank 0's on each rank.
TEST_F(DistributedTrainTest, EveryRanksBatchNormBuffersAreRankZerosAfterEveryStep) {
  auto ranks = start_ranks(2, [&](int) {
    return std::vector<std::string>{DKIT_CNN_RUN_PATH, "--out", tmp_.file("buffers"), "--epochs", "1", "--max-steps",
                                    "20", "--batch-size", "16", "--buffers", "1", "--log-every", "5"};
  }, "buffers");
  std::vector<std::map<int64_t, std::string>> sums(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ranks[static_cast<size_t>(r)]->wait(), 0) << ranks[static_cast<size_t>(r)]->err();
    std::istringstream err(ranks[static_cast<size_t>(r)]->err());
    for (std::string line; std::getline(err, line);) {
      const std::string prefix = "rank " + std::to_string(r) + " step ";
      if (line.rfind(prefix, 0) == 0) {
        const size_t space = line.find(' ', prefix.size());
        sums[static_cast<size_t>(r)][std::stoll(line.substr(prefix.size(), space - prefix.size()))] =
            line.substr(line.rfind(' ') + 1);
      }
    }
  }
  ASSERT_EQ(sums[0].size(), 20u);
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_NE(sums[0][1], sums[0][2]) << "the buffers moved";
}
#endif

TEST_F(DistributedTrainTest, BadRendezvousVariablesAreNamed) {
  const std::string run = tmp_.file("bad");
  Process bad_port(train(run), run, {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1",
                                     "MASTER_PORT=70000"});
  EXPECT_EQ(bad_port.wait(), 1);
  EXPECT_EQ(bad_port.err(), "dkit: error: MASTER_PORT=70000 is not a TCP port: it must be in [1, 65535]\n");

  Process no_host(train(run), run + "-host", {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1",
                                              "MASTER_ADDR=no-such-host.invalid", "MASTER_PORT=29500"});
  EXPECT_EQ(no_host.wait(), 1);
  EXPECT_EQ(no_host.err().rfind("dkit: error: MASTER_ADDR='no-such-host.invalid' cannot be resolved: ", 0), 0u)
      << no_host.err();

  const int port = test::free_port();
  Process alone(train(run, {"dist.timeout=1"}), run + "-alone", rank_env(1, 2, port));
  EXPECT_EQ(alone.wait(), 1);
  const std::string p = std::to_string(port);
  // c10d's own log line about the timeout may come first.
  EXPECT_NE(alone.err().find("dkit: error: rank 1 could not reach the rendezvous store at MASTER_ADDR=127.0.0.1 "
                             "MASTER_PORT=" + p + " (127.0.0.1:" + p + ") within 1 s (dist.timeout): is "
                             "rank 0 running there? "),
            std::string::npos)
      << alone.err();
  EXPECT_FALSE(fs::exists(run)) << "a run that never joined writes nothing";
}

// A store host that stops answering while the ranks join (its process stopped, as a stalled machine is): every
// store call of the rendezvous ends within dist.timeout, with the store's address and the phase. c10d's own store
// client would wait for the answer forever (LibTorch 1.13: the first add after connecting; 2.x: the ping inside
// TCPStore's constructor, or a wait's cancelling).
TEST_F(DistributedTrainTest, AStoreThatStopsAnsweringEndsTheRendezvousWithinTheTimeout) {
  const std::string run = tmp_.file("silent");
  const int port = test::free_port();
  const auto rank = [&](int r, int world_size, int timeout) {
    return std::make_unique<Process>(train(run, {"dist.timeout=" + std::to_string(timeout)}),
                                     run + "-" + std::to_string(world_size) + "-rank" + std::to_string(r),
                                     rank_env(r, world_size, port));
  };
  const auto wait_until = [](const std::function<bool()>& done, Process& host) {
    const auto guard = Clock::now() + std::chrono::seconds(120);
    while (!done()) {
      if (host.finished() || Clock::now() > guard) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  };
  const auto expect_error = [&](Process& process, const std::string& line, Clock::time_point since,
                                const std::string& what, const std::string& since_what) {
    // A hang guard only: c10d alone would wait forever; the time is printed, not judged.
    ASSERT_TRUE(process.wait_for(std::chrono::seconds(120))) << what << ": rank 1 still runs after 120 s";
    std::cout << "[ MEASURED ] " << what << ": rank 1 ended "
              << std::chrono::duration<double>(Clock::now() - since).count() << " s after " << since_what << "\n";
    EXPECT_EQ(process.wait(), 1) << process.err();
    const std::string err = process.err();
    EXPECT_EQ(err.substr(std::min(err.rfind("dkit: error: "), err.size())), "dkit: error: " + line + "\n") << err;
  };
  const std::string p = std::to_string(port);
  const std::string store = "the rendezvous store at MASTER_ADDR=127.0.0.1 MASTER_PORT=" + p + " (127.0.0.1:" + p + ")";

  // Stopped once it listens, before rank 1 connects: the kernel still accepts the connection, nothing answers.
  {
    auto host = rank(0, 2, 2);
    ASSERT_TRUE(wait_until([&] { return test::accepts_connections(port); }, *host)) << host->err();
    host->stop();
    const auto started = Clock::now();
    auto joining = rank(1, 2, 2);
    expect_error(*joining, "rank 1 could not reach " + store + " within 2 s (dist.timeout): is rank 0 running there? "
                 "Nothing answered there", started, "connecting", "it started");
    host->signal(SIGKILL);
    host->resume();
    EXPECT_EQ(host->wait(), 128 + SIGKILL);
  }

  // Stopped once rank 1 has joined and waits for rank 2, which never comes.
  {
    auto host = rank(0, 3, 8);
    auto joining = rank(1, 3, 8);
    ASSERT_TRUE(wait_until([&] { return test::accepts_connections(port); }, *host)) << host->err();
    auto client = c10::make_intrusive<c10d::TCPStore>(
        "127.0.0.1", compat::tcp_store_options<c10d::TCPStoreOptions>(static_cast<uint16_t>(port), /*is_server=*/false, std::chrono::seconds(10)));
    ASSERT_TRUE(wait_until([&] { return client->check({"dkit/member/1"}); }, *host)) << host->err();
    client.reset();
    host->stop();
    const auto stopped = Clock::now();
    expect_error(*joining, "rank 1 lost " + store + " while waiting for the other ranks: it did not answer within 8 s "
                 "(dist.timeout): is rank 0 stopped, or the network to it cut?", stopped, "waiting", "rank 0 stopped");
    host->signal(SIGKILL);
    host->resume();
    EXPECT_EQ(host->wait(), 128 + SIGKILL);
  }
  EXPECT_FALSE(fs::exists(run)) << "a run that never joined writes nothing";
}

TEST_F(DistributedTrainTest, TorchrunStartsTheRanks) {
  const char* torchrun = "/usr/bin/torchrun";
  if (!fs::exists(torchrun)) {
    GTEST_SKIP() << torchrun << " is absent (Debian: python3-torch): this test runs dkit under torchrun";
  }
  const std::string run = tmp_.file("torchrun");
  // Underscored options, which every torchrun accepts (1.13 knows no other spelling). `--redirects 1 --tee 1`
  // avoids torchrun 1.13's crash under Python 3.11 with its default of 0 ("'NoneType' object has no attribute
  // 'get'"): stdout is also kept in torchrun's log folder, and still shown.
  std::vector<std::string> args{torchrun, "--nproc_per_node=2", "--no_python",
                                "--master_port=" + std::to_string(test::free_port()),
                                "--redirects", "1", "--tee", "1",
                                "--log_dir", tmp_.file("torchrun-logs")};
  for (const auto& arg : train(run, {"train.epochs=1"})) {
    args.push_back(arg);
  }
  // USE_LIBUV=0: torchrun 2.4 and later start their store with libuv, which Debian builds PyTorch without; 2.14
  // heeds the variable, 2.6 does not (then the test is skipped below).
  Process launcher(args, run, {"USE_LIBUV=0"});
  // A hang guard only, far above the seconds a one-epoch run takes.
  ASSERT_TRUE(launcher.wait_for(std::chrono::seconds(600))) << "torchrun did not finish within 600 s";
  if (launcher.wait() != 0 && launcher.err().find("use_libuv was requested but PyTorch was buil") != std::string::npos) {
    GTEST_SKIP() << "this torchrun cannot start its own store: it asks for the libuv server (PyTorch 2.4+), which its "
                    "PyTorch was built without (Debian's python3-torch 2.6); dkit never got to run";
  }
  EXPECT_EQ(launcher.wait(), 0) << launcher.out() << launcher.err();
  const std::string summary = test::read_file(run + "/summary.json");
  EXPECT_NE(summary.find("\"steps\":26,\"samples\":808,"), std::string::npos) << summary << launcher.err();
  EXPECT_NE(test::read_file(run + "/train.log").find("x 2 processes (gloo, global batch 32)"), std::string::npos);
}

/// The pids of the children of process `parent`.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    std::istringstream stat(test::read_file(entry.path().string() + "/stat"));
    std::string pid, command, state;
    pid_t ppid = 0;
    // `pid (comm) state ppid ...`; the command has no spaces here (dkit, python3).
    if (stat >> pid >> command >> state >> ppid && ppid == parent) {
      pids.push_back(std::stoi(pid));
    }
  }
  return pids;
}

TEST_F(DistributedTrainTest, TorchrunRestartsAKilledRankAndTheRunEndsAsIfUninterrupted) {
  const char* torchrun = "/usr/bin/torchrun";
  if (!fs::exists(torchrun)) {
    GTEST_SKIP() << torchrun << " is absent (Debian: python3-torch): this test runs dkit under torchrun";
  }
  // 30 epochs of 26 steps: rank 0 logs to a one-page pipe (every 10 steps, about 45 lines a page), so when the test
  // reads step 60 the run is at most about 500 steps further, well before its end.
  const std::vector<std::string> sets = {"train.epochs=30", "train.checkpoint_every=50"};
  const std::string reference = tmp_.file("reference");
  run_ranks(2, [&](int) { return train(reference, sets); }, "reference");

  const std::string run = tmp_.file("restarted");
  std::vector<std::string> args{torchrun, "--nproc_per_node=2", "--no_python", "--max_restarts=1",
                                "--monitor_interval=1", "--master_port=" + std::to_string(test::free_port()),
                                "--redirects", "1", "--tee", "1", "--log_dir", tmp_.file("torchrun-logs")};
  for (const auto& arg : train(run, sets)) {
    args.push_back(arg);
  }
  args.push_back("--auto-resume");
  Process launcher(args, run, {"USE_LIBUV=0"}, test::ErrTo::kPipe);
  // Rank 0's log lines come through torchrun's stderr: kill a worker once the run is past its first checkpoint.
  const bool reached = test::read_until_step(launcher, 60);
  if (!reached && launcher.wait() != 0 &&
      launcher.err().find("use_libuv was requested but PyTorch was buil") != std::string::npos) {
    GTEST_SKIP() << "this torchrun cannot start its own store (libuv; see TorchrunStartsTheRanks)";
  }
  ASSERT_TRUE(reached) << launcher.err();
  auto workers = children_of(launcher.pid());
  ASSERT_EQ(workers.size(), 2u) << "torchrun's workers";
  ::kill(workers.back(), SIGKILL);
  ASSERT_TRUE(launcher.wait_for(std::chrono::seconds(600))) << "torchrun did not finish within 600 s";
  EXPECT_EQ(launcher.wait(), 0) << launcher.err();
  const std::string err = launcher.err();
  EXPECT_NE(err.find("dkit: resuming from " + run + "/checkpoints/"), std::string::npos) << err;
  const auto restarted = load_training_checkpoint(run + "/checkpoints/last.pt");
  EXPECT_EQ(restarted.step, 30 * 26);
  // The same steps from the same checkpoint, data order and random state: bitwise the same weights.
  EXPECT_EQ(max_difference(restarted.model_state_dict, weights(reference)), 0.0)
      << "a run restarted by torchrun ends as an uninterrupted one";
}

} // namespace
} // namespace dkit

#endif
