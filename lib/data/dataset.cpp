#include <dkit/data/dataset.h>

#include <dkit/core/error.h>
#include <dkit/device/device.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

namespace dkit {
namespace {

using detail::concat;
namespace fs = std::filesystem;

constexpr uint64_t kSyntheticTag = 0x73796e7468657469;
constexpr uint64_t kSplitTag = 0x73706c6974746572;
constexpr uint64_t kBlockTag = 0x626c6f636b6f7264;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

at::Generator seeded_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

struct FileCloser {
  void operator()(std::FILE* file) const {
    std::fclose(file);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_file(const std::string& path, const char* mode, const char* what) {
  std::error_code ignored;
  DKIT_CHECK(!fs::is_directory(path, ignored), "cannot open ", what, " '", path, "': it is a directory");
  File file(std::fopen(path.c_str(), mode));
  if (!file) {
    const int err = errno;
    throw Error(concat("cannot open ", what, " '", path, "': ", std::strerror(err)));
  }
  return file;
}

std::string read_whole_file(const std::string& path, const char* what) {
  File file = open_file(path, "rb", what);
  std::string text;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (!ec) {
    text.reserve(static_cast<size_t>(size));
  }
  char buffer[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) {
    text.append(buffer, got);
  }
  DKIT_CHECK(!std::ferror(file.get()), "cannot read ", what, " '", path, "': ", std::strerror(errno));
  return text;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) {
    text.remove_prefix(1);
  }
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) {
    text.remove_suffix(1);
  }
  return text;
}

std::string quoted(std::string_view cell) {
  constexpr size_t kMax = 40;
  if (cell.size() > kMax) {
    return concat("'", cell.substr(0, kMax), "...'");
  }
  return concat("'", cell, "'");
}

enum class NumberStatus { kOk, kNotANumber, kNotFinite };

NumberStatus parse_number(std::string_view cell, double& value) {
  const char* begin = cell.data();
  const char* end = begin + cell.size();
  if (begin != end && *begin == '+') {
    ++begin;
  }
  if (begin == end) {
    return NumberStatus::kNotANumber;
  }
  const auto [stop, ec] = std::from_chars(begin, end, value);
  if (stop != end) {
    return NumberStatus::kNotANumber;
  }
  if (ec == std::errc::result_out_of_range) {
    const std::string copy(begin, end);
    value = std::strtod(copy.c_str(), nullptr);
  } else if (ec != std::errc()) {
    return NumberStatus::kNotANumber;
  }
  return std::isfinite(value) ? NumberStatus::kOk : NumberStatus::kNotFinite;
}

struct CsvCell {
  const std::string& path;
  int64_t line;
  int64_t column;
  std::string_view text;

