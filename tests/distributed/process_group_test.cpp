#include <dkit/distributed/process_group.h>

#include <dkit/config.h>

#include "../support.h"
#include "network.h"

#include <torch/version.h>

#include <functional>
#include <future>
#include <regex>
#include <thread>

namespace dkit {
namespace {

using namespace std::chrono_literals;
using test::error_message;

/// Each rank of a small run is a thread of this test, with its own ProcessGroupContext over loopback.
class ProcessGroupTest : public test::SeedingFixture {
 protected:
  void SetUp() override {
    DKIT_SKIP_WITHOUT_GLOO();
  }

  LaunchEnvironment env(int64_t rank, int64_t world_size, int64_t world_size_seen = 0) const {
    return test::loopback_launch(rank, world_size_seen > 0 ? world_size_seen : world_size, port_);
  }

  static ProcessGroupOptions quick(std::chrono::milliseconds timeout = 10s) {
    return ProcessGroupOptions().timeout(timeout).heartbeat(100ms);
  }

  std::vector<std::string> run_ranks(const std::vector<LaunchEnvironment>& launches,
                                     const std::function<void(int64_t, ProcessGroupContext&)>& body,
                                     ProcessGroupOptions options = quick()) {
    return test::run_ranks(launches, body, options);
  }

  static std::string error_message_or_empty(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  /// Two ranks: `leaver` joins, runs `before_leaving`, and leaves the run (its group is destroyed, as when its
  /// process dies); then the other rank tries an allreduce. Returns the survivor's error.
  std::string survivor_error(int64_t leaver, const std::function<void(ProcessGroupContext&)>& before_leaving = {}) {
    std::promise<void> left;
    std::thread leaving([&] {
      const std::string error = error_message_or_empty([&] {
        ProcessGroupContext group(env(leaver, 2), cpu(), quick());
        group.barrier("the start");
        if (before_leaving) {
          before_leaving(group);
        }
      });
      EXPECT_EQ(error, "") << "rank " << leaver;
      left.set_value();
    });
    const std::string error = error_message_or_empty([&] {
      ProcessGroupContext group(env(1 - leaver, 2), cpu(), quick());
      group.barrier("the start");
      left.get_future().wait();
      auto t = torch::ones({8});
      group.allreduce_sum(t, "the test allreduce");
    });
    leaving.join();
    return error;
  }

  int port_ = test::free_port();
};

TEST_F(ProcessGroupTest, SumsAndBroadcastsOverTwoRanks) {
  std::vector<at::Tensor> sums(2);
  std::vector<at::Tensor> broadcasts(2);
  std::vector<std::vector<double>> host(2);
  const auto errors = run_ranks({env(0, 2), env(1, 2)}, [&](int64_t rank, ProcessGroupContext& group) {
    EXPECT_EQ(group.rank(), rank);
    EXPECT_EQ(group.world_size(), 2);
    EXPECT_EQ(group.backend(), "gloo");
    EXPECT_EQ(group.is_main(), rank == 0);
    sums[rank] = torch::full({5}, static_cast<float>(rank + 1));
    group.allreduce_sum(sums[rank], "a test allreduce");
    broadcasts[rank] = torch::full({3}, static_cast<double>(10 * (rank + 1)));
    group.broadcast({broadcasts[rank]}, "a test broadcast");
    host[rank] = group.allreduce_sum(std::vector<double>{0.5 * static_cast<double>(rank), 1.0}, "host numbers");
    group.barrier("a test barrier");
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(sums[r], torch::full({5}, 3.0f))) << sums[r];
    EXPECT_TRUE(torch::equal(broadcasts[r], torch::full({3}, 10.0, torch::kFloat64))) << broadcasts[r];
    EXPECT_EQ(host[r], (std::vector<double>{0.5, 2.0}));
  }
}

TEST_F(ProcessGroupTest, OverlappingAllreducesFinishInAnyWaitOrder) {
  const auto errors = run_ranks({env(0, 2), env(1, 2)}, [&](int64_t rank, ProcessGroupContext& group) {
    std::vector<at::Tensor> tensors;
    std::vector<PendingCollective> pending;
    for (int i = 0; i < 4; ++i) {
      tensors.push_back(torch::full({1000}, static_cast<float>(i + rank)));
      pending.push_back(group.allreduce_sum_async(tensors.back(), "allreduce " + std::to_string(i)));
    }
    for (int i = 3; i >= 0; --i) {
      EXPECT_TRUE(pending[i].pending());
      group.wait(pending[i]);
      EXPECT_FALSE(pending[i].pending());
      EXPECT_TRUE(torch::equal(tensors[i], torch::full({1000}, static_cast<float>(2 * i + 1))));
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST_F(ProcessGroupTest, OneRankIsAGroupToo) {
  const auto errors = run_ranks({env(0, 1)}, [](int64_t, ProcessGroupContext& group) {
    auto t = torch::arange(4, torch::kFloat32);
    group.allreduce_sum(t, "a lone allreduce");
    EXPECT_TRUE(torch::equal(t, torch::arange(4, torch::kFloat32)));
  });
  EXPECT_EQ(errors, std::vector<std::string>{""});
}

TEST_F(ProcessGroupTest, RankZeroCannotListenOnABusyPort) {
  test::ListeningSocket busy;
  LaunchEnvironment launch = env(0, 1);
  launch.master_port = busy.port();
  const std::string message = error_message([&] { ProcessGroupContext group(launch, cpu(), quick()); });
  const std::string expected = "rank 0 cannot host the rendezvous store on MASTER_PORT=" + std::to_string(busy.port()) + ": ";
  EXPECT_EQ(message.substr(0, expected.size()), expected) << message;
}

TEST_F(ProcessGroupTest, NoStoreToReachFailsAfterTheTimeoutNamingTheAddress) {
  const std::string message = error_message([&] { ProcessGroupContext group(env(1, 2), cpu(), quick(1s)); });
  const std::string port = std::to_string(port_);
  const std::string expected = "rank 1 could not reach the rendezvous store at MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                               port + " (127.0.0.1:" + port + ") within 1 s (dist.timeout): is rank 0 "
                               "running there? ";
  EXPECT_EQ(message.substr(0, expected.size()), expected) << message;
}

TEST_F(ProcessGroupTest, UnresolvableMasterAddrIsNamed) {
  LaunchEnvironment launch = env(1, 2);
  launch.master_addr = "no-such-host.invalid";
  const std::string message = error_message([&] { ProcessGroupContext group(launch, cpu(), quick()); });
  EXPECT_EQ(message.rfind("MASTER_ADDR='no-such-host.invalid' cannot be resolved: ", 0), 0u) << message;
}

TEST_F(ProcessGroupTest, RanksThatNeverJoinAreNamed) {
  const std::string message = error_message([&] { ProcessGroupContext group(env(0, 3), cpu(), quick(1s)); });
  EXPECT_EQ(message, "ranks 1, 2 of 3 have not joined the rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                         std::to_string(port_) +
                         " within 1 s (dist.timeout): start every rank with the same MASTER_ADDR, "
                         "MASTER_PORT and WORLD_SIZE");
}

TEST_F(ProcessGroupTest, DisagreeingWorldSizesAreNamed) {
  const auto errors = run_ranks({env(0, 2), env(1, 2, /*world_size_seen=*/3)}, [](int64_t, ProcessGroupContext&) {},
                                quick(2s));
  EXPECT_EQ(errors[1], "WORLD_SIZE=3 for this process (rank 1) but WORLD_SIZE=2 for rank 0: every process of the run "
                       "needs the same WORLD_SIZE");
  EXPECT_EQ(errors[0], "rank 1 of 2 has not joined the rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                           std::to_string(port_) +
                           " within 2 s (dist.timeout): start every rank with the same MASTER_ADDR, "
                           "MASTER_PORT and WORLD_SIZE");
}

TEST_F(ProcessGroupTest, TwoProcessesWithTheSameRankAreRefused) {
  const auto errors = run_ranks({env(0, 3), env(1, 3), env(1, 3)}, [](int64_t, ProcessGroupContext&) {}, quick(2s));
  const std::string duplicate = "RANK=1 was given to 2 processes: each process of the run needs its own RANK";
  EXPECT_TRUE(errors[1] == duplicate || errors[2] == duplicate) << errors[1] << "\n" << errors[2];
}

TEST_F(ProcessGroupTest, ExplainsAFailureWhileEveryRankIsAlive) {
  std::promise<void> explained;
  auto done = explained.get_future().share();
  const auto errors = run_ranks({env(0, 2), env(1, 2)}, [&](int64_t rank, ProcessGroupContext& group) {
    if (rank == 0) {
      EXPECT_EQ(group.explain_failure("the test collective", "peer said no"),
                "every rank's heartbeat is still beating, so no process died: a rank is stuck or the network failed; "
                "rank 0 stops: the test collective failed. Gloo said: peer said no");
      explained.set_value();
    } else {
      done.wait();
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST_F(ProcessGroupTest, ALostRankIsNamedByTheSurvivor) {
  const std::string message = survivor_error(/*leaver=*/1);
  EXPECT_EQ(message.rfind("rank 1 of 2 (host ", 0), 0u) << message;
  // The silence is measured: three heartbeat periods (0.3 s) or a little more.
  EXPECT_TRUE(std::regex_search(message, std::regex(R"(\) is gone: its heartbeat stopped \(none for 0\.[3-9] s\); rank 0 )"
                                                    R"(stops: the test allreduce failed\. Gloo said: )")))
      << message;
}

TEST_F(ProcessGroupTest, LosingRankZeroIsNamedThroughItsStore) {
  const std::string message = survivor_error(/*leaver=*/0);
  EXPECT_EQ(message.rfind("rank 0 of 2 (host ", 0), 0u) << message;
  EXPECT_NE(message.find(") is gone: the rendezvous store it hosted at 127.0.0.1:" + std::to_string(port_) +
                         " no longer answers ("),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("); rank 1 stops: the test allreduce failed. Gloo said: "), std::string::npos) << message;
}

TEST_F(ProcessGroupTest, ARankThatFailedIsQuotedByTheOthers) {
  const std::string message =
      survivor_error(/*leaver=*/1, [](ProcessGroupContext& group) { group.publish_failure("data: the file is gone"); });
  EXPECT_EQ(message.rfind("rank 1 of 2 (host ", 0), 0u) << message;
  EXPECT_NE(message.find(") failed: data: the file is gone; rank 0 stops: the test allreduce failed. Gloo said: "),
            std::string::npos)
      << message;
}

TEST(ResolveBackendTest, AutoIsGlooOnTheCpu) {
  DKIT_SKIP_WITHOUT_GLOO();
  EXPECT_EQ(resolve_backend("auto", cpu()), "gloo");
  EXPECT_EQ(resolve_backend("gloo", cpu()), "gloo");
  EXPECT_TRUE(backend_available("gloo"));
  EXPECT_TRUE(backend_available("auto"));
  EXPECT_FALSE(backend_available("mpi"));
  EXPECT_EQ(error_message([] { resolve_backend("mpi", cpu()); }), "dist.backend 'mpi' is not one of auto, gloo, nccl");
}

TEST(ResolveBackendTest, NcclIsRefusedWhereItCannotWork) {
  DKIT_SKIP_WITHOUT_GLOO();
  if (DKIT_WITH_NCCL) {
    EXPECT_EQ(error_message([] { resolve_backend("nccl", cpu()); }),
              "dist.backend 'nccl' needs a GPU, but this rank trains on cpu; use dist.backend: gloo or auto on the CPU");
    return;
  }
  EXPECT_FALSE(backend_available("nccl"));
  EXPECT_EQ(error_message([] { resolve_backend("nccl", gpu(0)); }),
            std::string("dist.backend 'nccl' is not available: this dkit was built against LibTorch ") + TORCH_VERSION +
                (DKIT_WITH_CUDA ? " with CUDA" : " without CUDA") +
                ", which has Gloo only (see `dkit devices`); use dist.backend: gloo or auto");
}

TEST(ResolveBackendTest, AutoIsNcclOnAGpu_CUDA) {
  EXPECT_EQ(resolve_backend("auto", gpu(0)), DKIT_WITH_NCCL ? "nccl" : "gloo");
}

} // namespace
} // namespace dkit
