#pragma once

#include <dkit/core/enum_names.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dkit {

/// A whole labelled data set in host memory.
struct Dataset {
  /// Inputs `[N, ...]` on the CPU: float32 `[N, F]` from dkit's readers; a Loader takes any shape of any
  /// floating-point or integer dtype (uint8 images `[N, 1, 28, 28]`, int64 tokens `[N, T]`).
  at::Tensor features;
  /// Labels `[N, ...]` on the CPU: int64 class indices `[N]` from dkit's readers; a Loader takes any shape and dtype.
  /// Undefined for inputs without labels (what `dkit predict` reads).
  at::Tensor labels;
  /// Largest label + 1; 0 without labels.
  int64_t num_classes = 0;
  /// Where the data came from, for logs: `digits.csv: 1797 samples, 64 features, 10 classes`.
  std::string description;
  /// The rows of `features` and `labels` that make up the data set, int64 `[N]`, for a part of arrays that must not
  /// be copied (split() of a mapped data set); undefined: every row, in order.
  at::Tensor rows;
  /// Whether `features` and `labels` are read-only maps of files (map_npy_dataset()): split() leaves them whole.
  bool mapped = false;
  /// For a mapped data set, checks that its files still hold what was mapped and throws a dkit::Error naming a file
  /// that has shrunk; a Loader calls it before each epoch. Empty for data in memory.
  std::function<void()> check_files;
  /// Whether `features` holds unsigned 16-bit numbers in an int16 tensor of the same bytes (a `u2` .npy, which
  /// LibTorch 1.13 has no dtype for): a Loader widens each batch's rows to int32 as it gathers them.
  bool features_uint16 = false;
  /// Whether `labels` holds unsigned 16-bit numbers in an int16 tensor, as features_uint16 says of `features`.
  bool labels_uint16 = false;

  /// Number of samples N: the rows in `rows` when it is defined, else `features.size(0)`.
  int64_t size() const;
  /// Number of features F per sample.
  int64_t num_features() const;
  /// Whether `labels` is defined.
  bool has_labels() const;
};

/// The numbers of an int16 array that holds unsigned 16-bit numbers (Dataset::features_uint16), as int32; the array
/// itself when `uint16` is false.
at::Tensor widen_uint16(const at::Tensor& array, bool uint16);

/// Options for read_csv().
struct CsvOptions {
  /// Index of the label column, counted from 0; negative values count from the end as in Python, so the default
  /// -1 is the last column. Ignored when has_labels is false.
  TORCH_ARG(int64_t, label_column) = -1;
  /// Whether one column holds labels. False for inputs to predict: every column is then a feature.
  TORCH_ARG(bool, has_labels) = true;
  /// Whether the first line that is not empty names the columns, as pandas' `to_csv` and spreadsheets write one:
  /// it is skipped, and must have as many cells as the rows below it.
  TORCH_ARG(bool, header) = false;
};

/// Reads a CSV file of numbers: one sample per line (after a header row when `options.header()`), cells separated
/// by commas, spaces around a cell and Windows line endings allowed, empty lines skipped, a UTF-8 byte order mark at
/// the start (as spreadsheet programs write one) skipped. Labels must be non-negative integers (`3` or `3.0`).
/// Every error names the file; a bad cell also names its line and column (both counted from 1) and quotes it:
/// `digits.csv:12: column 3: 'abc' is not a number`.
Dataset read_csv(const std::string& path, const CsvOptions& options = {});

/// Like read_csv(), for CSV text already in memory; `source` stands for the file name in the description and in
/// error messages.
Dataset parse_csv(std::string_view text, const std::string& source, const CsvOptions& options = {});