  std::string where() const {
    return concat(path, ":", line, ": column ", column, ": ");
  }
};

float parse_feature(const CsvCell& cell) {
  double value = 0;
  switch (parse_number(cell.text, value)) {
    case NumberStatus::kNotANumber:
      throw Error(concat(cell.where(), quoted(cell.text), " is not a number"));
    case NumberStatus::kNotFinite:
      throw Error(concat(cell.where(), quoted(cell.text), " is not a finite number"));
    case NumberStatus::kOk:
      break;
  }
  const auto narrowed = static_cast<float>(value);
  DKIT_CHECK(std::isfinite(narrowed), cell.where(), quoted(cell.text), " is out of the float32 range");
  return narrowed;
}

int64_t parse_label(const CsvCell& cell) {
  double value = 0;
  const bool integral = parse_number(cell.text, value) == NumberStatus::kOk && value >= 0 &&
                        value == std::floor(value) && value < 9007199254740992.0;
  DKIT_CHECK(integral, cell.where(), "label ", quoted(cell.text), " is not a non-negative integer");
  return static_cast<int64_t>(value);
}

int64_t count_cells(std::string_view line) {
  return static_cast<int64_t>(std::count(line.begin(), line.end(), ',')) + 1;
}

template <typename T>
at::Tensor vector_to_tensor(std::vector<T>&& values, at::IntArrayRef sizes, at::ScalarType dtype) {
  auto* owned = new std::vector<T>(std::move(values));
  return torch::from_blob(
      owned->data(), sizes, [owned](void*) { delete owned; }, at::TensorOptions().dtype(dtype));
}

std::string summary(const Dataset& data) {
  std::string text = data.features.dim() > 2
                         ? concat(data.size(), " samples of shape ", data.features.sizes().slice(1))
                         : concat(data.size(), " samples, ", data.num_features(), " features");
  if (data.has_labels()) {
    text += concat(", ", data.num_classes, " classes");
  }
  return text;
}

int64_t max_label(const at::Tensor& labels) {
  if (labels.numel() == 0) {
    return -1;
  }
  return labels.max().item<int64_t>();
}

// The size a gzip file's last member says it decompresses to (ISIZE, modulo 2^32), bounded by what deflate can
// expand the file to; 0 when the file is too short to say.
size_t decompressed_size_hint(std::FILE* file, const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  unsigned char trailer[4] = {};
  if (ec || size < 18 || std::fseek(file, -4, SEEK_END) != 0 || std::fread(trailer, 1, 4, file) != 4) {
    std::rewind(file);
    return 0;
  }
  std::rewind(file);
  const uint64_t claimed = uint64_t{trailer[0]} | (uint64_t{trailer[1]} << 8) | (uint64_t{trailer[2]} << 16) |
                           (uint64_t{trailer[3]} << 24);
  constexpr uint64_t kMaxDeflateRatio = 1032;
  return static_cast<size_t>(std::min<uint64_t>(claimed, static_cast<uint64_t>(size) * kMaxDeflateRatio));
}

// Decompresses a gzip file (one member or several) into memory with zlib's inflate rather than gzread: zlib's
// versions differ in whether gzread reports a stream that ends early (1.2 does, 1.3.2 returns what it has), and a
// cut-short file must be the same error everywhere.
std::string gunzip(const std::string& from) {
  File in = open_file(from, "rb", "gzip file");
  std::string bytes;
  bytes.reserve(decompressed_size_hint(in.get(), from));
  z_stream stream{};
  DKIT_CHECK(inflateInit2(&stream, 16 + MAX_WBITS) == Z_OK, "cannot decompress '", from, "': out of memory");
  std::unique_ptr<z_stream, int (*)(z_stream*)> stream_guard(&stream, &inflateEnd);
  std::vector<unsigned char> input(1 << 16);
  std::vector<unsigned char> output(1 << 16);
  int status = Z_OK;
  for (;;) {
    if (stream.avail_in == 0) {
      const size_t got = std::fread(input.data(), 1, input.size(), in.get());
      DKIT_CHECK(!std::ferror(in.get()), "cannot read '", from, "': ", std::strerror(errno));
      if (got == 0) {
        break;
      }
      stream.next_in = input.data();
      stream.avail_in = static_cast<uInt>(got);
    }
    if (status == Z_STREAM_END) {
      DKIT_CHECK(inflateReset(&stream) == Z_OK, "cannot decompress '", from, "'");
    }
    stream.next_out = output.data();
    stream.avail_out = static_cast<uInt>(output.size());
    status = inflate(&stream, Z_NO_FLUSH);
    DKIT_CHECK(status == Z_OK || status == Z_STREAM_END || status == Z_BUF_ERROR, "cannot decompress '", from,
               "': ", stream.msg != nullptr ? stream.msg : "not gzip data");
    bytes.append(reinterpret_cast<const char*>(output.data()), output.size() - stream.avail_out);
  }
  DKIT_CHECK(status == Z_STREAM_END, "cannot decompress '", from, "': unexpected end of file");
  return bytes;
}

uint32_t big_endian32(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) | uint32_t{bytes[3]};
}

// The header of an IDX file: `count` items of rows x columns bytes (1 x 1 for labels), from `data_offset` on.
struct IdxHeader {
  int64_t count = 0;
  int64_t rows = 1;
  int64_t columns = 1;
  size_t data_offset = 0;
};

IdxHeader parse_idx(const std::string& bytes, const std::string& shown, uint32_t expected_magic, bool images) {
  const size_t header_size = images ? 16 : 8;
  DKIT_CHECK(bytes.size() >= header_size, "'", shown, "' is too short for an IDX file");
  const auto* header = reinterpret_cast<const unsigned char*>(bytes.data());
  const uint32_t magic = big_endian32(header);
  DKIT_CHECK(magic == expected_magic, "'", shown, "' is not an IDX ", images ? "image" : "label",
             " file (magic number ", magic, ", expected ", expected_magic, ")");
  IdxHeader idx;
  idx.count = big_endian32(header + 4);
  idx.data_offset = header_size;
  if (images) {
    idx.rows = big_endian32(header + 8);
    idx.columns = big_endian32(header + 12);
    DKIT_CHECK(idx.rows > 0 && idx.columns > 0, "'", shown, "' holds ", idx.rows, "x", idx.columns, " images");
  }
  uint64_t needed = 0;
  const bool fits = !__builtin_mul_overflow(static_cast<uint64_t>(idx.rows) * static_cast<uint64_t>(idx.columns),
                                            static_cast<uint64_t>(idx.count), &needed) &&
                    !__builtin_add_overflow(needed, uint64_t{header_size}, &needed);
  DKIT_CHECK(fits, "'", shown, "' claims ", idx.count, " images of ", idx.rows, "x", idx.columns,
             ": more than a file can hold");
  DKIT_CHECK(bytes.size() >= needed, "'", shown, "' is truncated: ", bytes.size(), " bytes, expected ", needed);
  return idx;
}

} // namespace

