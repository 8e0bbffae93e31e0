#include <dkit/data/mapped.h>

#include <dkit/data/loader.h>

#include "../support.h"

#include <fstream>

#include <unistd.h>

namespace dkit {
namespace {

using test::error_message;

class MappedTest : public test::SeedingFixture {
 protected:
  static std::string npy(const std::string& name) {
    return test::fixture("npy/" + name);
  }

  // Runs an epoch of `a` and `b` side by side, expects the same batches bitwise and returns how many there were.
  static int same_batches(Loader& a, Loader& b, const std::string& what) {
    a.start_epoch(1);
    b.start_epoch(1);
    int batches = 0;
    while (auto x = a.next()) {
      auto y = b.next();
      EXPECT_TRUE(y.has_value()) << what;
      if (!y) {
        break;
      }
      EXPECT_TRUE(torch::equal(x->features, y->features)) << what;
      EXPECT_TRUE(torch::equal(x->labels, y->labels)) << what;
      ++batches;
    }
    return batches;
  }

  // A copy of `mapped` in memory.
  static Dataset in_memory(const Dataset& mapped) {
    Dataset copied;
    copied.features = mapped.features.clone();
    copied.labels = mapped.labels.clone();
    copied.num_classes = mapped.num_classes;
    copied.description = "copied";
    return copied;
  }
};

// tests/fixtures/npy/ was written by NumPy (tests/fixtures/make_npy_fixtures.py); each array maps with NumPy's
// dtype, shape and values.
TEST_F(MappedTest, MapsWhatNumPyWrote) {
  const at::Tensor images = map_npy(npy("images.npy"));
  EXPECT_EQ(images.scalar_type(), at::kByte);
  EXPECT_EQ(images.sizes(), (std::vector<int64_t>{12, 1, 4, 4}));
  EXPECT_TRUE(torch::equal(images.flatten(), (torch::arange(12 * 16) * 7 % 256).to(at::kByte)));
  EXPECT_TRUE(torch::equal(map_npy(npy("features.npy")), torch::arange(60, at::kFloat).div(10).reshape({12, 5})));
  EXPECT_TRUE(torch::equal(map_npy(npy("v2.npy")), torch::arange(6, at::kDouble).reshape({3, 2})));
  EXPECT_TRUE(torch::equal(map_npy(npy("v3.npy")), torch::arange(4, at::kShort)));
  EXPECT_EQ(read_npy_header(npy("v3.npy")).data_bytes, 8);
}

// The Loader gathers batches from the map as it does from tensors in memory: the same batches, bitwise, uint8
// images converted and scaled on the way.
TEST_F(MappedTest, ALoaderReadsAMappedDataSetAsTheSameTensorsInMemory) {
  const Dataset mapped = map_npy_dataset(npy("images.npy"), npy("labels.npy"));
  EXPECT_EQ(mapped.num_classes, 3);
  EXPECT_EQ(mapped.description, npy("images.npy") + " (mapped): 12 samples of shape [1, 4, 4], uint8, 3 classes");
  const Dataset copied = in_memory(mapped);
  const auto options = LoaderOptions(5).seed(4).placement(Placement::kPinned).features_dtype(at::kFloat)
                           .features_divisor(255);
  Loader from_map(mapped, cpu(), options);
  Loader from_memory(copied, cpu(), options);
  EXPECT_EQ(same_batches(from_map, from_memory, "uint8 images"), 3);
}

// split() of a mapped data set writes nothing: both parts list their rows of the file's arrays, and a Loader over
// each gives the batches of the same split in memory, in order, shuffled and shuffled by blocks (-1, 0, 2).
TEST_F(MappedTest, SplitOfAMappedDataSetListsRowsAndLoadsAsInMemory) {
  Dataset mapped = map_npy_dataset(npy("images.npy"), npy("labels.npy"));
  const void* file_data = mapped.features.data_ptr();
  Dataset copied = in_memory(mapped);
  const DatasetSplit from_map = split(std::move(mapped), 0.25, 3);
  const DatasetSplit from_memory = split(std::move(copied), 0.25, 3);
  ASSERT_EQ(from_map.train.size(), 9);
  ASSERT_EQ(from_map.val.size(), 3);
  EXPECT_EQ(from_map.train.features.data_ptr(), file_data);
  EXPECT_TRUE(from_map.val.mapped);
  EXPECT_TRUE(torch::equal(from_map.train.features.index_select(0, from_map.train.rows), from_memory.train.features));
  EXPECT_TRUE(torch::equal(from_map.val.labels.index_select(0, from_map.val.rows), from_memory.val.labels));
  for (const Placement placement : {Placement::kDevice, Placement::kPinned}) {
    for (const int64_t block : {-1, 0, 2}) {
      const auto options =
          LoaderOptions(4).seed(2).shuffle(block >= 0).shuffle_block(std::max<int64_t>(block, 0)).shuffle_window(2)
              .placement(placement);
      Loader a(from_map.train, cpu(), options);
      Loader b(from_memory.train, cpu(), options);
      EXPECT_EQ(same_batches(a, b, to_string(placement) + " shuffle_block " + std::to_string(block)), 3);
    }
  }
}

// NumPy's uint16 has no tensor dtype in LibTorch 1.13: map_npy_dataset() keeps the file's bytes as int16 and a Loader
// widens each batch's rows to int32 as it gathers them (values above 32767 here), in every placement, shuffled or
// not, whole or split; the streaming scaling fit and a copy in memory see the same numbers, as inputs and as labels.
TEST_F(MappedTest, UnsignedSixteenBitArraysAreWidenedAsTheirRowsAreGathered) {
  const at::Tensor numbers = (torch::arange(60, at::kLong) * 4099 % 65536).to(at::kInt).reshape({12, 5});
  const NpyHeader header = read_npy_header(npy("wide.npy"));
  EXPECT_TRUE(header.uint16);
  EXPECT_EQ(header.dtype, at::kShort);
  EXPECT_EQ(error_message([&] { map_npy(npy("wide.npy")); }),
            npy("wide.npy") + ": dtype '<u2' (unsigned 16-bit) has no LibTorch tensor dtype to map it as; "
                              "map_npy_dataset() reads it, widening its rows to int32");

  const Dataset mapped = map_npy_dataset(npy("wide.npy"), npy("labels.npy"));
  EXPECT_EQ(mapped.description, npy("wide.npy") + " (mapped): 12 samples of shape [5], uint16, 3 classes");
  Dataset copied;
  copied.features = numbers.clone();
  copied.labels = mapped.labels.clone();
  const DatasetSplit map_parts = split(mapped, 0.25, 3);
  const DatasetSplit memory_parts = split(copied, 0.25, 3);
  const std::vector<std::pair<std::string, std::pair<Dataset, Dataset>>> cases = {
      {"whole", {mapped, copied}}, {"train part", {map_parts.train, memory_parts.train}}};
  for (const auto& [name, data] : cases) {
    for (const Placement placement : {Placement::kDevice, Placement::kPinned}) {
      for (const bool shuffle : {false, true}) {
        const auto options = LoaderOptions(4).seed(2).shuffle(shuffle).placement(placement);
        Loader a(data.first, cpu(), options);
        Loader b(data.second, cpu(), options);
        const std::string what = name + " " + to_string(placement) + (shuffle ? " shuffled" : "");
        EXPECT_EQ(same_batches(a, b, what), (data.first.size() + 3) / 4) << what;
      }
    }
    for (const Scaling scaling : {Scaling::kStandardize, Scaling::kMinMax}) {
      const Normalization from_map = fit_normalization(data.first, scaling);
      const Normalization from_memory = fit_normalization(data.second, scaling);
      EXPECT_TRUE(torch::equal(from_map.mean, from_memory.mean)) << name;
      EXPECT_TRUE(torch::equal(from_map.std, from_memory.std)) << name;
      EXPECT_TRUE(torch::equal(from_map.apply(data.first).features, from_memory.apply(data.second).features)) << name;
    }
  }

  const Dataset labelled = map_npy_dataset(npy("features.npy"), npy("wide.npy"));
  EXPECT_EQ(labelled.num_classes, numbers.max().item<int64_t>() + 1);
  Loader loader(labelled, cpu(), LoaderOptions(12).shuffle(false).placement(Placement::kPinned));
  loader.start_epoch(0);
  const auto batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_TRUE(torch::equal(batch->labels, numbers));
}

// The streaming fit gives today's formula bitwise on a block of rows, and the same result over listed rows of an
// array as over those rows copied, across several blocks.
TEST_F(MappedTest, StreamingScalingIsTheSameForListedRowsAndCopies) {
  const at::Tensor small = torch::randn({300, 40});
  const Normalization fitted = fit_normalization(small, Scaling::kStandardize);
  const at::Tensor x = small.to(at::kDouble);
  const at::Tensor mean = x.mean(0);
  EXPECT_TRUE(torch::equal(fitted.mean, mean.to(at::kFloat)));
  EXPECT_TRUE(torch::equal(fitted.std, (x - mean).pow(2).mean(0).sqrt().to(at::kFloat)));

  Dataset whole;
  whole.features = torch::randn({140000, 3}).mul_(3).add_(1);
  whole.mapped = true;
  whole.rows = std::get<0>(torch::randperm(140000, at::kLong).narrow(0, 0, 130001).sort());
  Dataset copy;
  copy.features = whole.features.index_select(0, whole.rows);
  for (const Scaling scaling : {Scaling::kStandardize, Scaling::kMinMax}) {
    const Normalization a = fit_normalization(whole, scaling);
    const Normalization b = fit_normalization(copy, scaling);
    EXPECT_TRUE(torch::equal(a.mean, b.mean)) << to_string(scaling);
    EXPECT_TRUE(torch::equal(a.std, b.std)) << to_string(scaling);
  }
  EXPECT_TRUE(torch::equal(fit_normalization(whole, Scaling::kMinMax).mean, copy.features.amin(0)));
  EXPECT_TRUE(torch::allclose(fit_normalization(whole, Scaling::kStandardize).std,
                              copy.features.std(0, /*unbiased=*/false), 1e-5));
}

// Block shuffling visits every sample once, block by block within each window, in an order that depends only on
// its arguments; a Loader resumed in the middle of an epoch gives the rest of the same batches.
TEST_F(MappedTest, BlockShufflingVisitsEverySampleAndResumesExactly) {
  const at::Tensor order = block_order(1000, 64, 4, 7, 2);
  EXPECT_TRUE(torch::equal(std::get<0>(order.sort()), torch::arange(1000, at::kLong)));
  EXPECT_TRUE(torch::equal(order, block_order(1000, 64, 4, 7, 2)));
  EXPECT_FALSE(torch::equal(order, block_order(1000, 64, 4, 7, 3)));
  EXPECT_FALSE(torch::equal(order, std::get<0>(order.sort())));
  const at::Tensor full_blocks = block_order(1024, 64, 4, 7, 2);
  for (int64_t window = 0; window < 4; ++window) {
    const at::Tensor blocks = full_blocks.narrow(0, window * 256, 256).div(64, "floor");
    EXPECT_EQ(std::get<0>(at::_unique(blocks)).size(0), 4) << window;
  }
  const BlockOrder windows(1000, 64, 4, 7, 2);
  ASSERT_EQ(windows.windows(), 4);
  for (int64_t position = 0; position < 1000; ++position) {
    const int64_t w = windows.window_of(position);
    EXPECT_LE(windows.window_start(w), position);
    EXPECT_GT(w + 1 < windows.windows() ? windows.window_start(w + 1) : 1000, position);
  }
  std::vector<int64_t> joined;
  for (int64_t w = 0; w < windows.windows(); ++w) {
    EXPECT_EQ(windows.window_start(w), static_cast<int64_t>(joined.size()));
    const std::vector<int64_t> samples = windows.window_samples(w);
    joined.insert(joined.end(), samples.begin(), samples.end());
  }
  EXPECT_EQ(joined, test::int64s(order));
  EXPECT_EQ(error_message([] { block_order(10, 0, 4, 0, 0); }),
            "block shuffling needs a block and a window of at least 1, got 0 and 4");

  test::TempDir tmp;
  test::write_npy(tmp.file("x.npy"), torch::arange(300, at::kFloat).reshape({100, 3}));
  test::write_npy(tmp.file("y.npy"), torch::arange(100, at::kLong));
  const Dataset data = map_npy_dataset(tmp.file("x.npy"), tmp.file("y.npy"));
  const auto options = LoaderOptions(8).seed(5).shuffle_block(16).shuffle_window(2).placement(Placement::kPinned);
  const auto epoch = [&](const LoaderOptions& o, int64_t skip) {
    Loader loader(data, cpu(), o);
    loader.start_epoch(1, skip);
    std::vector<int64_t> labels;
    while (auto batch = loader.next()) {
      const auto values = test::int64s(batch->labels);
      labels.insert(labels.end(), values.begin(), values.end());
    }
    return labels;
  };
  const std::vector<int64_t> whole = epoch(options, 0);
  const std::vector<int64_t> expected(test::int64s(block_order(100, 16, 2, 5, 1)));
  EXPECT_EQ(whole, expected);
  EXPECT_EQ(epoch(options, 5), std::vector<int64_t>(whole.begin() + 40, whole.end()));
}

// A file cut short while it is mapped would crash the reader with SIGBUS: each epoch starts by checking it.
TEST_F(MappedTest, AFileThatShrinksWhileMappedStopsTheNextEpoch) {
  test::TempDir tmp;
  test::write_npy(tmp.file("x.npy"), torch::arange(40, at::kFloat).reshape({10, 4}));
  test::write_npy(tmp.file("y.npy"), torch::arange(10, at::kLong).remainder(2));
  Loader loader(map_npy_dataset(tmp.file("x.npy"), tmp.file("y.npy")), cpu(), LoaderOptions(5));
  loader.start_epoch(0);
  while (loader.next()) {
  }
  ASSERT_EQ(::truncate(tmp.file("y.npy").c_str(), 100), 0);
  EXPECT_EQ(error_message([&] { loader.start_epoch(1); }),
            tmp.file("y.npy") + " has shrunk from 208 to 100 bytes while mapped: was it rewritten during "
            "training?");
}

TEST_F(MappedTest, BadFilesAreOneLineErrorsNamingThem) {
  EXPECT_EQ(error_message([] { map_npy(npy("fortran.npy")); }),
            npy("fortran.npy") + ": the array is in Fortran order; save it in C order, e.g. with "
                                 "np.ascontiguousarray(a)");
  EXPECT_EQ(error_message([] { map_npy(npy("big_endian.npy")); }),
            npy("big_endian.npy") + ": the array is big-endian ('>f4'); save it little-endian, e.g. with "
                                    "a.astype(a.dtype.newbyteorder('<'))");
  EXPECT_EQ(error_message([] { map_npy(npy("complex.npy")); }),
            npy("complex.npy") + ": dtype '<c8' is not one dkit maps (f2, f4, f8, u1, i1, u2, i2, i4, i8 or "
                                 "b1, little-endian)");
  EXPECT_EQ(error_message([] { map_npy(npy("truncated.npy")); }),
            npy("truncated.npy") + ": the file is truncated: its header promises 240 bytes of data, it holds 232");
  EXPECT_EQ(error_message([] { map_npy(test::fixture("mlp_input.csv")); }).find(": not a .npy file"),
            test::fixture("mlp_input.csv").size());
  EXPECT_EQ(error_message([] { map_npy_dataset(npy("features.npy"), npy("short_labels.npy")); }),
            npy("short_labels.npy") + " holds 11 labels, but " + npy("features.npy") +
                " holds 12 samples: one label row per sample");
  EXPECT_EQ(error_message([] { map_npy_dataset(npy("features.npy"), npy("float_labels.npy")); }),
            npy("float_labels.npy") + " holds float32 labels: class indices must be integers");
}

// Headers that lie: a shape whose bytes overflow, a header length past the end, a version NumPy never wrote.
TEST_F(MappedTest, HeadersThatLieAreRefusedBeforeAnythingIsMapped) {
  const auto header = [](const std::string& dict, char major = 1) {
    std::string bytes = "\x93NUMPY";
    bytes += major;
    bytes += '\0';
    bytes += static_cast<char>(dict.size() & 0xff);
    bytes += static_cast<char>(dict.size() >> 8);
    if (major != 1) {
      bytes += std::string(2, '\0');
    }
    return bytes + dict;
  };
  const std::string huge = header("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }");
  EXPECT_EQ(error_message([&] { parse_npy_header(huge, static_cast<int64_t>(huge.size()), "x.npy"); }),
            "x.npy: the .npy header's shape (4611686018427387904, 4) holds more bytes than any file");
  const std::string cut = header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }").substr(0, 20);
  EXPECT_EQ(error_message([&] { parse_npy_header(cut, 20, "x.npy"); }),
            "x.npy: the .npy header says it is 57 bytes long, but the file ends before that");
  const std::string v9 = header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 9);
  EXPECT_EQ(error_message([&] { parse_npy_header(v9, static_cast<int64_t>(v9.size()) + 8, "x.npy"); }),
            "x.npy: .npy format version 9.0 is not one dkit reads (1.0 to 3.0)");
  const std::string shape = header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1), }");
  EXPECT_EQ(error_message([&] { parse_npy_header(shape, static_cast<int64_t>(shape.size()) + 8, "x.npy"); }),
            "x.npy: the .npy header's shape is not a tuple of sizes: (2, -1)");
}

