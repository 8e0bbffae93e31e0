#include <dkit/distributed/gradient_reducer.h>

#include <dkit/distributed/process_group.h>
#include <dkit/model/mlp.h>
#include <dkit/train/optim.h>
#include <dkit/train/step.h>

#include "../support.h"
#include "network.h"

#include <array>
#include <functional>
#include <memory>

namespace dkit {
namespace {

using namespace std::chrono_literals;

class GradientReducerTest : public test::SeedingFixture {
 protected:
  void SetUp() override {
    DKIT_SKIP_WITHOUT_GLOO();
  }

  GradientReducerTest() {
    x_ = torch::randn({12, 6});
    y_ = torch::randint(0, 3, {12});
  }

  /// The same freshly initialised network each time.
  static Mlp network() {
    torch::manual_seed(1);
    return Mlp(MlpOptions(6, {10, 8}, 3));
  }

  static at::Tensor loss_sum(Mlp& net, const at::Tensor& x, const at::Tensor& y) {
    return torch::nn::functional::cross_entropy(
        net->forward(x), y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }

  /// Gradients of the mean loss over rows [0, rows) in one process, as a single run with the whole batch has them.
  std::vector<at::Tensor> whole_batch_gradients(int64_t rows) {
    Mlp net = network();
    (loss_sum(net, x_.narrow(0, 0, rows), y_.narrow(0, 0, rows)) / static_cast<double>(rows)).backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : net->parameters()) {
      grads.push_back(p.grad().clone());
    }
    return grads;
  }

  /// Runs `body` as each of `world_size` ranks over loopback (threads of this process), with a pointer to the rank's
  /// group that does not own it, and expects every rank to end without an error.
  static void on_ranks(int64_t world_size,
                       const std::function<void(int64_t, const std::shared_ptr<ProcessGroupContext>&)>& body) {
    const int port = test::free_port();
    std::vector<LaunchEnvironment> launches;
    for (int64_t rank = 0; rank < world_size; ++rank) {
      launches.push_back(test::loopback_launch(rank, world_size, port));
    }
    const auto errors = test::run_ranks(
        launches,
        [&](int64_t rank, ProcessGroupContext& group) {
          body(rank, std::shared_ptr<ProcessGroupContext>(&group, [](ProcessGroupContext*) {}));
        },
        ProcessGroupOptions().timeout(10s).heartbeat(100ms));
    EXPECT_EQ(errors, std::vector<std::string>(static_cast<size_t>(world_size), ""));
  }

  /// Two ranks, each with its own copy of the network and `rows[r]` of the batch (rank 0 first), the loss of each
  /// divided by the global sample count; returns each rank's gradients after GradientReducer::synchronize().
  std::vector<std::vector<at::Tensor>> reduced_gradients(const std::vector<int64_t>& rows,
                                                         GradientReducerOptions options = {},
                                                         std::vector<int64_t>* started = nullptr,
                                                         std::vector<std::vector<int64_t>>* buckets = nullptr) {
    std::vector<Mlp> nets{network(), network()};
    std::vector<std::vector<at::Tensor>> grads(2);
    const double global = static_cast<double>(rows[0] + rows[1]);
    on_ranks(2, [&](int64_t rank, const std::shared_ptr<ProcessGroupContext>& group) {
      GradientReducer reducer(nets[rank]->parameters(), group, options);
      const int64_t begin = rank == 0 ? 0 : rows[0];
      for (int step = 0; step < 2; ++step) {
        for (auto& p : nets[rank]->parameters()) {
          p.mutable_grad() = at::Tensor();
        }
        (loss_sum(nets[rank], x_.narrow(0, begin, rows[rank]), y_.narrow(0, begin, rows[rank])) / global)
            .backward();
        reducer.synchronize();
      }
      for (const auto& p : nets[rank]->parameters()) {
        grads[rank].push_back(p.grad().clone());
      }
      if (started != nullptr) {
        (*started)[rank] = reducer.buckets_started_in_backward();
      }
      if (buckets != nullptr && rank == 0) {
        *buckets = reducer.buckets();
      }
    });
    return grads;
  }

  static double max_difference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    EXPECT_EQ(a.size(), b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    }
    return worst;
  }