int64_t Dataset::size() const {
  if (rows.defined()) {
    return rows.size(0);
  }
  return features.defined() ? features.size(0) : 0;
}

int64_t Dataset::num_features() const {
  return features.defined() && features.dim() == 2 ? features.size(1) : 0;
}

bool Dataset::has_labels() const {
  return labels.defined();
}

at::Tensor widen_uint16(const at::Tensor& array, bool uint16) {
  if (!uint16) {
    return array;
  }
  TORCH_INTERNAL_ASSERT(array.scalar_type() == at::kShort, "unsigned 16-bit numbers are held in int16 tensors");
  return array.to(at::kInt).bitwise_and_(0xFFFF);
}

Dataset read_csv(const std::string& path, const CsvOptions& options) {
  return parse_csv(read_whole_file(path, "CSV file"), path, options);
}

Dataset parse_csv(std::string_view text, const std::string& path, const CsvOptions& options) {
  std::vector<float> values;
  std::vector<int64_t> labels;
  int64_t columns = -1;
  int64_t label_column = -1;
  int64_t first_line = 0;
  int64_t line_number = 0;
  int64_t largest_label = -1;
  constexpr std::string_view kByteOrderMark = "\xef\xbb\xbf";
  const char* cursor = text.data();
  const char* const end = cursor + text.size();
  if (text.substr(0, kByteOrderMark.size()) == kByteOrderMark) {
    cursor += kByteOrderMark.size();
  }
  while (cursor < end) {
    ++line_number;
    const auto* newline = static_cast<const char*>(std::memchr(cursor, '\n', static_cast<size_t>(end - cursor)));
    const char* line_end = newline != nullptr ? newline : end;
    std::string_view line(cursor, static_cast<size_t>(line_end - cursor));
    cursor = newline != nullptr ? newline + 1 : end;
    if (!line.empty() && line.back() == '\r') {
      line.remove_suffix(1);
    }
    if (trim(line).empty()) {
      continue;
    }
    if (columns < 0) {
      columns = count_cells(line);
      first_line = line_number;
      if (options.has_labels()) {
        label_column = options.label_column() < 0 ? columns + options.label_column() : options.label_column();
        DKIT_CHECK(label_column >= 0 && label_column < columns, path, ": label column ", options.label_column(),
                   " is out of range for ", columns, columns == 1 ? " column" : " columns");
        DKIT_CHECK(columns >= 2, path, ": a single column leaves no features besides the labels");
      }
      const auto expected_rows = text.size() / (line.size() + 1) + 1;
      values.reserve(expected_rows * static_cast<size_t>(columns));
      labels.reserve(options.has_labels() ? expected_rows : 0);
      if (options.header()) {
        continue;
      }
    }
    int64_t column = 0;
    size_t start = 0;
    while (true) {
      const size_t comma = line.find(',', start);
      if (column < columns) {
        const CsvCell cell{path, line_number, column + 1,
                           trim(line.substr(start, comma == std::string_view::npos ? comma : comma - start))};
        if (column == label_column) {
          labels.push_back(parse_label(cell));
          largest_label = std::max(largest_label, labels.back());
        } else {
          values.push_back(parse_feature(cell));
        }
      }
      ++column;
      if (comma == std::string_view::npos) {
        break;
      }
      start = comma + 1;
    }
    DKIT_CHECK(column == columns, path, ":", line_number, ": ", column, column == 1 ? " cell" : " cells",
               ", expected ", columns, " as on line ", first_line);
  }
  DKIT_CHECK(!values.empty(), path, ": no data rows");
  const int64_t features = options.has_labels() ? columns - 1 : columns;
  const auto rows = static_cast<int64_t>(values.size()) / features;
  Dataset data;
  data.features = vector_to_tensor(std::move(values), {rows, features}, at::kFloat);
  if (options.has_labels()) {
    data.labels = vector_to_tensor(std::move(labels), {rows}, at::kLong);
    data.num_classes = largest_label + 1;
  }
  data.description = concat(fs::path(path).filename().string(), ": ", summary(data));
  return data;
}

