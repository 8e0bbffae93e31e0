#include <dkit/data/loader.h>

#include <dkit/config.h>
#include <dkit/metrics/metrics.h>

#include "../support.h"

#include <set>

namespace dkit {
namespace {

using test::error_message;
using test::int64s;

// Sample i has features (10 i, 10 i + 1, ...) and label i % 7, so a batch says which samples it holds.
Dataset indexed(int64_t n, int64_t features = 3) {
  Dataset data;
  data.features = (torch::arange(n).unsqueeze(1) * 10 + torch::arange(features)).to(torch::kFloat).contiguous();
  data.labels = torch::arange(n) % 7;
  data.num_classes = 7;
  data.description = "indexed";
  return data;
}

std::vector<int64_t> ids(const Batch& batch) {
  return int64s((batch.features.select(1, 0).cpu() / 10).round());
}

std::vector<Batch> epoch_batches(Loader& loader, int64_t epoch, int64_t skip = 0) {
  loader.start_epoch(epoch, skip);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) {
    batches.push_back(std::move(*batch));
  }
  return batches;
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].index, b[i].index) << what;
    EXPECT_EQ(a[i].epoch, b[i].epoch) << what;
    EXPECT_EQ(a[i].global_samples, b[i].global_samples) << what;
    EXPECT_TRUE(torch::equal(a[i].features.cpu(), b[i].features.cpu())) << what << " batch " << i;
    EXPECT_TRUE(torch::equal(a[i].labels.cpu(), b[i].labels.cpu())) << what << " batch " << i;
  }
}

class LoaderTest : public test::SeedingFixture {};

TEST_F(LoaderTest, CountsBatchesWithAndWithoutDropLast) {
  Loader keep(indexed(10), cpu(), LoaderOptions(3));
  EXPECT_EQ(keep.batches_per_epoch(), 4);
  EXPECT_EQ(keep.samples_per_epoch(), 10);
  const auto batches = epoch_batches(keep, 0);
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(batches[3].size(), 1);
  EXPECT_EQ(batches[3].global_samples, 1);
  EXPECT_EQ(batches[3].index, 3);
  EXPECT_EQ(batches[0].global_samples, 3);
  EXPECT_EQ(keep.batch_rows(0), 3);
  EXPECT_EQ(keep.batch_rows(3), 1);

  Loader drop(indexed(10), cpu(), LoaderOptions(3).drop_last(true));
  EXPECT_EQ(drop.batches_per_epoch(), 3);
  EXPECT_EQ(drop.samples_per_epoch(), 9);
  for (const auto& batch : epoch_batches(drop, 0)) {
    EXPECT_EQ(batch.size(), 3);
  }
  EXPECT_EQ(drop.batch_rows(2), 3);
  Loader exact(indexed(9), cpu(), LoaderOptions(3).drop_last(true));
  EXPECT_EQ(exact.batches_per_epoch(), 3);
}

TEST_F(LoaderTest, EpochFollowsSampleOrder) {
  Loader loader(indexed(50), cpu(), LoaderOptions(8).seed(11));
  for (int64_t epoch : {0, 1, 5}) {
    std::vector<int64_t> seen;
    for (const auto& batch : epoch_batches(loader, epoch)) {
      EXPECT_EQ(batch.epoch, epoch);
      const auto batch_ids = ids(batch);
      seen.insert(seen.end(), batch_ids.begin(), batch_ids.end());
      EXPECT_EQ(int64s(batch.labels), int64s(torch::tensor(batch_ids) % 7));
    }
    EXPECT_EQ(seen, int64s(sample_order(50, 11, epoch))) << "epoch " << epoch;
  }
  Loader ordered(indexed(50), cpu(), LoaderOptions(8).shuffle(false));
  std::vector<int64_t> seen;
  for (const auto& batch : epoch_batches(ordered, 3)) {
    const auto batch_ids = ids(batch);
    seen.insert(seen.end(), batch_ids.begin(), batch_ids.end());
  }
  EXPECT_EQ(seen, int64s(torch::arange(50)));
}

