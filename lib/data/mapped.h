#pragma once

#include <dkit/core/enum_names.h>
#include <dkit/data/dataset.h>
#include <dkit/data/loader.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dkit {

/// What the header of a NumPy `.npy` file says, checked against the file's size.
struct NpyHeader {
  /// The element type; int16 for unsigned 16-bit numbers (see uint16).
  c10::ScalarType dtype = c10::ScalarType::Float;
  /// Whether the array holds unsigned 16-bit numbers (`u2`), which LibTorch 1.13 has no dtype for: `dtype` is then
  /// int16, a tensor of the same bytes (Dataset::features_uint16).
  bool uint16 = false;
  /// The array's shape (empty for a scalar).
  std::vector<int64_t> shape;
  /// Where the data starts, in bytes from the start of the file.
  int64_t data_offset = 0;
  /// The data's size in bytes: the product of the shape times the element size.
  int64_t data_bytes = 0;
};

/// Parses the header at the start of `bytes`, the first bytes of a `.npy` file of `file_size` bytes; `source` names
/// the file in errors. Format versions 1.0 to 3.0; the little-endian dtypes NumPy writes for numbers (`f2`, `f4`,
/// `f8`, `u1`, `i1`, `u2`, `i2`, `i4`, `i8`, `b1`); C order. A truncated file, a header that is not NumPy's, a shape
/// whose size overflows or disagrees with the file's size, a Fortran-order or big-endian array, or another dtype is
/// a one-line dkit::Error naming the file.
NpyHeader parse_npy_header(std::string_view bytes, int64_t file_size, const std::string& source);

/// Reads and checks the header of the `.npy` file at `path` (see parse_npy_header()).
NpyHeader read_npy_header(const std::string& path);

/// The array of the `.npy` file at `path`, memory-mapped read-only, as NumPy's `np.load(path, mmap_mode="r")`
/// gives it: a CPU tensor whose pages the kernel reads from the file when they are touched and may drop again, so
/// that a data set larger than memory takes none of the process's own. The mapping lives as long as the tensor and
/// its views; writing to it is not allowed (the pages are read-only). The header is checked before anything is
/// mapped. An array of unsigned 16-bit numbers (`u2`) has no tensor dtype and is an error; map_npy_dataset() reads it.
at::Tensor map_npy(const std::string& path);

/// A Dataset over memory-mapped `.npy` files: inputs `[N, ...]` from `features_path` and labels `[N, ...]` from
/// `labels_path` (empty: none). A Loader gathers each batch's rows from the map into its buffers, so the data set is
/// never copied whole; `uint8` images are converted and scaled per batch (LoaderOptions::features_dtype), unsigned
/// 16-bit arrays (`u2`) widened to int32 as their rows are gathered (Dataset::features_uint16). Labels of a
/// floating-point dtype, or a row count that differs from the inputs', are errors naming both files. The data set is
/// Dataset::mapped, and its Dataset::check_files checks both files before each epoch.
Dataset map_npy_dataset(const std::string& features_path, const std::string& labels_path = "");

/// A mapped Dataset of inputs `features` `[N, ...]` and integer class labels `labels` `[N, ...]` (undefined: none),
/// CPU tensors mapped from files: `features_name` and `labels_name` name them in errors and in the description, and
/// `check_files` becomes its Dataset::check_files, `features_uint16` and `labels_uint16` its Dataset::features_uint16
/// and Dataset::labels_uint16. Labels that are not integers or are negative, or a row count that differs from the
/// inputs', are errors naming both. map_npy_dataset() makes its data sets with it.
Dataset mapped_dataset(at::Tensor features, at::Tensor labels, const std::string& features_name,
                       const std::string& labels_name, std::function<void()> check_files,
                       bool features_uint16 = false, bool labels_uint16 = false);

/// A check for Dataset::check_files that the file at `path` still holds at least `bytes` bytes, as when it was
/// mapped: a file that is gone or shorter is a dkit::Error naming it, where reading its pages would crash.
std::function<void()> mapped_size_check(const std::string& path, int64_t bytes);

/// The dtype of a raw token file's tokens.
enum class TokenDtype {
  /// Unsigned 16-bit, as nanoGPT's `train.bin` (`np.uint16`).
  kUInt16,
  /// Signed 32-bit.
  kInt32,
  /// Unsigned 32-bit.
  kUInt32,
};

/// The name of each TokenDtype.
inline constexpr EnumNames<TokenDtype, 3> kTokenDtypeNames = {{
    {TokenDtype::kUInt16, "uint16"},
    {TokenDtype::kInt32, "int32"},
    {TokenDtype::kUInt32, "uint32"},
}};

/// The windows of a raw binary file of fixed-width little-endian tokens, memory-mapped, laid out as nanoGPT reads
/// its `train.bin`: sample `i` has inputs tokens `[i, i + seq_len)` and targets `[i + 1, i + seq_len + 1)`, both
/// int64 `[seq_len]`, converted from the file's dtype as the loader's thread copies them. A file shorter than one
/// window, or whose size is no whole number of tokens, is an error naming it.
SampleSource map_token_windows(const std::string& path, TokenDtype dtype, int64_t seq_len);

} // namespace dkit