namespace {

// The images of an MNIST folder as uint8 `[N, 1, rows, columns]` (or, `flat`, float32 `[N, rows * columns]` in
// 0..1), and their labels.
Dataset read_mnist_folder(const std::string& folder, bool train, bool flat) {
  std::error_code ec;
  DKIT_CHECK(fs::is_directory(folder, ec), "MNIST folder '", folder, "' does not exist");
  const std::string prefix = train ? "train" : "t10k";
  const std::string names[2] = {prefix + "-images-idx3-ubyte", prefix + "-labels-idx1-ubyte"};
  bool compressed[2] = {false, false};
  for (int i = 0; i < 2; ++i) {
    const fs::path plain = fs::path(folder) / names[i];
    if (fs::exists(plain, ec)) {
      continue;
    }
    DKIT_CHECK(fs::exists(plain.string() + ".gz", ec), "MNIST folder '", folder, "' has neither ", names[i],
               " nor ", names[i],
               ".gz (Debian's dataset-fashion-mnist package installs Fashion-MNIST in "
               "/usr/share/datasets/fashion-mnist)");
    compressed[i] = true;
  }
  std::string bytes[2];
  std::string shown[2];
  IdxHeader headers[2];
  for (int i = 0; i < 2; ++i) {
    shown[i] = (fs::path(folder) / names[i]).string() + (compressed[i] ? ".gz" : "");
    bytes[i] = compressed[i] ? gunzip(shown[i]) : read_whole_file(shown[i], "IDX file");
    headers[i] = parse_idx(bytes[i], shown[i], i == 0 ? 2051 : 2049, /*images=*/i == 0);
  }
  const int64_t count = headers[0].count;
  DKIT_CHECK(headers[1].count == count, "'", shown[1], "' holds ", headers[1].count, " labels but '", shown[0],
             "' holds ", count, " images");
  DKIT_CHECK(count > 0, "'", shown[0], "' holds no images");
  const auto from_bytes = [](std::string& data, size_t offset, at::IntArrayRef sizes) {
    return torch::from_blob(data.data() + offset, sizes, at::TensorOptions().dtype(at::kByte));
  };
  Dataset data;
  if (flat) {
    data.features = from_bytes(bytes[0], headers[0].data_offset, {count, headers[0].rows * headers[0].columns})
                        .to(at::kFloat)
                        .div_(255);
  } else {
    data.features =
        from_bytes(bytes[0], headers[0].data_offset, {count, 1, headers[0].rows, headers[0].columns}).clone();
  }
  std::string().swap(bytes[0]);
  data.labels = from_bytes(bytes[1], headers[1].data_offset, {count}).to(at::kLong);
  data.num_classes = max_label(data.labels) + 1;
  data.description = concat("MNIST ", train ? "training" : "test", " set in ", folder, ": ", summary(data));
  return data;
}

} // namespace