TEST_F(LoaderTest, RanksShareEachGlobalBatchDisjointly) {
  const int64_t n = 23;
  const int64_t batch_size = 3;
  const int64_t world = 4;
  Loader whole(indexed(n), cpu(), LoaderOptions(batch_size * world).seed(2));
  const auto global = epoch_batches(whole, 1);
  std::vector<std::vector<Batch>> shards;
  for (int64_t rank = 0; rank < world; ++rank) {
    Loader loader(indexed(n), cpu(), LoaderOptions(batch_size).seed(2).rank(rank).world_size(world));
    EXPECT_EQ(loader.batches_per_epoch(), static_cast<int64_t>(global.size()));
    shards.push_back(epoch_batches(loader, 1));
  }
  for (size_t b = 0; b < global.size(); ++b) {
    std::vector<int64_t> joined;
    std::set<int64_t> distinct;
    for (int64_t rank = 0; rank < world; ++rank) {
      const Batch& shard = shards[static_cast<size_t>(rank)][b];
      EXPECT_EQ(shard.global_samples, global[b].size());
      const auto shard_ids = ids(shard);
      joined.insert(joined.end(), shard_ids.begin(), shard_ids.end());
      distinct.insert(shard_ids.begin(), shard_ids.end());
    }
    EXPECT_EQ(joined, ids(global[b])) << "global batch " << b;
    EXPECT_EQ(distinct.size(), joined.size());
  }
  // The short last global batch (11 samples) splits 3, 3, 3, 2.
  EXPECT_EQ(shards[3][1].size(), 2);
}

TEST_F(LoaderTest, ARankMayGetAnEmptyShareOfTheLastBatch) {
  std::vector<std::vector<Batch>> shards;
  for (int64_t rank = 0; rank < 4; ++rank) {
    Loader loader(indexed(13), cpu(), LoaderOptions(3).rank(rank).world_size(4));
    shards.push_back(epoch_batches(loader, 0));
    ASSERT_EQ(shards.back().size(), 2u);
    for (int64_t b = 0; b < 2; ++b) {
      EXPECT_EQ(loader.batch_rows(b), shards.back()[static_cast<size_t>(b)].size()) << "rank " << rank << " batch " << b;
    }
  }
  EXPECT_EQ(shards[0][1].size(), 1);
  for (int64_t rank = 1; rank < 4; ++rank) {
    const Batch& empty = shards[static_cast<size_t>(rank)][1];
    EXPECT_EQ(empty.features.sizes(), (std::vector<int64_t>{0, 3}));
    EXPECT_EQ(empty.labels.sizes(), (std::vector<int64_t>{0}));
    EXPECT_EQ(empty.global_samples, 1);
    EXPECT_EQ(empty.index, 1);
  }
}

TEST_F(LoaderTest, DropLastDropsTheShortGlobalBatchForEveryRank) {
  for (int64_t rank = 0; rank < 4; ++rank) {
    Loader loader(indexed(13), cpu(), LoaderOptions(3).rank(rank).world_size(4).drop_last(true));
    EXPECT_EQ(loader.batches_per_epoch(), 1);
    const auto batches = epoch_batches(loader, 0);
    ASSERT_EQ(batches.size(), 1u);
    EXPECT_EQ(batches[0].size(), 3);
    EXPECT_EQ(batches[0].global_samples, 12);
  }
}

TEST_F(LoaderTest, OrderDoesNotDependOnTheWorldSize) {
  // Two ranks of batch 4 see, together, exactly the batches one process of batch 8 sees.
  Loader single(indexed(37), cpu(), LoaderOptions(8).seed(5));
  Loader rank0(indexed(37), cpu(), LoaderOptions(4).seed(5).world_size(2));
  Loader rank1(indexed(37), cpu(), LoaderOptions(4).seed(5).world_size(2).rank(1));
  const auto whole = epoch_batches(single, 2);
  const auto first = epoch_batches(rank0, 2);
  const auto second = epoch_batches(rank1, 2);
  ASSERT_EQ(whole.size(), first.size());
  for (size_t b = 0; b < whole.size(); ++b) {
    auto joined = ids(first[b]);
    const auto rest = ids(second[b]);
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, ids(whole[b]));
  }
}

TEST_F(LoaderTest, SkipBatchesResumesWithTheSameBatches) {
  for (Placement placement : {Placement::kDevice, Placement::kPageable, Placement::kPinned}) {
    Loader loader(indexed(40), cpu(), LoaderOptions(6).seed(3).placement(placement));
    const auto full = epoch_batches(loader, 4);
    ASSERT_EQ(full.size(), 7u);
    const auto resumed = epoch_batches(loader, 4, /*skip=*/3);
    expect_same_batches(std::vector<Batch>(full.begin() + 3, full.end()), resumed, to_string(placement));
    EXPECT_TRUE(epoch_batches(loader, 4, /*skip=*/7).empty());
  }
}

