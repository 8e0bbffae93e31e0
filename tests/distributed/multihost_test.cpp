#include <dkit/checkpoint/training_checkpoint.h>

#include "../process.h"
#include "../support.h"
#include "netns.h"
#include "network.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#ifdef DKIT_APP_PATH

namespace dkit {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using test::Process;

// The tests' dist.timeout, kept small so that each fault costs the suite seconds: a collective waits 2.8 s for the
// peer (dist.timeout less six heartbeat periods of 0.2 s), as long as a rank may stall (rank 0 writing a checkpoint).
constexpr int kTimeoutSeconds = 4;
// dkit ends every rank within dist.timeout of the moment it next waits for the lost peer; the tests measure from the
// fault, so they allow what lies between (the step under way, milliseconds here) and their own 20 ms polling, with
// room for a machine that other tests, builds or a sanitizer keep busy (measured: 0.0-0.3 s past the timeout).
constexpr double kSlackSeconds = 1.5;
// A hang guard only: far above any time a rank should take; the verdict on time is the bound above.
constexpr auto kHangGuard = std::chrono::seconds(120);

/// Runs the real `dkit train` as rank 0 on host A and rank 1 on host B, two network namespaces joined by a veth
/// pair, with `MASTER_ADDR` host A's address: two machines as far as dkit can tell.
class MultiHostTest : public test::SeedingFixture {
 protected:
  void SetUp() override {
    DKIT_SKIP_WITHOUT_GLOO();
    DKIT_SKIP_WITHOUT_HOSTS(hosts_);
  }

  MultiHostTest() {
    // 1010 samples, 808 for training: 26 global batches of 32 per epoch.
    config_ = tmp_.file("config.yaml");
    std::ofstream(config_) << "device: cpu\nthreads: 1\nseed: 3\n"
                              "data: {source: synthetic, samples: 1010, features: 16, classes: 4, val_fraction: 0.2}\n"
                              "model: {hidden: [32, 32], dropout: 0.0}\n"
                              "train: {epochs: 3, batch_size: 16, optimizer: sgd, momentum: 0.9, lr: 0.05, "
                              "log_every: 10, checkpoint_every: 50}\n"
                              "dist: {timeout: "
                           << kTimeoutSeconds << "}\n";
  }

  std::vector<std::string> train(const std::string& out, const std::vector<std::string>& sets = {}) const {
    std::vector<std::string> args{DKIT_APP_PATH, "train", "--config", config_, "--out", out, "--no-progress"};
    for (const auto& set : sets) {
      args.push_back("--set");
      args.push_back(set);
    }
    return args;
  }

  std::vector<std::string> rank_env(int rank, int port) const {
    return {"RANK=" + std::to_string(rank), "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1",
            "MASTER_ADDR=" + hosts_.address('a'), "MASTER_PORT=" + std::to_string(port)};
  }

  static char host_of(int rank) {
    return rank == 0 ? 'a' : 'b';
  }

  /// Starts rank 0 on host A and rank 1 on host B, each running `argv`.
  std::vector<std::unique_ptr<Process>> start_ranks(const std::vector<std::string>& argv, const std::string& name) {
    const int port = test::free_port();
    std::vector<std::unique_ptr<Process>> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.push_back(std::make_unique<Process>(hosts_.on(host_of(r), argv),
                                                tmp_.file(name + "-rank" + std::to_string(r)), rank_env(r, port)));
    }
    return ranks;
  }