Dataset read_mnist(const std::string& folder, bool train) {
  return read_mnist_folder(folder, train, /*flat=*/true);
}

Dataset read_mnist_images(const std::string& folder, bool train) {
  return read_mnist_folder(folder, train, /*flat=*/false);
}

SyntheticOptions::SyntheticOptions(int64_t samples, int64_t features, int64_t classes)
    : samples_(samples), features_(features), classes_(classes) {}

Dataset make_synthetic(const SyntheticOptions& options) {
  DKIT_CHECK(options.samples() >= 1, "synthetic data needs at least 1 sample, got ", options.samples());
  DKIT_CHECK(options.features() >= 1, "synthetic data needs at least 1 feature, got ", options.features());
  DKIT_CHECK(options.classes() >= 1, "synthetic data needs at least 1 class, got ", options.classes());
  DKIT_CHECK(std::isfinite(options.noise()) && options.noise() >= 0,
             "synthetic data noise must be a non-negative number, got ", options.noise());
  at::Generator generator = seeded_generator(splitmix64(options.seed() ^ kSyntheticTag));
  const auto floats = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor centres = at::randn({options.classes(), options.features()}, generator, floats);
  const at::Tensor balanced = at::arange(options.samples(), at::TensorOptions().dtype(at::kLong)) % options.classes();
  const at::Tensor order = at::randperm(options.samples(), generator, at::TensorOptions().dtype(at::kLong));
  Dataset data;
  data.labels = balanced.index_select(0, order).contiguous();
  const at::Tensor noise = at::randn({options.samples(), options.features()}, generator, floats);
  data.features = (centres.index_select(0, data.labels) + noise * options.noise()).contiguous();
  data.num_classes = options.classes();
  data.description = concat("synthetic (noise ", options.noise(), ", seed ", options.seed(), "): ", summary(data));
  return data;
}

Dataset make_synthetic_images(int64_t samples, int64_t side, int64_t classes, uint64_t seed) {
  DKIT_CHECK(side >= 1, "synthetic images need a side of at least 1 pixel, got ", side);
  Dataset data = make_synthetic(SyntheticOptions(samples, side * side, classes).seed(seed));
  data.features = (data.features * 48 + 128).clamp(0, 255).to(at::kByte).view({samples, 1, side, side}).contiguous();
  data.description = concat("synthetic images (seed ", seed, "): ", summary(data));
  return data;
}