TEST_F(LoaderTest, EveryPlacementYieldsIdenticalBatches) {
  for (bool shuffle : {true, false}) {
    for (int64_t rank : {0, 1}) {
      const auto options = LoaderOptions(5).seed(8).shuffle(shuffle).rank(rank).world_size(2);
      Loader reference(indexed(33), cpu(), LoaderOptions(options).placement(Placement::kPageable));
      const auto expected = epoch_batches(reference, 1);
      for (Placement placement : {Placement::kAuto, Placement::kDevice, Placement::kPinned}) {
        for (int64_t prefetch : {1, 2, 4}) {
          Loader loader(indexed(33), cpu(), LoaderOptions(options).placement(placement).prefetch(prefetch));
          expect_same_batches(expected, epoch_batches(loader, 1),
                              to_string(placement) + " prefetch " + std::to_string(prefetch) + " shuffle " +
                                  std::to_string(shuffle) + " rank " + std::to_string(rank));
        }
      }
    }
  }
}

TEST_F(LoaderTest, PlacementOnTheCpu) {
  EXPECT_EQ(Loader(indexed(4), cpu(), LoaderOptions(2)).placement(), Placement::kDevice);
  Loader pinned(indexed(4), cpu(), LoaderOptions(2).placement(Placement::kPinned));
  EXPECT_EQ(pinned.placement(), Placement::kPinned);
  EXPECT_FALSE(pinned.pinned());
  EXPECT_EQ(pinned.device(), cpu());
  EXPECT_EQ(pinned.staging_buffers().size(), 2u);
  EXPECT_TRUE(Loader(indexed(4), cpu(), LoaderOptions(2)).staging_buffers().empty());
}

TEST_F(LoaderTest, PinnedRingReusesItsHostBuffersOnTheCpu) {
  Loader loader(indexed(40), cpu(), LoaderOptions(4).placement(Placement::kPinned).prefetch(2));
  std::vector<const void*> pointers;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    loader.start_epoch(epoch);
    while (auto batch = loader.next()) {
      pointers.push_back(batch->features.data_ptr());
    }
  }
  ASSERT_EQ(pointers.size(), 20u);
  for (size_t i = 2; i < pointers.size(); ++i) {
    EXPECT_EQ(pointers[i], pointers[i - 2]) << "batch " << i;
  }
  EXPECT_NE(pointers[0], pointers[1]);
  const auto staging = loader.staging_buffers();
  EXPECT_EQ(std::set<const void*>(staging.begin(), staging.end()),
            std::set<const void*>(pointers.begin(), pointers.begin() + 2));
}

TEST_F(LoaderTest, BatchesKeptByTheCallerAreNeverOverwritten) {
  Loader reference(indexed(40), cpu(), LoaderOptions(4).placement(Placement::kPageable));
  const auto expected = epoch_batches(reference, 0);
  Loader loader(indexed(40), cpu(), LoaderOptions(4).placement(Placement::kPinned).prefetch(2));
  const auto kept = epoch_batches(loader, 0);
  expect_same_batches(expected, kept, "kept pinned batches");
  std::set<const void*> distinct;
  for (const auto& batch : kept) {
    distinct.insert(batch.features.data_ptr());
  }
  EXPECT_EQ(distinct.size(), kept.size());
}

TEST_F(LoaderTest, UnshuffledDeviceBatchesOnTheCpuAreViewsOfTheData) {
  Dataset data = indexed(20);
  Loader loader(data, cpu(), LoaderOptions(6).shuffle(false).placement(Placement::kDevice));
  loader.start_epoch(0);
  loader.next();
  const auto second = loader.next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->features.data_ptr(), data.features[6].data_ptr());
}

