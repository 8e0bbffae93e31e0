#include <dkit/data/mapped.h>

#include <dkit/data/loader.h>

#include "../support.h"

#include <fstream>

namespace dkit {
namespace {

using test::error_message;

class MappedTest : public test::SeedingFixture {
 protected:
  static std::string npy(const std::string& name) {
    return test::fixture("npy/" + name);
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
  Dataset copied{mapped.features.clone(), mapped.labels.clone(), 3, "copied"};
  const auto options = LoaderOptions(5).seed(4).placement(Placement::kPinned).features_dtype(at::kFloat)
                           .features_divisor(255);
  Loader from_map(mapped, cpu(), options);
  Loader from_memory(copied, cpu(), options);
  from_map.start_epoch(1);
  from_memory.start_epoch(1);
  int batches = 0;
  while (auto a = from_map.next()) {
    auto b = from_memory.next();
    ASSERT_TRUE(b.has_value());
    EXPECT_TRUE(torch::equal(a->features, b->features));
    EXPECT_TRUE(torch::equal(a->labels, b->labels));
    ++batches;
  }
  EXPECT_EQ(batches, 3);
}

TEST_F(MappedTest, BadFilesAreOneLineErrorsNamingThem) {
  EXPECT_EQ(error_message([] { map_npy(npy("fortran.npy")); }),
            npy("fortran.npy") + ": the array is in Fortran order; save it in C order, e.g. with "
                                 "np.ascontiguousarray(a)");
  EXPECT_EQ(error_message([] { map_npy(npy("big_endian.npy")); }),
            npy("big_endian.npy") + ": the array is big-endian ('>f4'); save it little-endian, e.g. with "
                                    "a.astype(a.dtype.newbyteorder('<'))");
  EXPECT_EQ(error_message([] { map_npy(npy("complex.npy")); }),
            npy("complex.npy") + ": dtype '<c8' is not one dkit maps (f2, f4, f8, u1, i1, i2, i4, i8 or b1, "
                                 "little-endian)");
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