namespace {

// The part `part` of `data`, `rows` of its samples, with all but its tensors: the class count, how its numbers are
// held and its description.
Dataset part_of(const Dataset& data, int64_t rows, const std::string& part) {
  Dataset out;
  out.num_classes = data.num_classes;
  out.features_uint16 = data.features_uint16;
  out.labels_uint16 = data.labels_uint16;
  out.description = concat(data.description, " [", part, ": ", rows, " of ", data.size(), "]");
  return out;
}

Dataset take(const Dataset& data, const at::Tensor& indices, const std::string& part) {
  Dataset subset = part_of(data, indices.size(0), part);
  const at::Tensor rows = data.rows.defined() ? data.rows.index_select(0, indices) : indices;
  if (data.mapped) {
    subset.features = data.features;
    subset.labels = data.labels;
    subset.rows = rows;
    subset.mapped = true;
    subset.check_files = data.check_files;
  } else {
    subset.features = data.features.index_select(0, rows);
    if (data.has_labels()) {
      subset.labels = data.labels.index_select(0, rows);
    }
  }
  return subset;
}

// The training and validation indices of split(), each sorted.
std::pair<at::Tensor, at::Tensor> split_indices(int64_t n, double val_fraction, uint64_t seed) {
  DKIT_CHECK(val_fraction >= 0 && val_fraction < 1, "validation fraction must be in [0, 1), got ", val_fraction);
  const auto n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
  DKIT_CHECK(n - n_val >= 1, "validation fraction ", val_fraction, " leaves no training samples out of ", n);
  at::Generator generator = seeded_generator(splitmix64(seed ^ kSplitTag));
  const at::Tensor permutation = at::randperm(n, generator, at::TensorOptions().dtype(at::kLong));
  return {std::get<0>(permutation.narrow(0, n_val, n - n_val).sort()),
          std::get<0>(permutation.narrow(0, 0, n_val).sort())};
}

// Reorders the rows of `rows` in place so that row i holds what row order[i] held, following each cycle of the
// permutation with one row of scratch space.
void permute_rows_(const at::Tensor& rows, const at::Tensor& order) {
  TORCH_INTERNAL_ASSERT(rows.is_contiguous() && order.size(0) == rows.size(0), "permute_rows_ needs a contiguous "
                        "tensor and one index per row");
  const int64_t n = rows.size(0);
  const auto row_bytes = static_cast<size_t>(rows.numel() / std::max<int64_t>(n, 1)) * rows.element_size();
  auto* base = static_cast<char*>(rows.data_ptr());
  const int64_t* from = order.data_ptr<int64_t>();
  std::vector<char> scratch(row_bytes);
  std::vector<bool> placed(static_cast<size_t>(n), false);
  const auto row = [&](int64_t i) { return base + static_cast<size_t>(i) * row_bytes; };
  for (int64_t start = 0; start < n; ++start) {
    if (placed[static_cast<size_t>(start)] || from[start] == start) {
      continue;
    }
    std::memcpy(scratch.data(), row(start), row_bytes);
    int64_t i = start;
    while (from[i] != start) {
      std::memcpy(row(i), row(from[i]), row_bytes);
      placed[static_cast<size_t>(i)] = true;
      i = from[i];
    }
    std::memcpy(row(i), scratch.data(), row_bytes);
    placed[static_cast<size_t>(i)] = true;
  }
}

bool sole_contiguous_owner(const at::Tensor& tensor) {
  return !tensor.defined() || (tensor.is_contiguous() && tensor.storage_offset() == 0 &&
                               tensor.use_count() == 1 && tensor.storage().use_count() == 1 &&
                               tensor.device().is_cpu());
}

} // namespace

DatasetSplit split(const Dataset& data, double val_fraction, uint64_t seed) {
  const auto [train_indices, val_indices] = split_indices(data.size(), val_fraction, seed);
  return {take(data, train_indices, "train"), take(data, val_indices, "val")};
}

DatasetSplit split(Dataset&& data, double val_fraction, uint64_t seed) {
  if (data.mapped || data.rows.defined() || !sole_contiguous_owner(data.features) ||
      !sole_contiguous_owner(data.labels)) {
    return split(static_cast<const Dataset&>(data), val_fraction, seed);
  }
  const auto [train_indices, val_indices] = split_indices(data.size(), val_fraction, seed);
  const at::Tensor order = at::cat({train_indices, val_indices});
  permute_rows_(data.features, order);
  if (data.has_labels()) {
    permute_rows_(data.labels, order);
  }
  const int64_t n_train = train_indices.size(0);
  const int64_t n_val = val_indices.size(0);
  const auto part = [&data](int64_t begin, int64_t rows, const char* name) {
    Dataset out = part_of(data, rows, name);
    out.features = data.features.narrow(0, begin, rows);
    if (data.has_labels()) {
      out.labels = data.labels.narrow(0, begin, rows);
    }
    return out;
  };
  DatasetSplit parts{part(0, n_train, "train"), part(n_train, n_val, "val")};
  return parts;
}

Scaling parse_scaling(std::string_view name) {
  return parse_name(kScalingNames, name, "scaling");
}

std::string to_string(Scaling scaling) {
  return std::string(name_of(kScalingNames, scaling));
}

bool Normalization::defined() const {
  return mean.defined() && std.defined();
}