TEST_F(LoaderTest, StoppingEarlyNeverDeadlocks) {
  for (int64_t prefetch : {1, 2, 3}) {
    Loader loader(indexed(100), cpu(), LoaderOptions(4).placement(Placement::kPinned).prefetch(prefetch));
    loader.start_epoch(0);
    auto kept = loader.next();
    ASSERT_TRUE(kept.has_value());
    loader.start_epoch(1, 5);  // the producer of epoch 0 is blocked on a full ring
    const auto batch = loader.next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_EQ(batch->index, 5);
    EXPECT_EQ(batch->epoch, 1);
    loader.start_epoch(2);  // destroyed while the producer waits
  }
  Loader never_read(indexed(100), cpu(), LoaderOptions(4).placement(Placement::kPinned));
  never_read.start_epoch(0);
  Loader moved = std::move(never_read);
  EXPECT_TRUE(moved.next().has_value());
}

TEST_F(LoaderTest, DataWithoutLabelsGivesUndefinedLabels) {
  Dataset data = indexed(10);
  data.labels = at::Tensor();
  for (Placement placement : {Placement::kDevice, Placement::kPageable, Placement::kPinned}) {
    Loader loader(data, cpu(), LoaderOptions(4).shuffle(false).placement(placement));
    const auto batches = epoch_batches(loader, 0);
    ASSERT_EQ(batches.size(), 3u);
    EXPECT_FALSE(batches[0].labels.defined());
    EXPECT_EQ(ids(batches[2]), (std::vector<int64_t>{8, 9}));
  }
}

TEST_F(LoaderTest, ReadsTheDigitsInBatches) {
  const Dataset digits = read_csv(std::string(DKIT_FIXTURES_DIR) + "/../../data/digits.csv");
  Loader loader(digits, cpu(), LoaderOptions(64).seed(1));
  EXPECT_EQ(loader.batches_per_epoch(), 29);
  int64_t samples = 0;
  at::Tensor label_sum = torch::zeros({}, torch::kLong);
  for (const auto& batch : epoch_batches(loader, 0)) {
    samples += batch.size();
    label_sum += batch.labels.sum();
  }
  EXPECT_EQ(samples, 1797);
  EXPECT_EQ(label_sum.item<int64_t>(), digits.labels.sum().item<int64_t>());
}

TEST_F(LoaderTest, RejectsBadOptions) {
  EXPECT_EQ(error_message([] { Loader(indexed(4), cpu(), LoaderOptions(0)); }),
            "loader batch_size must be at least 1, got 0");
  EXPECT_EQ(error_message([] { Loader(indexed(4), cpu(), LoaderOptions(2).prefetch(0)); }),
            "loader prefetch must be at least 1, got 0");
  EXPECT_EQ(error_message([] { Loader(indexed(4), cpu(), LoaderOptions(2).world_size(0)); }),
            "loader world_size must be at least 1, got 0");
  EXPECT_EQ(error_message([] { Loader(indexed(4), cpu(), LoaderOptions(2).rank(2).world_size(2)); }),
            "loader rank 2 is out of range for world_size 2");
  EXPECT_EQ(error_message([] { Loader(indexed(4), gpu(num_gpus()), LoaderOptions(2)); }),
            "loader device '" + gpu(num_gpus()).str() + "' is not available; available devices: " +
                available_devices());
  Dataset empty = indexed(4);
  empty.features = empty.features.narrow(0, 0, 0);
  empty.labels = empty.labels.narrow(0, 0, 0);
  EXPECT_EQ(error_message([&] { Loader(empty, cpu(), LoaderOptions(2)); }),
            "cannot load batches from an empty data set (indexed)");
  EXPECT_EQ(error_message([] { Loader(indexed(10), cpu(), LoaderOptions(3).world_size(4).drop_last(true)); }),
            "loader drop_last leaves no batch: 10 samples are fewer than a global batch of 12 (batch_size 3 x "
            "world_size 4)");
  Loader loader(indexed(10), cpu(), LoaderOptions(3));
  EXPECT_EQ(error_message([&] { loader.next(); }), "Loader::next() called before start_epoch()");
  EXPECT_EQ(error_message([&] { loader.start_epoch(0, 5); }), "cannot skip 5 batches of epoch 0: it has 4");
  EXPECT_EQ(error_message([&] { loader.batch_rows(4); }), "batch 4 is out of range: an epoch has 4 batches");
  EXPECT_EQ(error_message([&] { loader.batch_rows(-1); }), "batch -1 is out of range: an epoch has 4 batches");
}