  /// Waits until the run in `run` has written its first checkpoint; false if `rank0` ended first.
  static bool wait_for_checkpoint(const std::string& run, Process& rank0) {
    const auto deadline = Clock::now() + kHangGuard;
    while (!fs::exists(run + "/checkpoints/last.pt")) {
      if (rank0.finished() || Clock::now() > deadline) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  /// Waits for `process` to end; the seconds from `since` to its end (to 20 ms), or -1 when it did not within the
  /// hang guard.
  static double seconds_to_end(Process& process, Clock::time_point since) {
    const auto deadline = Clock::now() + kHangGuard;
    while (!process.finished()) {
      if (Clock::now() > deadline) {
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::chrono::duration<double>(Clock::now() - since).count();
  }

  /// The start of the error line naming rank `peer` of the run, as the other rank prints it.
  std::string names_peer(int peer, const Process& process) const {
    return "dkit: error: rank " + std::to_string(peer) + " of 2 (host " + hosts_.name(host_of(peer)) + " (" +
           hosts_.address(host_of(peer)) + "), pid " + std::to_string(process.pid()) + ") ";
  }

  /// Expects `rank` to have ended by itself with status 1 within dist.timeout + the slack of `seconds`, its stderr
  /// ending in one error line that contains `line` and `what`.
  void expect_ended(const std::string& fault, int rank, Process& process, double seconds, const std::string& line,
                    const std::string& what) {
    std::cout << "[ MEASURED ] " << fault << ": rank " << rank << " ended " << seconds << " s after the fault\n";
    RecordProperty(fault + "_rank" + std::to_string(rank) + "_seconds", std::to_string(seconds));
    ASSERT_GE(seconds, 0) << fault << ": rank " << rank << " still runs " << kHangGuard.count()
                          << " s after the fault";
    EXPECT_LE(seconds, kTimeoutSeconds + kSlackSeconds)
        << fault << ": rank " << rank << " took longer than dist.timeout (" << kTimeoutSeconds << " s) + "
        << kSlackSeconds << " s to end";
    EXPECT_EQ(process.wait(), 1) << process.err();
    const std::string err = process.err();
    const auto at = err.rfind("dkit: error: ");
    ASSERT_NE(at, std::string::npos) << fault << ": rank " << rank << " printed no error:\n" << err;
    const std::string last = err.substr(at);
    EXPECT_EQ(last.find('\n'), last.size() - 1) << "one line:\n" << last;
    EXPECT_EQ(last.rfind(line, 0), 0u) << last;
    EXPECT_NE(last.find(what), std::string::npos) << what << "\n" << last;
    std::cout << "[ MESSAGE  ] " << last;
  }

  /// Expects that nothing runs in either host any more, and that the newest checkpoint of `run` reads.
  void expect_clean(const std::string& run) {
    const auto left = hosts_.processes();
    EXPECT_TRUE(left.empty()) << left.size() << " process(es) left behind in the hosts (killed now)";
    const auto newest = CheckpointFolder(run).load_newest();
    ASSERT_TRUE(newest.has_value()) << "no readable checkpoint in " << run;
    EXPECT_TRUE(newest->skipped.empty()) << newest->skipped.front();
    EXPECT_GT(newest->checkpoint.step, 0);
  }

  test::TwoHosts hosts_;
  test::TempDir tmp_;
  std::string config_;
};

TEST_F(MultiHostTest, TwoHostsEndWithTheWeightsOfOneProcessWithTwiceTheBatch) {
  const std::string single = tmp_.file("single");
  ASSERT_EQ(test::run_process(train(single, {"train.batch_size=32"}), single), 0) << test::read_file(single + ".err");
  const std::string multi = tmp_.file("multi");
  auto ranks = start_ranks(train(multi), "multi");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r]->wait(), 0) << "rank " << r << ":\n" << ranks[r]->err();
  }
  const StateDict a = load_training_checkpoint(single + "/checkpoints/last.pt").model_state_dict;
  const auto checkpoint = load_training_checkpoint(multi + "/checkpoints/last.pt");
  double worst = 0;
  for (const auto& item : a) {
    worst = std::max(worst, (item.value() - checkpoint.model_state_dict[item.key()]).abs().max().item<double>());
  }
  std::cout << "[ MEASURED ] largest weight difference, 2 hosts x 16 vs 1 x 32 after 78 steps: " << worst << "\n";
  EXPECT_LT(worst, 1e-5);
  EXPECT_EQ(checkpoint.step, 78);
  EXPECT_EQ(checkpoint.world_size, 2);
  EXPECT_NE(test::read_file(multi + "/train.log").find("2 processes over gloo (" + hosts_.address('a') + ":"),
            std::string::npos);
}

TEST_F(MultiHostTest, ACutLinkEndsEveryRankNamingThePeer) {
  const std::string run = tmp_.file("run");
  auto ranks = start_ranks(train(run, {"train.epochs=100000"}), "cut");
  ASSERT_TRUE(wait_for_checkpoint(run, *ranks[0])) << ranks[0]->err();
  hosts_.cut();
  const auto cut = Clock::now();
  std::vector<double> seconds(2);
  for (int r = 0; r < 2; ++r) {
    seconds[r] = seconds_to_end(*ranks[r], cut);
  }
  expect_ended("cut", 0, *ranks[0], seconds[0], names_peer(1, *ranks[1]), "is gone: its heartbeat stopped");
  expect_ended("cut", 1, *ranks[1], seconds[1], names_peer(0, *ranks[0]),
               "is unreachable: the rendezvous store it hosts at " + hosts_.address('a') + ":");
  expect_clean(run);
}

TEST_F(MultiHostTest, AStoppedHostEndsTheOtherAndItselfOnceItGoesOn) {
  for (const int victim : {1, 0}) {
    const std::string fault = "stop" + std::to_string(victim);
    const std::string run = tmp_.file(fault);
    auto ranks = start_ranks(train(run, {"train.epochs=100000"}), fault);
    ASSERT_TRUE(wait_for_checkpoint(run, *ranks[0])) << ranks[0]->err();
    const int survivor = 1 - victim;
    ranks[victim]->stop();
    const double survivor_seconds = seconds_to_end(*ranks[survivor], Clock::now());
    expect_ended(fault, survivor, *ranks[survivor], survivor_seconds, names_peer(victim, *ranks[victim]),
                 victim == 1 ? "is gone: its heartbeat stopped" : "is unreachable: the rendezvous store it hosts");
    // The stopped host comes back to a run that is over: it finds that out and ends by itself too.
    ranks[victim]->resume();
    const double victim_seconds = seconds_to_end(*ranks[victim], Clock::now());
    expect_ended(fault + "-resumed", victim, *ranks[victim], victim_seconds, names_peer(survivor, *ranks[survivor]),
                 victim == 1 ? "is gone: the rendezvous store it hosted at " : "is gone: its heartbeat stopped");
    expect_clean(run);
  }
}

TEST_F(MultiHostTest, AKilledRankEndsTheOtherNamingIt) {
  for (const int victim : {1, 0}) {
    const std::string fault = "kill" + std::to_string(victim);
    const std::string run = tmp_.file(fault);
    auto ranks = start_ranks(train(run, {"train.epochs=100000"}), fault);
    ASSERT_TRUE(wait_for_checkpoint(run, *ranks[0])) << ranks[0]->err();
    const int survivor = 1 - victim;
    ranks[victim]->signal(SIGKILL);
    const double seconds = seconds_to_end(*ranks[survivor], Clock::now());
    expect_ended(fault, survivor, *ranks[survivor], seconds, names_peer(victim, *ranks[victim]),
                 victim == 1 ? "is gone: its heartbeat stopped" : "is gone: the rendezvous store it hosted at ");
    EXPECT_EQ(ranks[victim]->wait(), 128 + SIGKILL);
    expect_clean(run);
  }
}

TEST_F(MultiHostTest, TorchrunOnEachHostMeetsThroughItsC10dRendezvous) {
  const char* torchrun = "/usr/bin/torchrun";
  if (!fs::exists(torchrun)) {
    GTEST_SKIP() << torchrun << " is absent (Debian: python3-torch): this test runs dkit under torchrun";
  }
  const std::string run = tmp_.file("torchrun");
  const std::string endpoint = hosts_.address('a') + ":" + std::to_string(test::free_port());
  std::vector<std::unique_ptr<Process>> agents;
  for (int node = 0; node < 2; ++node) {
    // Underscored options and `--redirects 1 --tee 1`: see TorchrunStartsTheRanks (train_distributed_test.cpp).
    std::vector<std::string> args{torchrun, "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                                  "--rdzv_endpoint=" + endpoint, "--rdzv_id=multihost", "--no_python",
                                  "--redirects", "1", "--tee", "1",
                                  "--log_dir", tmp_.file("torchrun-logs" + std::to_string(node))};
    for (const auto& arg : train(run, {"train.epochs=1"})) {
      args.push_back(arg);
    }
    agents.push_back(std::make_unique<Process>(hosts_.on(host_of(node), args),
                                               tmp_.file("torchrun" + std::to_string(node)),
                                               std::vector<std::string>{"USE_LIBUV=0"}));
  }
  for (int node = 0; node < 2; ++node) {
    ASSERT_TRUE(agents[node]->wait_for(std::chrono::seconds(600))) << "torchrun did not finish within 600 s";
    if (agents[node]->wait() != 0 &&
        agents[node]->err().find("use_libuv was requested but PyTorch was buil") != std::string::npos) {
      GTEST_SKIP() << "this torchrun cannot start its own store (libuv; see TorchrunStartsTheRanks)";
    }
  }
  for (int node = 0; node < 2; ++node) {
    EXPECT_EQ(agents[node]->wait(), 0) << agents[node]->err();
  }
  const std::string summary = test::read_file(run + "/summary.json");
  EXPECT_NE(summary.find("\"steps\":26,\"samples\":808,"), std::string::npos)
      << summary << agents[0]->err() << agents[1]->err();
  EXPECT_NE(test::read_file(run + "/train.log").find("x 2 processes (gloo, global batch 32)"), std::string::npos);
  EXPECT_TRUE(hosts_.processes().empty()) << "processes left behind in the hosts";
}

} // namespace
} // namespace dkit

#endif