at::Tensor Normalization::apply(const at::Tensor& features) const {
  if (!defined()) {
    return features;
  }
  TORCH_CHECK(features.dim() == 2 && features.size(1) == mean.size(0), "cannot scale inputs of shape ",
              features.sizes(), " with a normalization of ", mean.size(0), " features");
  return (features - to_device(mean, features.device())) / to_device(std, features.device());
}

void Normalization::apply_(const at::Tensor& features) const {
  if (!defined()) {
    return;
  }
  TORCH_CHECK(features.dim() == 2 && features.size(1) == mean.size(0), "cannot scale inputs of shape ",
              features.sizes(), " with a normalization of ", mean.size(0), " features");
  features.sub_(to_device(mean, features.device())).div_(to_device(std, features.device()));
}

Dataset Normalization::apply(const Dataset& data) const {
  Dataset scaled;
  const auto rows_of = [&data](const at::Tensor& tensor) {
    return data.rows.defined() ? tensor.index_select(0, data.rows) : tensor;
  };
  scaled.features = apply(widen_uint16(rows_of(data.features), data.features_uint16).to(at::kFloat)).contiguous();
  if (data.has_labels()) {
    scaled.labels = widen_uint16(rows_of(data.labels), data.labels_uint16);
  }
  scaled.num_classes = data.num_classes;
  scaled.description = data.description;
  return scaled;
}

Normalization fit_normalization(const at::Tensor& features, Scaling scaling) {
  Dataset data;
  data.features = features;
  return fit_normalization(data, scaling);
}

Normalization fit_normalization(const Dataset& data, Scaling scaling) {
  const at::Tensor& features = data.features;
  TORCH_CHECK(features.dim() == 2, "input scaling needs features of shape [N, F], got ", features.sizes());
  const int64_t n = data.size();
  DKIT_CHECK(n > 0, "cannot fit input scaling on 0 samples");
  Normalization normalization;
  if (scaling == Scaling::kNone) {
    return normalization;
  }
  constexpr int64_t kRowsPerBlock = 65536;
  constexpr int64_t kColumnsPerBlock = 32;
  const int64_t n_features = features.size(1);
  const auto double_options = at::TensorOptions().dtype(at::kDouble);
  const auto for_each_block = [&](const std::function<void(const at::Tensor&, int64_t, int64_t)>& visit) {
    for (int64_t first_row = 0; first_row < n; first_row += kRowsPerBlock) {
      const int64_t count = std::min(kRowsPerBlock, n - first_row);
      const at::Tensor block = data.rows.defined()
                                   ? features.index_select(0, data.rows.narrow(0, first_row, count))
                                   : features.narrow(0, first_row, count);
      for (int64_t first = 0; first < n_features; first += kColumnsPerBlock) {
        const int64_t columns = std::min(kColumnsPerBlock, n_features - first);
        visit(widen_uint16(block.narrow(1, first, columns), data.features_uint16).to(at::kDouble), first, columns);
      }
    }
  };
  at::Tensor offset;
  at::Tensor scale;
  if (scaling == Scaling::kStandardize) {
    at::Tensor sum = at::zeros({n_features}, double_options);
    for_each_block([&](const at::Tensor& x, int64_t first, int64_t columns) {
      sum.narrow(0, first, columns).add_(x.sum(0));
    });
    offset = sum.div_(static_cast<double>(n));
    at::Tensor squares = at::zeros({n_features}, double_options);
    for_each_block([&](const at::Tensor& x, int64_t first, int64_t columns) {
      squares.narrow(0, first, columns).add_((x - offset.narrow(0, first, columns)).pow(2).sum(0));
    });
    scale = squares.div_(static_cast<double>(n)).sqrt_();
  } else {
    offset = at::full({n_features}, std::numeric_limits<double>::infinity(), double_options);
    at::Tensor high = at::full({n_features}, -std::numeric_limits<double>::infinity(), double_options);
    for_each_block([&](const at::Tensor& x, int64_t first, int64_t columns) {
      offset.narrow(0, first, columns).copy_(at::minimum(offset.narrow(0, first, columns), x.amin(0)));
      high.narrow(0, first, columns).copy_(at::maximum(high.narrow(0, first, columns), x.amax(0)));
    });
    scale = high - offset;
  }
  scale.masked_fill_(scale == 0, 1.0);
  normalization.mean = offset.to(at::kFloat).contiguous();
  normalization.std = scale.to(at::kFloat).contiguous();
  return normalization;
}