  at::Tensor x_;
  at::Tensor y_;
};

TEST_F(GradientReducerTest, SummedGradientsAreThoseOfTheWholeBatch) {
  std::vector<int64_t> started(2);
  std::vector<std::vector<int64_t>> buckets;
  const auto grads = reduced_gradients({6, 6}, {}, &started, &buckets);
  const auto expected = whole_batch_gradients(12);
  EXPECT_LT(max_difference(grads[0], expected), 1e-6);
  EXPECT_LT(max_difference(grads[1], expected), 1e-6);
  EXPECT_EQ(max_difference(grads[0], grads[1]), 0.0) << "every rank must end with the same gradients";
  EXPECT_EQ(buckets, (std::vector<std::vector<int64_t>>{{5, 4, 3, 2, 1, 0}}));
  EXPECT_EQ(started, (std::vector<int64_t>{1, 1})) << "the bucket starts from the last gradient's hook";
}

TEST_F(GradientReducerTest, BucketsFollowTheReverseParameterOrderUnderTheirCaps) {
  // Parameters, reversed: 4.bias 12 B, 4.weight 96 B, 2.bias 32 B, 2.weight 320 B, 0.bias 40 B, 0.weight 240 B.
  std::vector<int64_t> started(2);
  std::vector<std::vector<int64_t>> buckets;
  const auto grads = reduced_gradients(
      {6, 6}, GradientReducerOptions().first_bucket_cap_bytes(100).bucket_cap_bytes(400), &started, &buckets);
  EXPECT_EQ(buckets, (std::vector<std::vector<int64_t>>{{5}, {4, 3}, {2, 1}, {0}}));
  EXPECT_EQ(started, (std::vector<int64_t>{4, 4})) << "every bucket starts during backward";
  EXPECT_LT(max_difference(grads[0], whole_batch_gradients(12)), 1e-6);
}

TEST_F(GradientReducerTest, ARankWithoutSamplesStillTakesPart) {
  const auto grads = reduced_gradients({7, 0});
  EXPECT_LT(max_difference(grads[0], whole_batch_gradients(7)), 1e-6);
  EXPECT_EQ(max_difference(grads[0], grads[1]), 0.0);
}

TEST_F(GradientReducerTest, ParametersWithoutAGradientAreSummedAsZeros) {
  std::vector<at::Tensor> unused_grads(2);
  std::vector<int64_t> started(2);
  on_ranks(2, [&](int64_t rank, const std::shared_ptr<ProcessGroupContext>& group) {
    auto used = torch::ones({4}, torch::requires_grad());
    auto unused = torch::ones({3}, torch::requires_grad());
    GradientReducer reducer({used, unused}, group, GradientReducerOptions().first_bucket_cap_bytes(4));
    (used * static_cast<double>(rank + 1)).sum().backward();
    reducer.synchronize();
    EXPECT_TRUE(torch::equal(used.grad(), torch::full({4}, 3.0f))) << used.grad();
    unused_grads[rank] = unused.grad().clone();
    started[rank] = reducer.buckets_started_in_backward();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(unused_grads[r], torch::zeros({3}))) << unused_grads[r];
    EXPECT_EQ(started[r], 0) << "the unused parameter's bucket comes first, so it and the next start afterwards";
  }
}

// Gradient accumulation as DDP's no_sync: with the reducer off each rank keeps its gradient in .grad; the next
// backward with it on sums what is held and what arrives, over the ranks.
TEST_F(GradientReducerTest, AccumulatedGradientsAreSummedWithTheLastBatchs) {
  std::vector<at::Tensor> local(2);
  std::vector<at::Tensor> summed(2);
  on_ranks(2, [&](int64_t rank, const std::shared_ptr<ProcessGroupContext>& group) {
    auto w = torch::ones({2}, torch::requires_grad());
    GradientReducer reducer({w}, group);
    reducer.set_enabled(false);
    EXPECT_FALSE(reducer.enabled());
    (w * static_cast<double>(rank + 1)).sum().backward();
    local[rank] = w.grad().clone();
    reducer.set_enabled(true);
    (w * static_cast<double>(rank + 1)).sum().backward();
    reducer.synchronize();
    summed[rank] = w.grad().clone();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(local[r], torch::full({2}, static_cast<float>(r + 1)))) << local[r];
    EXPECT_TRUE(torch::equal(summed[r], torch::full({2}, 6.0f))) << summed[r];
  }
}

TEST_F(GradientReducerTest, MarkedGradientsAreSummedAsTheHooksSumThem) {
  const auto hooked = reduced_gradients({5, 7});
  std::vector<Mlp> nets{network(), network()};
  std::vector<Mlp> twins{network(), network()};
  std::vector<std::vector<at::Tensor>> marked(2);
  on_ranks(2, [&](int64_t rank, const std::shared_ptr<ProcessGroupContext>& group) {
    GradientReducer reducer(nets[rank]->parameters(), group);
    const auto params = nets[rank]->parameters();
    const auto twin_params = twins[rank]->parameters();
    const int64_t begin = rank == 0 ? 0 : 5;
    const int64_t rows = rank == 0 ? 5 : 7;
    for (int step = 0; step < 2; ++step) {
      for (auto& p : twin_params) {
        p.mutable_grad() = at::Tensor();
      }
      (loss_sum(twins[rank], x_.narrow(0, begin, rows), y_.narrow(0, begin, rows)) / 12.0).backward();
      for (size_t i = params.size(); i-- > 0;) {
        params[i].mutable_grad() = twin_params[i].grad().clone();
        reducer.mark_ready(reducer.index_of(params[i]), twin_params[i].grad());
      }
      reducer.synchronize();
    }
    for (const auto& p : params) {
      marked[rank].push_back(p.grad().clone());
    }
  });
  for (size_t r = 0; r < 2; ++r) {
    ASSERT_EQ(marked[r].size(), hooked[r].size());
    for (size_t i = 0; i < hooked[r].size(); ++i) {
      EXPECT_TRUE(torch::equal(marked[r][i], hooked[r][i])) << "rank " << r << ", parameter " << i;
    }
  }
}

TEST_F(GradientReducerTest, IndexOfAndMarkReadyNameWhatTheyRefuse) {
  on_ranks(1, [&](int64_t, const std::shared_ptr<ProcessGroupContext>& group) {
    Mlp net = network();
    const auto params = net->parameters();
    GradientReducer reducer(params, group);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(reducer.index_of(params[i]), static_cast<int64_t>(i));
    }
    EXPECT_EQ(reducer.index_of(params[0].detach().clone()), -1) << "an equal tensor is not the parameter";
    EXPECT_EQ(test::error_message([&] { reducer.mark_ready(6, torch::zeros({3})); }),
              "GradientReducer::mark_ready: no parameter 6 (there are 6)");
    EXPECT_EQ(test::error_message([&] { reducer.mark_ready(5, torch::zeros({4})); }),
              "GradientReducer::mark_ready: parameter 5 has shape [3], its gradient [4]");
  });
}