// nanoGPT's layout: sample i is tokens [i, i + T) and its targets [i + 1, i + T + 1), as int64, the uint16 tokens
// above 32,767 unsigned.
TEST_F(MappedTest, TokenWindowsAreNanoGptsSamples) {
  const SampleSource windows = map_token_windows(npy("tokens.bin"), TokenDtype::kUInt16, 8);
  EXPECT_EQ(windows.size, 92);
  const auto expected = [](int64_t from) { return (torch::arange(from, from + 8) * 701).remainder(65536); };
  for (const int64_t i : {int64_t{0}, int64_t{50}, int64_t{91}}) {
    const auto [x, y] = windows.get(i);
    EXPECT_EQ(x.scalar_type(), at::kLong);
    EXPECT_TRUE(torch::equal(x, expected(i))) << i;
    EXPECT_TRUE(torch::equal(y, expected(i + 1))) << i;
  }
  EXPECT_GT(std::get<0>(windows.get(91)).max().item<int64_t>(), 32767);
  EXPECT_EQ(error_message([] { map_token_windows(npy("tokens.bin"), TokenDtype::kUInt16, 100); }),
            npy("tokens.bin") + " holds 100 tokens, fewer than one window of 100 and its next token");
  test::TempDir tmp;
  std::ofstream(tmp.file("odd.bin"), std::ios::binary) << "1234567";
  EXPECT_EQ(error_message([&] { map_token_windows(tmp.file("odd.bin"), TokenDtype::kInt32, 1); }),
            tmp.file("odd.bin") + " holds 7 bytes, no whole number of int32 tokens");
}

} // namespace
} // namespace dkit
