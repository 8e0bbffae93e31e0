#include <dkit/metrics/metrics.h>

#include <dkit/config.h>

#include "../support.h"

#include <cmath>

namespace dkit {
namespace {

using test::error_message;

class MetricBufferTest : public test::SeedingFixture {};

TEST_F(MetricBufferTest, FlushReturnsTheAddedRows) {
  MetricBuffer metrics({"loss", "correct", "flag"}, cpu(), /*capacity=*/4);
  EXPECT_TRUE(metrics.empty());
  metrics.add({torch::tensor(0.5), torch::tensor(int64_t{3}), torch::tensor(true)});
  metrics.add({torch::tensor(1.5f), torch::tensor(int64_t{5}), torch::tensor(false)});
  metrics.add({torch::tensor(2.0, torch::kDouble), torch::tensor(int64_t{7}), torch::tensor(true)});
  EXPECT_EQ(metrics.size(), 3);
  EXPECT_FALSE(metrics.full());
  const MetricRows rows = metrics.flush();
  EXPECT_EQ(rows.rows(), 3);
  EXPECT_EQ(rows.names, (std::vector<std::string>{"loss", "correct", "flag"}));
  EXPECT_TRUE(torch::equal(rows.values, torch::tensor({{0.5f, 3.0f, 1.0f}, {1.5f, 5.0f, 0.0f}, {2.0f, 7.0f, 1.0f}})));
  EXPECT_EQ(rows.values_of("correct"), (std::vector<double>{3, 5, 7}));
  EXPECT_DOUBLE_EQ(rows.sum("loss"), 4.0);
  EXPECT_DOUBLE_EQ(rows.mean("correct"), 5.0);
  EXPECT_DOUBLE_EQ(rows.last("flag"), 1.0);
  EXPECT_EQ(rows.column("flag"), 2);
  EXPECT_EQ(metrics.size(), 0);
  EXPECT_TRUE(metrics.empty());
}

TEST_F(MetricBufferTest, RowsSurviveLaterFlushes) {
  MetricBuffer metrics({"x"}, cpu(), 2);
  metrics.add({torch::tensor(1.0f)});
  const MetricRows first = metrics.flush();
  metrics.add({torch::tensor(9.0f)});
  const MetricRows second = metrics.flush();
  EXPECT_EQ(first.values_of("x"), (std::vector<double>{1}));
  EXPECT_EQ(second.values_of("x"), (std::vector<double>{9}));
}

TEST_F(MetricBufferTest, AddCountsNoSyncAndFlushCountsExactlyOne) {
  MetricBuffer metrics({"loss", "correct"}, cpu(), 50);
  const int64_t before = host_sync_count();
  for (int i = 0; i < 50; ++i) {
    metrics.add({torch::tensor(static_cast<float>(i)), torch::tensor(int64_t{i})});
  }
  EXPECT_EQ(host_sync_count(), before);
  EXPECT_TRUE(metrics.full());
  const MetricRows rows = metrics.flush();
  EXPECT_EQ(host_sync_count(), before + 1);
  EXPECT_DOUBLE_EQ(rows.sum("correct"), 49.0 * 50.0 / 2.0);
  const MetricRows none = metrics.flush();
  EXPECT_EQ(host_sync_count(), before + 1);
  EXPECT_EQ(none.rows(), 0);
  EXPECT_TRUE(std::isnan(none.mean("loss")));
  EXPECT_EQ(none.sum("loss"), 0.0);
}

TEST_F(MetricBufferTest, TakesValuesThatRequireGrad) {
  auto weight = torch::ones({3}, torch::requires_grad());
  const auto loss = (weight * 2).sum();
  MetricBuffer metrics({"loss"}, cpu(), 1);
  metrics.add({loss});
  loss.backward();
  EXPECT_EQ(metrics.flush().last("loss"), 6.0);
  EXPECT_TRUE(torch::equal(weight.grad(), torch::full({3}, 2.0f)));
}

TEST_F(MetricBufferTest, MisuseIsAnError) {
  EXPECT_EQ(error_message([] { MetricBuffer({}, cpu(), 4); }), "a MetricBuffer needs at least one metric name");
  EXPECT_EQ(error_message([] { MetricBuffer({"loss"}, cpu(), 0); }), "MetricBuffer capacity must be at least 1, got 0");
  EXPECT_EQ(error_message([] { MetricBuffer({"loss", "acc", "loss"}, cpu(), 2); }), "metric 'loss' is named twice");
  EXPECT_EQ(error_message([] { MetricBuffer({"loss"}, gpu(num_gpus()), 2); }),
            "metrics device '" + gpu(num_gpus()).str() + "' is not available; available devices: " +
                available_devices());
  MetricBuffer metrics({"loss", "correct"}, cpu(), 1);
  EXPECT_EQ(error_message([&] { metrics.add({torch::tensor(1.0f)}); }),
            "MetricBuffer::add: expected 2 values (loss, correct), got 1");
  EXPECT_EQ(error_message([&] { metrics.add({torch::ones({2}), torch::tensor(1.0f)}); }),
            "metric 'loss' must be a 0-d tensor, got [2]");
  EXPECT_EQ(error_message([&] { metrics.add({torch::tensor(1.0f), torch::empty({}, torch::Device(torch::kMeta))}); }),
            "metric 'correct' is on meta, the MetricBuffer on cpu");
  metrics.add({torch::tensor(1.0f), torch::tensor(2.0f)});
  EXPECT_EQ(error_message([&] { metrics.add({torch::tensor(1.0f), torch::tensor(2.0f)}); }),
            "MetricBuffer is full (1 rows): flush() it first");
  const MetricRows rows = metrics.flush();
  EXPECT_EQ(error_message([&] { rows.sum("accuracy"); }), "unknown metric 'accuracy': the buffer has loss, correct");
}

class MeterTest : public test::SeedingFixture {};

TEST_F(MeterTest, AverageMeterWeighsByCount) {
  AverageMeter meter(cpu());
  EXPECT_TRUE(std::isnan(meter.value()));
  const int64_t before = host_sync_count();
  meter.add(torch::tensor(1.0f), 3);
  meter.add(torch::tensor(5.0f), 1);
  EXPECT_EQ(host_sync_count(), before);
  EXPECT_EQ(meter.count(), 4);
  EXPECT_EQ(meter.total().item<double>(), 8.0);
  EXPECT_DOUBLE_EQ(meter.value(), 2.0);
  EXPECT_EQ(host_sync_count(), before + 1);  // total().item() above is the test's own read, not dkit's
  meter.reset();
  EXPECT_EQ(meter.count(), 0);
  EXPECT_TRUE(std::isnan(meter.value()));
}

TEST_F(MeterTest, AccuracyMeterCountsArgmaxHits) {
  AccuracyMeter meter(cpu());
  const int64_t before = host_sync_count();
  meter.add(torch::tensor({{0.1f, 0.9f}, {0.8f, 0.2f}, {0.3f, 0.7f}}), torch::tensor({1, 1, 1}));
  meter.add(torch::tensor({{2.0f, 1.0f}}), torch::tensor({0}));
  EXPECT_EQ(host_sync_count(), before);
  EXPECT_EQ(meter.count(), 4);
  EXPECT_DOUBLE_EQ(meter.value(), 0.75);
  EXPECT_EQ(host_sync_count(), before + 1);
  meter.reset();
  EXPECT_TRUE(std::isnan(meter.value()));
  EXPECT_EQ(error_message([&] { meter.add(torch::zeros({3}), torch::zeros({3})); }),
            "AccuracyMeter::add needs logits [N, C] and labels [N], got [3] and [3]");
}

TEST_F(MetricBufferTest, GpuRowsComeBackInOneSync_CUDA) {
  MetricBuffer metrics({"loss", "correct"}, gpu(0), 20);
  const auto cuda = torch::Device(torch::kCUDA, 0);
  const int64_t before = host_sync_count();
  {
#if DKIT_WITH_CUDA
    ScopedSyncCheck no_sync;
#endif
    for (int i = 0; i < 20; ++i) {
      const auto logits = torch::randn({8, 3}, cuda);
      metrics.add({logits.pow(2).mean(), logits.argmax(1).eq(torch::zeros({8}, cuda.type())).sum()});
    }
  }
  EXPECT_EQ(host_sync_count(), before);
  const MetricRows rows = metrics.flush();
  EXPECT_EQ(host_sync_count(), before + 1);
  EXPECT_EQ(rows.rows(), 20);
  EXPECT_TRUE(rows.values.device().is_cpu());
  EXPECT_GT(rows.mean("loss"), 0.0);
}

TEST_F(MeterTest, ScopedSyncCheckCatchesItem_CUDA) {
#if !DKIT_WITH_CUDA
  GTEST_SKIP() << "ScopedSyncCheck exists only in CUDA builds";
#else
  const auto value = torch::ones({}, torch::Device(torch::kCUDA, 0));
  {
    ScopedSyncCheck no_sync;
    const auto doubled = value * 2;  // queued work is fine
    EXPECT_THROW(doubled.item<float>(), c10::Error);
    EXPECT_THROW(doubled.cpu(), c10::Error);
  }
  EXPECT_EQ(value.item<float>(), 1.0f);  // the previous mode is back
#endif
}

} // namespace
} // namespace dkit
