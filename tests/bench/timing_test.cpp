#include <dkit/bench/timing.h>

#include "../support.h"

#include <thread>

namespace dkit::bench {
namespace {

using ::dkit::test::error_message;

class TimingTest : public test::SeedingFixture {};

TEST_F(TimingTest, TimerNeverGoesBackwards) {
  Timer timer;
  const double first = timer.seconds();
  const double second = timer.seconds();
  EXPECT_GE(first, 0.0);
  EXPECT_GE(second, first);
  timer.reset();
  EXPECT_GE(timer.seconds(), 0.0);
}

TEST_F(TimingTest, CpuDeviceTimerMeasuresANonNegativeInterval) {
  DeviceTimer timer(cpu());
  EXPECT_TRUE(timer.device().is_cpu());
  timer.start();
  const auto product = torch::mm(torch::randn({8, 8}), torch::randn({8, 8}));
  EXPECT_GE(timer.stop(), 0.0);
  EXPECT_EQ(product.size(0), 8);
}

TEST_F(TimingTest, DeviceTimerRejectsAMissingGpu) {
  if (num_gpus() > 0) {
    GTEST_SKIP() << "a GPU is visible";
  }
  EXPECT_EQ(error_message([] { DeviceTimer timer(gpu(0)); }),
            "cannot time work on 'cuda:0': not available; available devices: cpu");
}

TEST_F(TimingTest, SummarizeOddCount) {
  const Stats stats = summarize({5.0, 1.0, 3.0});
  EXPECT_EQ(stats.median, 3.0);
  EXPECT_EQ(stats.min, 1.0);
  EXPECT_EQ(stats.max, 5.0);
  EXPECT_EQ(stats.mean, 3.0);
  EXPECT_EQ(stats.count, 3);
}

TEST_F(TimingTest, SummarizeEvenCountTakesTheMeanOfTheMiddleTwo) {
  const Stats stats = summarize({4.0, 1.0, 10.0, 2.0});
  EXPECT_EQ(stats.median, 3.0);
  EXPECT_EQ(stats.min, 1.0);
  EXPECT_EQ(stats.max, 10.0);
  EXPECT_EQ(stats.mean, 4.25);
  EXPECT_EQ(stats.count, 4);
}

TEST_F(TimingTest, SummarizeOneSample) {
  const Stats stats = summarize({0.5});
  EXPECT_EQ(stats.median, 0.5);
  EXPECT_EQ(stats.min, 0.5);
  EXPECT_EQ(stats.max, 0.5);
  EXPECT_EQ(stats.count, 1);
}

TEST_F(TimingTest, SummarizeRejectsNoSamples) {
  EXPECT_EQ(error_message([] { summarize({}); }), "cannot summarize an empty list of samples");
}

TEST_F(TimingTest, MeasureCallsTheWorkWarmupPlusRepeatTimesIterations) {
  int64_t calls = 0;
  const Measurement measurement =
      measure(cpu(), MeasureOptions().warmup(2).repeat(3).iterations(4), [&] { ++calls; });
  EXPECT_EQ(calls, 2 + 3 * 4);
  EXPECT_EQ(measurement.iterations, 4);
  EXPECT_EQ(measurement.seconds.count, 3);
  EXPECT_LE(measurement.seconds.min, measurement.seconds.median);
  EXPECT_LE(measurement.seconds.median, measurement.seconds.max);
}

TEST_F(TimingTest, MeasureRunsSlowWorkOncePerSample) {
  int64_t calls = 0;
  const Measurement measurement = measure(cpu(), MeasureOptions().warmup(1).repeat(2).min_sample_seconds(0.01), [&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  EXPECT_EQ(measurement.iterations, 1);
  EXPECT_EQ(calls, 3);
}

TEST_F(TimingTest, MeasureBudgetLowersRepeatToTheMinimum) {
  int64_t calls = 0;
  const Measurement measurement =
      measure(cpu(), MeasureOptions().warmup(1).repeat(10).budget_seconds(0.02).min_repeat(3), [&] {
        ++calls;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      });
  EXPECT_EQ(measurement.seconds.count, 3);
  EXPECT_EQ(calls, 4);
}

TEST_F(TimingTest, MeasureRejectsBadOptions) {
  EXPECT_EQ(error_message([] { measure(cpu(), MeasureOptions().repeat(0), [] {}); }),
            "repeat must be at least 1, got 0");
  EXPECT_EQ(error_message([] { measure(cpu(), MeasureOptions().warmup(-1), [] {}); }),
            "warm-up calls must be 0 or more, got -1");
  EXPECT_EQ(error_message([] { measure(cpu(), MeasureOptions().iterations(-2), [] {}); }),
            "iterations must be 0 (automatic) or more, got -2");
}

TEST_F(TimingTest, GpuTimerTimesQueuedWork_CUDA) {
  const auto a = torch::randn({512, 512}, torch::TensorOptions().device(gpu(0)));
  DeviceTimer timer(gpu(0));
  timer.start();
  const auto product = torch::mm(a, a);
  const double seconds = timer.stop();
  EXPECT_GE(seconds, 0.0);
  EXPECT_TRUE(product.is_cuda());
}

} // namespace
} // namespace dkit::bench