uint64_t order_seed(uint64_t seed, int64_t epoch) {
  return splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch)));
}

BlockOrder::BlockOrder(int64_t n, int64_t block, int64_t window, uint64_t seed, int64_t epoch)
    : n_(n), block_(block), window_(window), seed_(splitmix64(order_seed(seed, epoch) ^ kBlockTag)) {
  DKIT_CHECK(block >= 1 && window >= 1, "block shuffling needs a block and a window of at least 1, got ", block,
             " and ", window);
  TORCH_CHECK(n >= 0, "BlockOrder needs n >= 0, got ", n);
  const int64_t blocks = (n + block - 1) / block;
  at::Generator generator = seeded_generator(seed_);
  const at::Tensor sequence = at::randperm(blocks, generator, at::TensorOptions().dtype(at::kLong));
  blocks_.assign(sequence.data_ptr<int64_t>(), sequence.data_ptr<int64_t>() + blocks);
  const auto last = std::find(blocks_.begin(), blocks_.end(), blocks - 1);
  short_block_position_ = n % block == 0 ? blocks : last - blocks_.begin();
}

int64_t BlockOrder::windows() const {
  return (static_cast<int64_t>(blocks_.size()) + window_ - 1) / window_;
}

int64_t BlockOrder::window_start(int64_t w) const {
  const int64_t first_block = w * window_;
  return first_block * block_ - (short_block_position_ < first_block ? block_ - n_ % block_ : 0);
}

int64_t BlockOrder::window_of(int64_t position) const {
  TORCH_CHECK(position >= 0 && position < n_, "position ", position, " is outside an order of ", n_);
  int64_t w = std::min(position / (window_ * block_), windows() - 1);
  while (window_start(w) > position) {
    --w;
  }
  while (w + 1 < windows() && window_start(w + 1) <= position) {
    ++w;
  }
  return w;
}

std::vector<int64_t> BlockOrder::window_samples(int64_t w) const {
  TORCH_CHECK(w >= 0 && w < windows(), "window ", w, " is outside an order of ", windows());
  std::vector<int64_t> samples;
  const auto end = std::min<size_t>(blocks_.size(), static_cast<size_t>((w + 1) * window_));
  for (auto b = static_cast<size_t>(w * window_); b < end; ++b) {
    for (int64_t i = blocks_[b] * block_; i < std::min(n_, (blocks_[b] + 1) * block_); ++i) {
      samples.push_back(i);
    }
  }
  at::Generator generator = seeded_generator(splitmix64(seed_ ^ splitmix64(static_cast<uint64_t>(w))));
  const at::Tensor shuffle =
      at::randperm(static_cast<int64_t>(samples.size()), generator, at::TensorOptions().dtype(at::kLong));
  const int64_t* take = shuffle.data_ptr<int64_t>();
  std::vector<int64_t> out(samples.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = samples[static_cast<size_t>(take[i])];
  }
  return out;
}

at::Tensor block_order(int64_t n, int64_t block, int64_t window, uint64_t seed, int64_t epoch) {
  const BlockOrder order(n, block, window, seed, epoch);
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  int64_t* filled = out.data_ptr<int64_t>();
  for (int64_t w = 0; w < order.windows(); ++w) {
    const std::vector<int64_t> samples = order.window_samples(w);
    filled = std::copy(samples.begin(), samples.end(), filled);
  }
  return out;
}

at::Tensor sample_order(int64_t n, uint64_t seed, int64_t epoch) {
  TORCH_CHECK(n >= 0, "sample_order needs n >= 0, got ", n);
  at::Generator generator = seeded_generator(order_seed(seed, epoch));
  return at::randperm(n, generator, at::TensorOptions().dtype(at::kLong));
}

} // namespace dkit