/// Reads MNIST or Fashion-MNIST (or any IDX pair laid out as theirs) from the IDX files in `folder`:
/// `train-images-idx3-ubyte` and `train-labels-idx1-ubyte` when `train`, else the `t10k-` pair, each possibly
/// compressed as `NAME.gz` (as Debian's `dataset-fashion-mnist` ships them, in `/usr/share/datasets/fashion-mnist`).
/// The files are decompressed in memory; any number of images of any size is read, the two files must hold the
/// same count. Features are the pixels flattened to `[N, rows * columns]` and scaled to 0..1 as LibTorch's
/// `torch::data::datasets::MNIST` scales them (a division by 255, bitwise the same); labels as stored.
Dataset read_mnist(const std::string& folder, bool train = true);

/// read_mnist()'s images as they are stored, for a CNN: uint8 `[N, 1, rows, columns]` (the Loader scales them on the
/// device with LoaderOptions::features_dtype and features_divisor 255, bitwise read_mnist()'s values).
Dataset read_mnist_images(const std::string& folder, bool train = true);

/// Options for make_synthetic().
struct SyntheticOptions {
  /// `samples` points in `features` dimensions, drawn around `classes` centres.
  SyntheticOptions(int64_t samples, int64_t features, int64_t classes);

  /// Number of samples N.
  TORCH_ARG(int64_t, samples);
  /// Number of features F.
  TORCH_ARG(int64_t, features);
  /// Number of classes; samples are spread evenly over them (labels `i % classes`, shuffled).
  TORCH_ARG(int64_t, classes);
  /// Standard deviation of each blob around its centre. The centres are drawn from N(0, 1) per feature, so with
  /// noise well under 1 and a few features the classes are easy to separate.
  TORCH_ARG(double, noise) = 0.5;
  /// Seed of the generator; the same options always give the same data.
  TORCH_ARG(uint64_t, seed) = 0;
};

/// Seeded Gaussian blobs, one per class: a small learnable data set for tests and benchmarks. It uses its own
/// generator and leaves LibTorch's global one untouched.
Dataset make_synthetic(const SyntheticOptions& options);

/// Seeded 8-bit images `[samples, 1, side, side]` with int64 labels: make_synthetic()'s Gaussian blobs of `side * side`
/// features drawn as pixels (`128 + 48 x`, clamped), one noisy pattern per class. A small learnable image data set
/// for CNN tests, examples and benchmarks; LibTorch's global generator is left untouched.
Dataset make_synthetic_images(int64_t samples, int64_t side, int64_t classes, uint64_t seed = 0);

/// The two parts split() makes.
struct DatasetSplit {
  /// The samples to train on.
  Dataset train;
  /// The held-out samples; empty (`[0, F]`) when the validation fraction is 0.
  Dataset val;
};

/// Splits `data` at random into training and validation parts: `round(N * val_fraction)` samples, chosen by a
/// permutation seeded with `seed`, go to validation. Each part keeps the samples in their original order.
/// `val_fraction` must be in [0, 1) and leave at least one training sample.
DatasetSplit split(const Dataset& data, double val_fraction, uint64_t seed);

/// The same split without a copy when `data` holds the only reference to its contiguous CPU tensors: the rows are
/// reordered in place (training samples first, then validation samples, each in their original order) and the two
/// parts are views of `data`'s storage. A mapped data set is never written: both parts share its arrays and list
/// their Dataset::rows. Otherwise, as split() above.
DatasetSplit split(Dataset&& data, double val_fraction, uint64_t seed);

/// How inputs are scaled before training.
enum class Scaling {
  /// Inputs are used as they are.
  kNone,
  /// Each feature minus its mean, divided by its (population) standard deviation.
  kStandardize,
  /// Each feature minus its minimum, divided by its range: 0..1 on the data it was fitted on.
  kMinMax,
};

/// The name of each Scaling, as `data.scaling` spells it.
inline constexpr EnumNames<Scaling, 3> kScalingNames = {{
    {Scaling::kNone, "none"},
    {Scaling::kStandardize, "standardize"},
    {Scaling::kMinMax, "minmax"},
}};