// Per rank, the same network twice: one trained by a TrainStep that hands its written-out gradients to its reducer,
// the other by a TrainStep on autograd's path (an empty before_update sends it there), whose hooks fill its reducer.
// The third step gives rank 1 no rows, as a short last batch does: that step is autograd's on both.
TEST_F(GradientReducerTest, TheWrittenOutStepSumsOverTheRanksWithAutogradsBits) {
  for (const bool adam : {false, true}) {
    SCOPED_TRACE(adam ? "FusedAdam" : "FusedSGD");
    std::vector<Mlp> written{network(), network()};
    std::vector<Mlp> autograd{network(), network()};
    // One bool a rank: the ranks run on threads, and std::vector<bool> packs both into one word.
    std::array<bool, 2> direct{};
    const std::vector<std::array<int64_t, 2>> rows{{5, 7}, {7, 5}, {8, 0}};
    on_ranks(2, [&](int64_t rank, const std::shared_ptr<ProcessGroupContext>& group) {
      const auto optimizer = [&](Mlp& net) -> std::unique_ptr<torch::optim::Optimizer> {
        if (adam) {
          return std::make_unique<FusedAdam>(net->parameters(), torch::optim::AdamOptions(0.01));
        }
        return std::make_unique<FusedSGD>(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      };
      const auto written_optimizer = optimizer(written[rank]);
      const auto autograd_optimizer = optimizer(autograd[rank]);
      GradientReducer written_reducer(written[rank]->parameters(), group);
      GradientReducer autograd_reducer(autograd[rank]->parameters(), group);
      TrainStep written_step(written[rank], *written_optimizer, TrainStepOptions().reducer(&written_reducer));
      TrainStep autograd_step(autograd[rank], *autograd_optimizer,
                              TrainStepOptions().reducer(&autograd_reducer).before_update([] {}));
      direct[rank] = written_step.direct() && !autograd_step.direct();
      for (const auto& split : rows) {
        const int64_t begin = rank == 0 ? 0 : split[0];
        const at::Tensor x = x_.narrow(0, begin, split[rank]);
        const at::Tensor y = y_.narrow(0, begin, split[rank]);
        written_step.run(x, y, split[0] + split[1]);
        autograd_step.run(x, y, split[0] + split[1]);
      }
    });
    EXPECT_EQ(direct, (std::array<bool, 2>{true, true}));
    for (size_t r = 0; r < 2; ++r) {
      const auto a = written[r]->parameters();
      const auto b = autograd[r]->parameters();
      const auto other = written[1 - r]->parameters();
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(torch::equal(a[i], b[i])) << "rank " << r << ", parameter " << i;
        EXPECT_TRUE(torch::equal(a[i], other[i])) << "rank " << r << ", parameter " << i;
      }
      EXPECT_FALSE(torch::equal(a[0], network()->parameters()[0])) << "the steps trained";
    }
  }
}

TEST_F(GradientReducerTest, ATrainStepRefusesAReducerOverOtherParameters) {
  on_ranks(1, [&](int64_t, const std::shared_ptr<ProcessGroupContext>& group) {
    Mlp net = network();
    Mlp other = network();
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
    GradientReducer reducer(other->parameters(), group);
    EXPECT_EQ(test::error_message([&] { TrainStep step(net, optimizer, TrainStepOptions().reducer(&reducer)); }),
              "TrainStepOptions::reducer is over other parameters than the model's (it lacks the model's "
              "parameter 0)");
  });
}

} // namespace
} // namespace dkit
