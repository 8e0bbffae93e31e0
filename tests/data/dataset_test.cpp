#include <dkit/data/dataset.h>

#include <dkit/core/error.h>

#include "../support.h"

#include <torch/version.h>

#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace dkit {
namespace {

using test::error_message;
using test::int64s;
using test::TempDir;
using test::write_bytes;

std::string digits_csv() {
  return std::string(DKIT_FIXTURES_DIR) + "/../../data/digits.csv";
}

std::string write_file(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.file(name);
  write_bytes(path, text);
  return path;
}

class CsvTest : public test::SeedingFixture {
 protected:
  TempDir dir_;
};

TEST_F(CsvTest, ReadsTheDigits) {
  const Dataset data = read_csv(digits_csv());
  EXPECT_EQ(data.features.sizes(), (std::vector<int64_t>{1797, 64}));
  EXPECT_EQ(data.features.scalar_type(), at::kFloat);
  EXPECT_TRUE(data.features.is_contiguous());
  EXPECT_EQ(data.labels.sizes(), (std::vector<int64_t>{1797}));
  EXPECT_EQ(data.labels.scalar_type(), at::kLong);
  EXPECT_EQ(data.num_classes, 10);
  EXPECT_EQ(data.size(), 1797);
  EXPECT_EQ(data.num_features(), 64);
  EXPECT_EQ(data.description, "digits.csv: 1797 samples, 64 features, 10 classes");
  // First line: 0,0,5,13,9,1,0,0,... label 0; second line label 1; third label 2.
  EXPECT_EQ(data.features[0][2].item<float>(), 5.0f);
  EXPECT_EQ(data.features[0][3].item<float>(), 13.0f);
  EXPECT_EQ(int64s(data.labels.narrow(0, 0, 3)), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(data.features.max().item<float>(), 16.0f);
  EXPECT_EQ(data.features.min().item<float>(), 0.0f);
}

TEST_F(CsvTest, LabelColumnAnywhere) {
  const std::string path = write_file(dir_, "a.csv", "1,2.5,3\n4,-5e-1,6\n");
  const Dataset last = read_csv(path);
  EXPECT_TRUE(torch::equal(last.features, torch::tensor({{1.0f, 2.5f}, {4.0f, -0.5f}})));
  EXPECT_EQ(int64s(last.labels), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(last.num_classes, 7);
  const Dataset first = read_csv(path, CsvOptions().label_column(0));
  EXPECT_TRUE(torch::equal(first.features, torch::tensor({{2.5f, 3.0f}, {-0.5f, 6.0f}})));
  EXPECT_EQ(int64s(first.labels), (std::vector<int64_t>{1, 4}));
  const Dataset from_end = read_csv(path, CsvOptions().label_column(-3));
  EXPECT_TRUE(torch::equal(from_end.labels, first.labels));
}

TEST_F(CsvTest, WithoutLabelsEveryColumnIsAFeature) {
  const std::string path = write_file(dir_, "p.csv", "1,2,3\n4,5,6.5\n");
  const Dataset data = read_csv(path, CsvOptions().has_labels(false));
  EXPECT_TRUE(torch::equal(data.features, torch::tensor({{1.0f, 2.0f, 3.0f}, {4.0f, 5.0f, 6.5f}})));
  EXPECT_FALSE(data.has_labels());
  EXPECT_EQ(data.num_classes, 0);
  EXPECT_EQ(data.description, "p.csv: 2 samples, 3 features");
}

TEST_F(CsvTest, ToleratesSpacesCrLfBlankLinesAndNoFinalNewline) {
  const std::string path = write_file(dir_, "b.csv", "\n 1 ,\t+2, 3.0 \r\n\r\n4,5,1e0");
  const Dataset data = read_csv(path);
  EXPECT_TRUE(torch::equal(data.features, torch::tensor({{1.0f, 2.0f}, {4.0f, 5.0f}})));
  EXPECT_EQ(int64s(data.labels), (std::vector<int64_t>{3, 1}));
}

// A spreadsheet program's "CSV UTF-8" starts with a byte order mark, which is not part of the first cell; one
// anywhere else is.
TEST_F(CsvTest, SkipsAUtf8ByteOrderMarkAtTheStart) {
  const std::string path = write_file(dir_, "excel.csv", "\xef\xbb\xbf" "1,2,0\r\n3,4,1\r\n");
  const Dataset data = read_csv(path);
  EXPECT_TRUE(torch::equal(data.features, torch::tensor({{1.0f, 2.0f}, {3.0f, 4.0f}})));
  EXPECT_EQ(int64s(data.labels), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(error_message([] { parse_csv("1,2,0\n\xef\xbb\xbf" "3,4,1\n", "memory.csv"); }),
            "memory.csv:2: column 1: '\xef\xbb\xbf" "3' is not a number");
}

// A header row, as pandas' to_csv and spreadsheet programs write one, is skipped when asked for: the first line that
// is not empty, after a byte order mark. It sets the number of columns the rows must have.
TEST_F(CsvTest, SkipsAHeaderRowWhenAskedFor) {
  const std::string path = write_file(dir_, "named.csv", "\xef\xbb\xbf\n x , y , label\r\n1,2,0\r\n3,4,1\r\n");
  const Dataset data = read_csv(path, CsvOptions().header(true));
  EXPECT_TRUE(torch::equal(data.features, torch::tensor({{1.0f, 2.0f}, {3.0f, 4.0f}})));
  EXPECT_EQ(int64s(data.labels), (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(torch::equal(read_csv(path, CsvOptions().header(true).has_labels(false)).features,
                           torch::tensor({{1.0f, 2.0f, 0.0f}, {3.0f, 4.0f, 1.0f}})));
  EXPECT_EQ(error_message([&] { read_csv(path); }), path + ":2: column 1: 'x' is not a number");
  const std::string narrow = write_file(dir_, "narrow.csv", "x,label\n1,2,0\n");
  EXPECT_EQ(error_message([&] { read_csv(narrow, CsvOptions().header(true)); }),
            narrow + ":2: 3 cells, expected 2 as on line 1");
  const std::string only = write_file(dir_, "only.csv", "x,y,label\n\n");
  EXPECT_EQ(error_message([&] { read_csv(only, CsvOptions().header(true)); }), only + ": no data rows");
}

TEST_F(CsvTest, ParsesTextInMemoryNamingItsSource) {
  const Dataset data = parse_csv("1,2,0\n3,4,1\n", "memory.csv");
  EXPECT_TRUE(torch::equal(data.features, torch::tensor({{1.0f, 2.0f}, {3.0f, 4.0f}})));
  EXPECT_EQ(int64s(data.labels), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(data.description, "memory.csv: 2 samples, 2 features, 2 classes");
  EXPECT_EQ(error_message([] { parse_csv("1,2,0\n3,x,1\n", "memory.csv"); }),
            "memory.csv:2: column 2: 'x' is not a number");
}

TEST_F(CsvTest, MissingFileNamesThePath) {
  const std::string path = dir_.file("absent.csv");
  EXPECT_EQ(error_message([&] { read_csv(path); }),
            "cannot open CSV file '" + path + "': No such file or directory");
  EXPECT_EQ(error_message([&] { read_csv(dir_.path().string()); }),
            "cannot open CSV file '" + dir_.path().string() + "': it is a directory");
}

TEST_F(CsvTest, NonNumericCellNamesLineAndColumn) {
  const std::string path = write_file(dir_, "bad.csv", "1,2,0\n\n3,abc,1\n");
  EXPECT_EQ(error_message([&] { read_csv(path); }), path + ":3: column 2: 'abc' is not a number");
  const std::string empty = write_file(dir_, "empty_cell.csv", "1,,0\n");
  EXPECT_EQ(error_message([&] { read_csv(empty); }), empty + ":1: column 2: '' is not a number");
  const std::string trailing = write_file(dir_, "trailing.csv", "1,2x,0\n");
  EXPECT_EQ(error_message([&] { read_csv(trailing); }), trailing + ":1: column 2: '2x' is not a number");
  const std::string long_cell = write_file(dir_, "long.csv", "1," + std::string(50, 'z') + ",0\n");
  EXPECT_EQ(error_message([&] { read_csv(long_cell); }),
            long_cell + ":1: column 2: '" + std::string(40, 'z') + "...' is not a number");
}

TEST_F(CsvTest, NonFiniteCellsAreErrors) {
  const std::string nan = write_file(dir_, "nan.csv", "1,2,0\n3,nan,1\n");
  EXPECT_EQ(error_message([&] { read_csv(nan); }), nan + ":2: column 2: 'nan' is not a finite number");
  const std::string inf = write_file(dir_, "inf.csv", "-inf,2,0\n");
  EXPECT_EQ(error_message([&] { read_csv(inf); }), inf + ":1: column 1: '-inf' is not a finite number");
  const std::string big = write_file(dir_, "big.csv", "1e39,2,0\n");
  EXPECT_EQ(error_message([&] { read_csv(big); }), big + ":1: column 1: '1e39' is out of the float32 range");
  const std::string tiny = write_file(dir_, "tiny.csv", "1e-400,2,0\n");
  EXPECT_EQ(read_csv(tiny).features[0][0].item<float>(), 0.0f);
}

TEST_F(CsvTest, RaggedRowsNameTheLineAndTheCounts) {
  const std::string fewer = write_file(dir_, "fewer.csv", "1,2,0\n1,2,0\n3,1\n");
  EXPECT_EQ(error_message([&] { read_csv(fewer); }), fewer + ":3: 2 cells, expected 3 as on line 1");
  const std::string more = write_file(dir_, "more.csv", "\n1,2,0\n3,4,1,5\n");
  EXPECT_EQ(error_message([&] { read_csv(more); }), more + ":3: 4 cells, expected 3 as on line 2");
  const std::string one = write_file(dir_, "one.csv", "1,2\n3\n");
  EXPECT_EQ(error_message([&] { read_csv(one, CsvOptions().has_labels(false)); }),
            one + ":2: 1 cell, expected 2 as on line 1");
}

TEST_F(CsvTest, LabelsMustBeNonNegativeIntegers) {
  const std::string fraction = write_file(dir_, "f.csv", "1,2,0\n3,4,2.5\n");
  EXPECT_EQ(error_message([&] { read_csv(fraction); }),
            fraction + ":2: column 3: label '2.5' is not a non-negative integer");
  const std::string negative = write_file(dir_, "n.csv", "-1,2,0\n");
  EXPECT_EQ(error_message([&] { read_csv(negative, CsvOptions().label_column(0)); }),
            negative + ":1: column 1: label '-1' is not a non-negative integer");
  const std::string word = write_file(dir_, "w.csv", "1,2,cat\n");
  EXPECT_EQ(error_message([&] { read_csv(word); }), word + ":1: column 3: label 'cat' is not a non-negative integer");
}

TEST_F(CsvTest, BadShapesOfTheWholeFile) {
  const std::string path = write_file(dir_, "s.csv", "1,2,0\n");
  EXPECT_EQ(error_message([&] { read_csv(path, CsvOptions().label_column(3)); }),
            path + ": label column 3 is out of range for 3 columns");
  EXPECT_EQ(error_message([&] { read_csv(path, CsvOptions().label_column(-4)); }),
            path + ": label column -4 is out of range for 3 columns");
  const std::string single = write_file(dir_, "single.csv", "1\n2\n");
  EXPECT_EQ(error_message([&] { read_csv(single); }),
            single + ": a single column leaves no features besides the labels");
  const std::string blank = write_file(dir_, "blank.csv", "\n \n");
  EXPECT_EQ(error_message([&] { read_csv(blank); }), blank + ": no data rows");
}

// Writes an IDX pair as LibTorch's MNIST reader wants it, `count` images whose pixels encode their index.
void write_idx(const std::string& images, const std::string& labels, int64_t count, bool gz, int rows = 28) {
  std::string image_bytes;
  const auto put32 = [](std::string& out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      out.push_back(static_cast<char>((v >> shift) & 0xff));
    }
  };
  put32(image_bytes, 2051);
  put32(image_bytes, static_cast<uint32_t>(count));
  put32(image_bytes, static_cast<uint32_t>(rows));
  put32(image_bytes, 28);
  std::string label_bytes;
  put32(label_bytes, 2049);
  put32(label_bytes, static_cast<uint32_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    for (int p = 0; p < rows * 28; ++p) {
      image_bytes.push_back(static_cast<char>(p == 0 ? i % 256 : (p == 1 ? 255 : 0)));
    }
    label_bytes.push_back(static_cast<char>(i % 10));
  }
  const auto save = [gz](const std::string& path, const std::string& bytes) {
    if (!gz) {
      write_bytes(path, bytes);
      return;
    }
    gzFile out = gzopen((path + ".gz").c_str(), "wb");
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    gzclose(out);
  };
  save(images, image_bytes);
  save(labels, label_bytes);
}

class MnistTest : public test::SeedingFixture {
 protected:
  void check_test_set(const Dataset& data) {
    EXPECT_EQ(data.features.sizes(), (std::vector<int64_t>{10000, 784}));
    EXPECT_EQ(data.features.scalar_type(), at::kFloat);
    EXPECT_EQ(data.labels.sizes(), (std::vector<int64_t>{10000}));
    EXPECT_EQ(data.labels.scalar_type(), at::kLong);
    EXPECT_EQ(data.num_classes, 10);
    EXPECT_EQ(data.labels[1234].item<int64_t>(), 4);
    EXPECT_FLOAT_EQ(data.features[1234][0].item<float>(), static_cast<float>(1234 % 256) / 255.0f);
    EXPECT_FLOAT_EQ(data.features[1234][1].item<float>(), 1.0f);
    EXPECT_EQ(data.features.max().item<float>(), 1.0f);
  }

  TempDir dir_;
};

TEST_F(MnistTest, ReadsPlainIdxFiles) {
  write_idx(dir_.file("t10k-images-idx3-ubyte"), dir_.file("t10k-labels-idx1-ubyte"), 10000, /*gz=*/false);
  const Dataset data = read_mnist(dir_.path().string(), /*train=*/false);
  check_test_set(data);
  EXPECT_EQ(data.description,
            "MNIST test set in " + dir_.path().string() + ": 10000 samples, 784 features, 10 classes");
}

TEST_F(MnistTest, DecompressesGzippedIdxFilesAsDebianShipsThem) {
  write_idx(dir_.file("t10k-images-idx3-ubyte"), dir_.file("t10k-labels-idx1-ubyte"), 10000, /*gz=*/true);
  check_test_set(read_mnist(dir_.path().string(), /*train=*/false));
}

TEST_F(MnistTest, MissingFilesSayWhatIsExpected) {
  const std::string folder = dir_.path().string();
  EXPECT_EQ(error_message([&] { read_mnist(folder + "/nowhere"); }),
            "MNIST folder '" + folder + "/nowhere' does not exist");
  EXPECT_EQ(error_message([&] { read_mnist(folder); }),
            "MNIST folder '" + folder +
                "' has neither train-images-idx3-ubyte nor train-images-idx3-ubyte.gz (Debian's "
                "dataset-fashion-mnist package installs Fashion-MNIST in /usr/share/datasets/fashion-mnist)");
}

TEST_F(MnistTest, ReadsAnyCountAndImageSize) {
  write_idx(dir_.file("t10k-images-idx3-ubyte"), dir_.file("t10k-labels-idx1-ubyte"), 100, /*gz=*/true, /*rows=*/27);
  const Dataset data = read_mnist(dir_.path().string(), /*train=*/false);
  EXPECT_EQ(data.features.sizes(), (std::vector<int64_t>{100, 27 * 28}));
  EXPECT_EQ(data.labels[57].item<int64_t>(), 7);
  EXPECT_FLOAT_EQ(data.features[57][0].item<float>(), 57.0f / 255.0f);
}

// dkit reads the files itself (in memory, any count); LibTorch's reader, which wants exactly 10,000 test images on
// disk, is the oracle for the values.
TEST_F(MnistTest, GivesLibTorchsMnistValuesBitwise) {
  write_idx(dir_.file("t10k-images-idx3-ubyte"), dir_.file("t10k-labels-idx1-ubyte"), 10000, /*gz=*/false);
  const Dataset data = read_mnist(dir_.path().string(), /*train=*/false);
  const torch::data::datasets::MNIST mnist(dir_.path().string(), torch::data::datasets::MNIST::Mode::kTest);
  EXPECT_TRUE(torch::equal(data.features, mnist.images().reshape({10000, 784})));
  EXPECT_TRUE(torch::equal(data.labels, mnist.targets()));
}

TEST_F(MnistTest, WrongCountsAndShapesAreErrors) {
  const std::string images = dir_.file("t10k-images-idx3-ubyte");
  const std::string labels = dir_.file("t10k-labels-idx1-ubyte");
  write_idx(images, labels, 100, /*gz=*/false);
  write_idx(dir_.file("unused"), labels, 99, /*gz=*/false);
  EXPECT_EQ(error_message([&] { read_mnist(dir_.path().string(), /*train=*/false); }),
            "'" + labels + "' holds 99 labels but '" + images + "' holds 100 images");
  write_idx(images, labels, 0, /*gz=*/false);
  EXPECT_EQ(error_message([&] { read_mnist(dir_.path().string(), /*train=*/false); }),
            "'" + images + "' holds no images");
  write_idx(images, labels, 10, /*gz=*/false, /*rows=*/0);
  EXPECT_EQ(error_message([&] { read_mnist(dir_.path().string(), /*train=*/false); }),
            "'" + images + "' holds 0x28 images");
  write_idx(images, labels, 10, /*gz=*/false);
  std::filesystem::resize_file(images, 16 + 9 * 784);
  EXPECT_EQ(error_message([&] { read_mnist(dir_.path().string(), /*train=*/false); }),
            "'" + images + "' is truncated: 7072 bytes, expected 7856");
  write_bytes(images, "not an idx file at all");
  EXPECT_EQ(error_message([&] { read_mnist(dir_.path().string(), /*train=*/false); }),
            "'" + images + "' is not an IDX image file (magic number 1852797984, expected 2051)");
}

TEST_F(MnistTest, AHeaderClaimingMoreThanTheFileHoldsIsAnErrorBeforeAnyAllocation) {
  const std::string images = dir_.file("t10k-images-idx3-ubyte");
  write_idx(images, dir_.file("t10k-labels-idx1-ubyte"), 10, /*gz=*/false);
  std::string bytes = test::read_file(images);
  bytes.replace(4, 4, std::string("\xff\xff\xff\xff", 4));
  write_bytes(images, bytes);
  EXPECT_EQ(error_message([&] { read_mnist(dir_.path().string(), /*train=*/false); }),
            "'" + images + "' is truncated: 7856 bytes, expected 3367254359296");
  bytes.replace(8, 8, std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8));
  write_bytes(images, bytes);
  EXPECT_EQ(error_message([&] { read_mnist(dir_.path().string(), /*train=*/false); }),
            "'" + images + "' claims 4294967295 images of 4294967295x4294967295: more than a file can hold");
}

TEST_F(MnistTest, TruncatedGzippedFileIsAnError) {
  write_idx(dir_.file("t10k-images-idx3-ubyte"), dir_.file("t10k-labels-idx1-ubyte"), 10000, /*gz=*/true);
  const std::string gz = dir_.file("t10k-images-idx3-ubyte.gz");
  std::filesystem::resize_file(gz, std::filesystem::file_size(gz) / 2);
  const std::string message = error_message([&] { read_mnist(dir_.path().string(), /*train=*/false); });
  EXPECT_EQ(message, "cannot decompress '" + gz + "': unexpected end of file");
}

class SyntheticTest : public test::SeedingFixture {};

TEST_F(SyntheticTest, SameSeedSameData) {
  const auto options = SyntheticOptions(/*samples=*/300, /*features=*/8, /*classes=*/3).seed(5);
  const Dataset a = make_synthetic(options);
  const Dataset b = make_synthetic(options);
  EXPECT_TRUE(torch::equal(a.features, b.features));
  EXPECT_TRUE(torch::equal(a.labels, b.labels));
  const Dataset c = make_synthetic(SyntheticOptions(options).seed(6));
  EXPECT_FALSE(torch::equal(a.features, c.features));
  EXPECT_EQ(a.features.sizes(), (std::vector<int64_t>{300, 8}));
  EXPECT_EQ(a.num_classes, 3);
  EXPECT_EQ(int64s(torch::bincount(a.labels)), (std::vector<int64_t>{100, 100, 100}));
  EXPECT_EQ(a.description, "synthetic (noise 0.5, seed 5): 300 samples, 8 features, 3 classes");
}

TEST_F(SyntheticTest, LeavesTheGlobalGeneratorAlone) {
  torch::manual_seed(42);
  const auto expected = torch::rand({4});
  torch::manual_seed(42);
  make_synthetic(SyntheticOptions(50, 4, 2));
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

TEST_F(SyntheticTest, IsLearnable) {
  const Dataset data = make_synthetic(SyntheticOptions(/*samples=*/2000, /*features=*/16, /*classes=*/4));
  // Nearest class mean, fitted on the data itself, classifies the blobs almost perfectly.
  std::vector<torch::Tensor> means;
  for (int64_t c = 0; c < 4; ++c) {
    means.push_back(data.features.index({data.labels == c}).mean(0));
  }
  const auto distances = torch::cdist(data.features, torch::stack(means));
  const double accuracy = distances.argmin(1).eq(data.labels).to(torch::kDouble).mean().item<double>();
  EXPECT_GT(accuracy, 0.97);
}

TEST_F(SyntheticTest, RejectsBadOptions) {
  EXPECT_EQ(error_message([] { make_synthetic(SyntheticOptions(0, 4, 2)); }),
            "synthetic data needs at least 1 sample, got 0");
  EXPECT_EQ(error_message([] { make_synthetic(SyntheticOptions(10, 0, 2)); }),
            "synthetic data needs at least 1 feature, got 0");
  EXPECT_EQ(error_message([] { make_synthetic(SyntheticOptions(10, 4, 0)); }),
            "synthetic data needs at least 1 class, got 0");
  EXPECT_EQ(error_message([] { make_synthetic(SyntheticOptions(10, 4, 2).noise(-1)); }),
            "synthetic data noise must be a non-negative number, got -1");
}

class SplitTest : public test::SeedingFixture {};

TEST_F(SplitTest, PartsAreDisjointCoverEverythingAndAreSeeded) {
  Dataset data = make_synthetic(SyntheticOptions(101, 3, 2));
  data.features.select(1, 0).copy_(torch::arange(101));  // feature 0 = sample index
  const DatasetSplit parts = split(data, 0.2, /*seed=*/9);
  EXPECT_EQ(parts.train.size(), 81);
  EXPECT_EQ(parts.val.size(), 20);
  const auto ids = torch::cat({parts.train.features.select(1, 0), parts.val.features.select(1, 0)});
  EXPECT_TRUE(torch::equal(std::get<0>(ids.sort()), torch::arange(101).to(torch::kFloat)));
  // Each part keeps the original order, and labels travel with their features.
  const auto train_ids = parts.train.features.select(1, 0);
  EXPECT_TRUE(torch::equal(std::get<0>(train_ids.sort()), train_ids));
  EXPECT_TRUE(torch::equal(parts.val.labels, data.labels.index_select(0, parts.val.features.select(1, 0).to(torch::kLong))));
  EXPECT_EQ(parts.val.num_classes, 2);
  const DatasetSplit again = split(data, 0.2, 9);
  EXPECT_TRUE(torch::equal(again.val.features, parts.val.features));
  const DatasetSplit other = split(data, 0.2, 10);
  EXPECT_FALSE(torch::equal(other.val.features, parts.val.features));
  EXPECT_EQ(parts.val.description, data.description + " [val: 20 of 101]");
}

TEST_F(SplitTest, AMovedDataSetIsSplitInPlaceIntoTheSameParts) {
  for (const double fraction : {0.0, 0.1, 0.5}) {
    Dataset data = make_synthetic(SyntheticOptions(1001, 5, 3));
    const DatasetSplit copied = split(data, fraction, /*seed=*/4);
    const void* storage = data.features.data_ptr();
    const DatasetSplit moved = split(std::move(data), fraction, /*seed=*/4);
    EXPECT_EQ(moved.train.features.data_ptr(), storage) << "the training part should be a view, not a copy";
    for (const auto& [a, b] : {std::pair{&copied.train, &moved.train}, std::pair{&copied.val, &moved.val}}) {
      EXPECT_TRUE(torch::equal(a->features, b->features)) << fraction;
      EXPECT_TRUE(torch::equal(a->labels, b->labels)) << fraction;
      EXPECT_EQ(a->description, b->description);
      EXPECT_EQ(a->num_classes, b->num_classes);
    }
  }
}

TEST_F(SplitTest, ADataSetSharedElsewhereIsCopiedNotReordered) {
  Dataset data = make_synthetic(SyntheticOptions(50, 2, 2));
  const torch::Tensor kept = data.features;
  const torch::Tensor before = kept.clone();
  const DatasetSplit parts = split(std::move(data), 0.2, /*seed=*/1);
  EXPECT_TRUE(torch::equal(kept, before));
  EXPECT_NE(parts.train.features.data_ptr(), kept.data_ptr());
}

TEST_F(SplitTest, ZeroFractionGivesAnEmptyValidationPart) {
  const Dataset data = make_synthetic(SyntheticOptions(10, 3, 2));
  const DatasetSplit parts = split(data, 0.0, 1);
  EXPECT_EQ(parts.train.size(), 10);
  EXPECT_EQ(parts.val.size(), 0);
  EXPECT_EQ(parts.val.num_features(), 3);
}

TEST_F(SplitTest, RejectsFractionsOutOfRange) {
  const Dataset data = make_synthetic(SyntheticOptions(3, 3, 2));
  EXPECT_EQ(error_message([&] { split(data, 1.0, 0); }), "validation fraction must be in [0, 1), got 1");
  EXPECT_EQ(error_message([&] { split(data, -0.1, 0); }), "validation fraction must be in [0, 1), got -0.1");
  EXPECT_EQ(error_message([&] { split(data, 0.9, 0); }),
            "validation fraction 0.9 leaves no training samples out of 3");
}

class NormalizationTest : public test::SeedingFixture {};

TEST_F(NormalizationTest, StandardizeGivesZeroMeanUnitStd) {
  const auto x = torch::randn({500, 4}) * torch::tensor({1.0f, 10.0f, 0.1f, 3.0f}) + 7;
  const Normalization norm = fit_normalization(x, Scaling::kStandardize);
  const auto y = norm.apply(x);
  EXPECT_TRUE(torch::allclose(y.mean(0), torch::zeros({4}), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(y.std(0, /*unbiased=*/false), torch::ones({4}), 1e-4, 1e-4));
  EXPECT_TRUE(torch::allclose(norm.mean, x.mean(0), 1e-5, 1e-4));
}

// The fit reads the features a block of columns at a time, in float64; each column's statistics must be what the
// whole-matrix formula gives, bit for bit, so that checkpoints do not change with the memory it saves.
TEST_F(NormalizationTest, BlockwiseFitEqualsTheWholeMatrixFormula) {
  for (const auto& [rows, columns] : {std::pair<int64_t, int64_t>{1, 1}, {7, 31}, {1000, 33}, {6000, 784}}) {
    const auto x = torch::randn({rows, columns}) * 3 + torch::rand({columns}) * 100;
    const auto d = x.to(torch::kDouble);
    const auto mean = d.mean(0);
    const Normalization standard = fit_normalization(x, Scaling::kStandardize);
    EXPECT_TRUE(torch::equal(standard.mean, mean.to(torch::kFloat))) << rows << "x" << columns;
    EXPECT_TRUE(torch::equal(standard.std, (d - mean).pow(2).mean(0).sqrt().masked_fill(
                                               (d - mean).pow(2).mean(0).sqrt() == 0, 1.0).to(torch::kFloat)))
        << rows << "x" << columns;
    const Normalization minmax = fit_normalization(x, Scaling::kMinMax);
    EXPECT_TRUE(torch::equal(minmax.mean, d.amin(0).to(torch::kFloat)));
  }
}

TEST_F(NormalizationTest, AppliesInPlaceAsItAppliesToACopy) {
  const auto x = torch::randn({40, 6}) * 5 + 2;
  const Normalization norm = fit_normalization(x, Scaling::kStandardize);
  const auto expected = norm.apply(x);
  const auto view = x.narrow(0, 0, 40);
  norm.apply_(view);
  EXPECT_TRUE(torch::equal(x, expected));
}

TEST_F(NormalizationTest, ConstantFeatureNeverDividesByZero) {
  const auto x = torch::tensor({{1.0f, 5.0f}, {3.0f, 5.0f}});
  for (Scaling scaling : {Scaling::kStandardize, Scaling::kMinMax}) {
    const Normalization norm = fit_normalization(x, scaling);
    EXPECT_EQ(norm.std[1].item<float>(), 1.0f) << to_string(scaling);
    EXPECT_TRUE(torch::isfinite(norm.apply(x)).all().item<bool>());
    EXPECT_EQ(norm.apply(x)[0][1].item<float>(), 0.0f);
  }
}

TEST_F(NormalizationTest, MinMaxIsStoredAsMeanAndStd) {
  const auto x = torch::tensor({{0.0f, -2.0f}, {16.0f, 2.0f}, {8.0f, 0.0f}});
  const Normalization norm = fit_normalization(x, Scaling::kMinMax);
  EXPECT_TRUE(torch::equal(norm.mean, torch::tensor({0.0f, -2.0f})));
  EXPECT_TRUE(torch::equal(norm.std, torch::tensor({16.0f, 4.0f})));
  EXPECT_TRUE(torch::equal(norm.apply(x), torch::tensor({{0.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, 0.5f}})));
}

TEST_F(NormalizationTest, NoneIsUndefinedAndLeavesInputsAlone) {
  const auto x = torch::randn({3, 2});
  const Normalization norm = fit_normalization(x, Scaling::kNone);
  EXPECT_FALSE(norm.defined());
  EXPECT_TRUE(norm.apply(x).is_same(x));
}

TEST_F(NormalizationTest, AppliesToADatasetSharingItsLabels) {
  const Dataset data = make_synthetic(SyntheticOptions(20, 3, 2));
  const Normalization norm = fit_normalization(data.features, Scaling::kStandardize);
  const Dataset scaled = norm.apply(data);
  EXPECT_TRUE(scaled.labels.is_same(data.labels));
  EXPECT_TRUE(torch::allclose(scaled.features, (data.features - norm.mean) / norm.std));
}

TEST_F(NormalizationTest, ParsesScalingNames) {
  for (Scaling scaling : {Scaling::kNone, Scaling::kStandardize, Scaling::kMinMax}) {
    EXPECT_EQ(parse_scaling(to_string(scaling)), scaling);
  }
  EXPECT_EQ(error_message([] { parse_scaling("zscore"); }),
            "unknown scaling 'zscore': expected none, standardize or minmax");
  EXPECT_EQ(error_message([] { fit_normalization(torch::zeros({0, 3}), Scaling::kMinMax); }),
            "cannot fit input scaling on 0 samples");
}

class SampleOrderTest : public test::SeedingFixture {};

TEST_F(SampleOrderTest, IsAPermutationFixedBySeedAndEpoch) {
  const auto order = sample_order(1000, /*seed=*/3, /*epoch=*/2);
  EXPECT_EQ(order.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(std::get<0>(order.sort()), torch::arange(1000)));
  torch::manual_seed(999);  // the global generator plays no part
  EXPECT_TRUE(torch::equal(sample_order(1000, 3, 2), order));
  EXPECT_FALSE(torch::equal(sample_order(1000, 3, 3), order));
  EXPECT_FALSE(torch::equal(sample_order(1000, 4, 2), order));
  EXPECT_EQ(sample_order(0, 1, 1).numel(), 0);
}

TEST_F(SampleOrderTest, MatchesPythonRandpermWithTheSameSeed) {
  if (!(TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR == 13)) {
    GTEST_SKIP() << "the fixture was made with PyTorch 1.13; randperm's algorithm may differ in other versions";
  }
  std::ifstream in(test::fixture("sample_order.txt"));
  ASSERT_TRUE(in) << test::fixture("sample_order.txt");
  std::string line;
  std::getline(in, line);  // comment
  int cases = 0;
  int64_t n = 0;
  uint64_t seed = 0;
  int64_t epoch = 0;
  uint64_t mixed = 0;
  while (in >> n >> seed >> epoch >> mixed) {
    std::vector<int64_t> expected(static_cast<size_t>(n));
    for (auto& value : expected) {
      in >> value;
    }
    EXPECT_EQ(order_seed(seed, epoch), mixed);
  EXPECT_EQ(int64s(sample_order(n, seed, epoch)), expected) << n << " " << seed << " " << epoch;
    ++cases;
  }
  EXPECT_EQ(cases, 5);
}

} // namespace
} // namespace dkit