TEST_F(LoaderTest, ParsesPlacementNames) {
  for (Placement placement : {Placement::kAuto, Placement::kDevice, Placement::kPinned, Placement::kPageable}) {
    EXPECT_EQ(parse_placement(to_string(placement)), placement);
  }
  EXPECT_EQ(error_message([] { parse_placement("gpu"); }),
            "unknown placement 'gpu': expected auto, device, pinned or pageable");
  EXPECT_EQ(resolve_placement(Placement::kAuto, cpu()), Placement::kDevice);
  EXPECT_EQ(resolve_placement(Placement::kAuto, gpu(0)), Placement::kPinned);
  EXPECT_EQ(resolve_placement(Placement::kPageable, gpu(0)), Placement::kPageable);
}

// Images as bytes: batches keep the data set's shape, travel as uint8, and become float32 in [0, 1] on the device,
// bitwise x / 255 as LibTorch's MNIST dataset scales them.
TEST_F(LoaderTest, ImageBatchesKeepTheirShapeAndAreScaledOnTheDevice) {
  Dataset images;
  images.features = torch::randint(0, 256, {20, 1, 4, 5}, torch::kUInt8);
  images.labels = torch::arange(20) % 3;
  for (const Placement placement : {Placement::kDevice, Placement::kPinned, Placement::kPageable}) {
    SCOPED_TRACE(to_string(placement));
    Loader loader(images, cpu(),
                  LoaderOptions(8).placement(placement).features_dtype(torch::kFloat).features_divisor(255));
    const auto batches = epoch_batches(loader, 0);
    ASSERT_EQ(batches.size(), 3u);
    const at::Tensor order = sample_order(20, 0, 0);
    for (const auto& batch : batches) {
      EXPECT_EQ(batch.features.scalar_type(), torch::kFloat);
      EXPECT_EQ(batch.features.sizes().slice(1), at::IntArrayRef({1, 4, 5}));
      const at::Tensor rows = order.narrow(0, batch.index * 8, batch.size());
      EXPECT_TRUE(torch::equal(batch.features, images.features.index_select(0, rows).to(torch::kFloat) / 255));
      EXPECT_TRUE(torch::equal(batch.labels, images.labels.index_select(0, rows)));
    }
  }
}

TEST_F(LoaderTest, LabelsMayHaveAnyShapeAndDtype) {
  Dataset data = indexed(10);
  data.labels = torch::arange(20, torch::kFloat).view({10, 2});
  Loader loader(data, cpu(), LoaderOptions(4).shuffle(false).placement(Placement::kPinned));
  const auto batches = epoch_batches(loader, 0);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_TRUE(torch::equal(batches[1].labels, data.labels.narrow(0, 4, 4)));
  EXPECT_TRUE(torch::equal(batches[2].labels, data.labels.narrow(0, 8, 2)));
}

// A user's LibTorch dataset: samples one at a time through its get(i).
class IndexedDataset : public torch::data::datasets::Dataset<IndexedDataset> {
 public:
  explicit IndexedDataset(dkit::Dataset data) : data_(std::move(data)) {}
  torch::data::Example<> get(size_t index) override {
    return {data_.features[static_cast<int64_t>(index)], data_.labels[static_cast<int64_t>(index)]};
  }
  c10::optional<size_t> size() const override {
    return static_cast<size_t>(data_.size());
  }

 private:
  dkit::Dataset data_;
};

TEST_F(LoaderTest, ATorchDataDatasetGivesTheSameBatchesAsItsTensors) {
  const Dataset data = indexed(23);
  for (const Placement placement : {Placement::kDevice, Placement::kPinned, Placement::kPageable}) {
    SCOPED_TRACE(to_string(placement));
    Loader tensors(data, cpu(), LoaderOptions(5).placement(placement).world_size(2).rank(1));
    Loader samples(samples_of(IndexedDataset(data), "indexed samples"), cpu(),
                   LoaderOptions(5).placement(placement).world_size(2).rank(1));
    EXPECT_EQ(samples.size(), 23);
    EXPECT_EQ(samples.description(), "indexed samples");
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      expect_same_batches(epoch_batches(tensors, epoch), epoch_batches(samples, epoch),
                          "epoch " + std::to_string(epoch));
    }
  }
}

