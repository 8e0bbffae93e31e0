#include <dkit/train/detail/bernoulli.h>

#include "../support.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace dkit::detail {
namespace {

using BernoulliTest = test::SeedingFixture;

// The fill against bernoulli_ on the default generator: the same values and the generator left alike, at the
// shapes of Fashion-MNIST's dropout, after a draw that leaves the Twister mid-block.
TEST_F(BernoulliTest, FillsAsBernoulliDoesAndLeavesTheDefaultGeneratorAlike) {
  if (!bernoulli_matches()) {
    GTEST_SKIP() << "this LibTorch's bernoulli_ draws otherwise (MKL: " << at::hasMKL() << ")";
  }
  for (const auto type : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
    for (const double p : {0.9, 0.5}) {
      for (const int64_t rows : {1, 37, 256}) {
        SCOPED_TRACE(::testing::Message() << type << ", p " << p << ", " << rows << " rows");
        torch::manual_seed(rows);
        torch::rand({3});
        at::Tensor expected = torch::empty({rows, 512}, type);
        expected.bernoulli_(p);
        const at::Tensor expected_next = torch::rand({5});
        torch::manual_seed(rows);
        torch::rand({3});
        at::Tensor actual = torch::empty({rows, 512}, type);
        ASSERT_TRUE(fill_bernoulli(actual, p));
        EXPECT_TRUE(torch::equal(actual, expected));
        EXPECT_TRUE(torch::equal(torch::rand({5}), expected_next));
      }
    }
  }
}

// A LibTorch without MKL (Debian's 1.13, 2.6, 2.14) draws bernoulli_ through its Twister; one with MKL may draw
// through MKL's generators (on Intel CPUs), and then the step calls bernoulli_ itself.
TEST_F(BernoulliTest, MatchesWhereLibTorchHasNoMkl) {
  if (at::hasMKL()) {
    GTEST_SKIP() << "this LibTorch has MKL";
  }
  EXPECT_TRUE(bernoulli_matches());
}

TEST_F(BernoulliTest, LeavesOtherTensorsToBernoulliAndDrawsNothing) {
  torch::manual_seed(9);
  const at::Tensor expected_next = torch::rand({5});
  at::Tensor strided = torch::empty({8, 8}).t();
  at::Tensor integers = torch::empty({8}, torch::kLong);
  at::Tensor half = torch::empty({8}, torch::kHalf);
  torch::manual_seed(9);
  EXPECT_FALSE(fill_bernoulli(strided, 0.5));
  EXPECT_FALSE(fill_bernoulli(integers, 0.5));
  EXPECT_FALSE(fill_bernoulli(half, 0.5));
  EXPECT_TRUE(torch::equal(torch::rand({5}), expected_next));
}

TEST_F(BernoulliTest, LeavesAGeneratorInAStateTheTwisterNeverReachesToBernoulli) {
  at::Generator generator = at::detail::createCPUGenerator(5);
  auto* impl = generator.get<at::CPUGeneratorImpl>();
  at::mt19937 engine = impl->engine();
  at::mt19937_data_pod pod = engine.data();
  pod.left_ = 600;
  pod.next_ = 600;
  engine.set_data(pod);
  impl->set_engine(engine);
  at::Tensor out = torch::empty({4});
  EXPECT_FALSE(fill_bernoulli(out, 0.5, generator));
  EXPECT_EQ(impl->engine().data().next_, 600U) << "drew from the generator";
}

TEST_F(BernoulliTest, DrawsFromTheGeneratorItIsGiven) {
  if (!bernoulli_matches()) {
    GTEST_SKIP() << "this LibTorch's bernoulli_ draws otherwise";
  }
  torch::manual_seed(4);
  const at::Tensor expected_next = torch::rand({5});
  at::Generator mine = at::detail::createCPUGenerator(77);
  at::Generator theirs = at::detail::createCPUGenerator(77);
  at::Tensor actual = torch::empty({1000});
  at::Tensor expected = torch::empty({1000});
  torch::manual_seed(4);
  ASSERT_TRUE(fill_bernoulli(actual, 0.3, mine));
  expected.bernoulli_(0.3, theirs);
  EXPECT_TRUE(torch::equal(actual, expected));
  EXPECT_EQ(mine.get<at::CPUGeneratorImpl>()->random(), theirs.get<at::CPUGeneratorImpl>()->random());
  EXPECT_TRUE(torch::equal(torch::rand({5}), expected_next)) << "the default generator was drawn from";
}

} // namespace
} // namespace dkit::detail