/// Reads a name of kScalingNames; anything else is an error naming the accepted values.
Scaling parse_scaling(std::string_view name);

/// The lower-case name parse_scaling() reads back.
std::string to_string(Scaling scaling);

/// A per-feature affine scaling `(x - mean) / std`. Min-max scaling is stored the same way (mean = min,
/// std = max - min), so that applying it, and saving it in a checkpoint as `input_mean`/`input_std`, is the same
/// for every Scaling. A feature whose std (or range) is 0 gets 1, so that constant features never divide by 0.
struct Normalization {
  /// Subtracted from each feature: float32 `[F]`; undefined for no scaling.
  at::Tensor mean;
  /// Divides each feature after the subtraction: float32 `[F]`, never 0; undefined for no scaling.
  at::Tensor std;

  /// Whether there is any scaling to apply.
  bool defined() const;
  /// `(features - mean) / std` on the features' device, or `features` itself when undefined.
  at::Tensor apply(const at::Tensor& features) const;
  /// Scales `features` in place, as apply() would, without a copy; nothing when undefined.
  void apply_(const at::Tensor& features) const;
  /// A copy of `data` with scaled features, in memory (the labels are shared, or gathered when `data` lists rows).
  Dataset apply(const Dataset& data) const;
};

/// Fits `scaling` on `features` (`[N, F]`, N > 0): fit on the training part only, then apply to every part.
Normalization fit_normalization(const at::Tensor& features, Scaling scaling);

/// Fits `scaling` on the features of `data` (`[N, F]`, N > 0) in one streaming pass per statistic, a block of rows
/// at a time, so that a mapped data set is never loaded whole. The sums are float64 and taken in the same order for
/// a Dataset in memory and for its mapped twin, so both give the same normalization bitwise.
Normalization fit_normalization(const Dataset& data, Scaling scaling);

/// The seed sample_order() gives LibTorch's CPU generator for `epoch`: splitmix64 of `seed` and `epoch`. In Python,
/// `torch.randperm(n, generator=torch.Generator().manual_seed(order_seed(seed, epoch)))` gives the same order
/// with the same LibTorch version.
uint64_t order_seed(uint64_t seed, int64_t epoch);

/// The order of block shuffling in `epoch`, computed a window at a time: the blocks of `block` neighbouring samples
/// of `0..n-1` (the last may be short) in a seeded order, then the samples of each run of `window` consecutive blocks
/// of that order shuffled together. It holds the blocks' order only, so a Loader's order over data larger than
/// memory stays small; like sample_order() it depends only on its arguments.
class BlockOrder {
 public:
  /// The order of `n` samples for `seed` and `epoch`; a block or a window below 1 is a dkit::Error.
  BlockOrder(int64_t n, int64_t block, int64_t window, uint64_t seed, int64_t epoch);
  /// The number of windows.
  int64_t windows() const;
  /// The position in the order of window `w`'s first sample.
  int64_t window_start(int64_t w) const;
  /// The window that holds position `position` of the order.
  int64_t window_of(int64_t position) const;
  /// The samples of window `w`, in the order they are visited.
  std::vector<int64_t> window_samples(int64_t w) const;

 private:
  int64_t n_;
  int64_t block_;
  int64_t window_;
  uint64_t seed_;
  std::vector<int64_t> blocks_;
  int64_t short_block_position_;
};

/// The whole order of BlockOrder, int64 `[n]`: a disk then reads runs of neighbouring rows.
at::Tensor block_order(int64_t n, int64_t block, int64_t window, uint64_t seed, int64_t epoch);

/// The order in which the samples `0..n-1` are visited in `epoch`: an int64 permutation `[n]` on the CPU that
/// depends only on `seed` and `epoch` (LibTorch's `randperm` with a CPU generator seeded by order_seed()), so
/// every process of a multi-process run computes the same one whatever their number.
at::Tensor sample_order(int64_t n, uint64_t seed, int64_t epoch);

} // namespace dkit