TEST_F(LoaderTest, BadDataIsRefusedWithItsName) {
  Dataset complex = indexed(4);
  complex.features = torch::zeros({4, 2}, torch::kComplexFloat);
  EXPECT_EQ(error_message([&] { Loader(complex, cpu(), LoaderOptions(2)); }),
            "Loader: the features of indexed are complex64: expected a floating-point or integer dtype");
  Dataset short_labels = indexed(4);
  short_labels.labels = torch::arange(3);
  EXPECT_EQ(error_message([&] { Loader(short_labels, cpu(), LoaderOptions(2)); }),
            "Loader: indexed has 4 samples but labels of shape [3]: one label row per sample");
  SampleSource ragged;
  ragged.size = 3;
  ragged.description = "ragged";
  ragged.get = [](int64_t i) { return std::make_pair(torch::zeros({i == 2 ? 3 : 2}), torch::tensor(i)); };
  Loader loader(ragged, cpu(), LoaderOptions(3).placement(Placement::kPinned).shuffle(false));
  loader.start_epoch(0);
  EXPECT_EQ(error_message([&] { loader.next(); }),
            "ragged: sample 2 has features [3] (float32) but sample 0 has [2] (float32): every sample must have the "
            "same shapes and dtypes");
}

TEST_F(LoaderTest, EveryPlacementAgreesOnTheGpu_CUDA) {
  Loader reference(indexed(301), cpu(), LoaderOptions(16).seed(4));
  const auto expected = epoch_batches(reference, 2);
  for (Placement placement : {Placement::kDevice, Placement::kPinned, Placement::kPageable}) {
    Loader loader(indexed(301), gpu(0), LoaderOptions(16).seed(4).placement(placement));
    const auto batches = epoch_batches(loader, 2);
    ASSERT_EQ(batches.size(), expected.size());
    EXPECT_EQ(batches[0].features.device(), gpu(0));
    EXPECT_EQ(batches[0].labels.device(), gpu(0));
    expect_same_batches(expected, batches, to_string(placement));
  }
}

TEST_F(LoaderTest, PinnedRingIsPageLockedAndReused_CUDA) {
  Loader loader(indexed(300), gpu(0), LoaderOptions(16).placement(Placement::kAuto).prefetch(3));
  EXPECT_EQ(loader.placement(), Placement::kPinned);
  EXPECT_TRUE(loader.pinned());
  const auto before = loader.staging_buffers();
  ASSERT_EQ(before.size(), 3u);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    epoch_batches(loader, epoch);
    EXPECT_EQ(loader.staging_buffers(), before);
  }
}

TEST_F(LoaderTest, BatchesAreRightWhileTheComputeStreamIsBusy_CUDA) {
  Loader reference(indexed(2000, 64), cpu(), LoaderOptions(100).seed(9));
  const auto expected = epoch_batches(reference, 0);
  Loader loader(indexed(2000, 64), gpu(0), LoaderOptions(100).seed(9).placement(Placement::kPinned).prefetch(2));
  loader.start_epoch(0);
  const auto busy = torch::randn({2048, 2048}, torch::Device(torch::kCUDA, 0));
  std::vector<at::Tensor> copies;
  while (auto batch = loader.next()) {
    for (int i = 0; i < 4; ++i) {
      busy.matmul(busy);  // queue work ahead of the batch on the compute stream
    }
    copies.push_back(batch->features.clone());  // ordered after the copy by the event
  }
  ASSERT_EQ(copies.size(), expected.size());
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_TRUE(torch::equal(copies[i].cpu(), expected[i].features)) << "batch " << i;
  }
}

TEST_F(LoaderTest, HotLoopNeverSynchronizes_CUDA) {
  for (Placement placement : {Placement::kDevice, Placement::kPinned}) {
    Loader loader(indexed(1000, 8), gpu(0), LoaderOptions(32).seed(1).placement(placement));
    MetricBuffer metrics({"feature_sum", "label_sum"}, gpu(0), loader.batches_per_epoch());
    const int64_t syncs = host_sync_count();
    {
#if DKIT_WITH_CUDA
      ScopedSyncCheck no_sync;
#endif
      loader.start_epoch(0);
      while (auto batch = loader.next()) {
        metrics.add({batch->features.sum(), batch->labels.sum()});
      }
    }
    EXPECT_EQ(host_sync_count(), syncs);
    const auto rows = metrics.flush();
    EXPECT_EQ(host_sync_count(), syncs + 1);
    EXPECT_DOUBLE_EQ(rows.sum("label_sum"), static_cast<double>((torch::arange(1000) % 7).sum().item<int64_t>()));
  }
}

} // namespace
} // namespace dkit
