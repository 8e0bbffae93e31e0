#include <dkit/data/mapped.h>

#include <dkit/core/enum_names.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>

#include <torch/torch.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

namespace dkit {
namespace {

constexpr std::string_view kNpyMagic = "\x93NUMPY";

struct NpyDtype {
  std::string_view name;
  c10::ScalarType dtype;
  bool uint16 = false;
};

constexpr std::array<NpyDtype, 10> kNpyDtypes = {{
    {"f2", c10::ScalarType::Half}, {"f4", c10::ScalarType::Float}, {"f8", c10::ScalarType::Double},
    {"u1", c10::ScalarType::Byte}, {"i1", c10::ScalarType::Char},  {"u2", c10::ScalarType::Short, true},
    {"i2", c10::ScalarType::Short}, {"i4", c10::ScalarType::Int},  {"i8", c10::ScalarType::Long},
    {"b1", c10::ScalarType::Bool},
}};

// The value of `key` in the header's Python dict literal, up to the next top-level comma or the closing brace.
std::string_view dict_value(std::string_view header, std::string_view key, const std::string& source) {
  const std::string quoted = "'" + std::string(key) + "'";
  const size_t at = header.find(quoted);
  DKIT_CHECK(at != std::string_view::npos, source, ": the .npy header has no '", key, "' entry");
  size_t begin = header.find(':', at + quoted.size());
  DKIT_CHECK(begin != std::string_view::npos, source, ": the .npy header's '", key, "' entry has no value");
  ++begin;
  while (begin < header.size() && header[begin] == ' ') {
    ++begin;
  }
  size_t end = begin;
  int depth = 0;
  while (end < header.size()) {
    const char c = header[end];
    if (c == '(') {
      ++depth;
    } else if (c == ')') {
      --depth;
    } else if ((c == ',' || c == '}') && depth == 0) {
      break;
    }
    ++end;
  }
  DKIT_CHECK(end < header.size() && depth == 0, source, ": the .npy header's '", key, "' entry is not closed");
  while (end > begin && header[end - 1] == ' ') {
    --end;
  }
  return header.substr(begin, end - begin);
}

std::vector<int64_t> parse_shape(std::string_view text, const std::string& source) {
  DKIT_CHECK(text.size() >= 2 && text.front() == '(' && text.back() == ')', source,
             ": the .npy header's shape is not a tuple: ", printable(std::string(text)));
  std::vector<int64_t> shape;
  std::string_view rest = text.substr(1, text.size() - 2);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    while (!item.empty() && item.front() == ' ') {
      item.remove_prefix(1);
    }
    while (!item.empty() && item.back() == ' ') {
      item.remove_suffix(1);
    }
    if (!item.empty()) {
      int64_t value = 0;
      for (const char c : item) {
        DKIT_CHECK(c >= '0' && c <= '9' && value <= (std::numeric_limits<int64_t>::max() - 9) / 10, source,
                   ": the .npy header's shape is not a tuple of sizes: ", printable(std::string(text)));
        value = value * 10 + (c - '0');
      }
      shape.push_back(value);
    } else {
      DKIT_CHECK(comma == std::string_view::npos, source, ": the .npy header's shape is not a tuple of sizes: ",
                 printable(std::string(text)));
    }
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return shape;
}

// The unsigned little-endian number in the `count` bytes at `bytes`.
uint32_t little_endian(const unsigned char* bytes, size_t count) {
  uint32_t value = 0;
  for (size_t i = 0; i < count; ++i) {
    value |= static_cast<uint32_t>(bytes[i]) << (8 * i);
  }
  return value;
}

// A file opened for reading, with its size; closed when it goes. Errors name the file.
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    DKIT_CHECK(fd_ >= 0, "cannot open ", path, ": ", std::strerror(errno));
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      const int error = errno;
      ::close(fd_);
      throw Error(std::string("cannot read ") + path + ": " + std::strerror(error));
    }
    size_ = static_cast<int64_t>(info.st_size);
  }
  ~ReadOnlyFile() {
    ::close(fd_);
  }
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  int fd() const {
    return fd_;
  }
  int64_t size() const {
    return size_;
  }

  // Maps its first `length` bytes read-only; the caller unmaps them.
  void* map(size_t length, const std::string& path) const {
    void* mapped = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd_, 0);
    DKIT_CHECK(mapped != MAP_FAILED, "cannot map ", path, ": ", std::strerror(errno));
    return mapped;
  }

 private:
  int fd_;
  int64_t size_ = 0;
};

NpyHeader read_header(const ReadOnlyFile& file, const std::string& path) {
  // NumPy pads a header to a multiple of 64 bytes and caps version 1's at 65,535: read what a header can span.
  std::string head(static_cast<size_t>(std::min<int64_t>(file.size(), 65536 + 12)), '\0');
  const ssize_t got = ::pread(file.fd(), head.data(), head.size(), 0);
  DKIT_CHECK(got >= 0, "cannot read ", path, ": ", std::strerror(errno));
  head.resize(static_cast<size_t>(got));
  return parse_npy_header(head, file.size(), path);
}

// The array of a .npy file, mapped: whether it holds unsigned 16-bit numbers, and the check that the file keeps the
// bytes that were mapped.
struct MappedNpy {
  at::Tensor array;
  bool uint16 = false;
  std::function<void()> check;
};

MappedNpy map_checked_npy(const std::string& path) {
  const ReadOnlyFile file(path);
  const NpyHeader header = read_header(file, path);
  MappedNpy mapped{at::Tensor(), header.uint16, mapped_size_check(path, header.data_offset + header.data_bytes)};
  const auto options = torch::TensorOptions().dtype(header.dtype);
  if (header.data_bytes == 0) {
    mapped.array = torch::empty(header.shape, options);
    return mapped;
  }
  const auto length = static_cast<size_t>(header.data_offset + header.data_bytes);
  void* map = file.map(length, path);
  char* data = static_cast<char*>(map) + header.data_offset;
  mapped.array = torch::from_blob(
      data, header.shape, [map, length](void*) { ::munmap(map, length); }, options);
  return mapped;
}

} // namespace

NpyHeader parse_npy_header(std::string_view bytes, int64_t file_size, const std::string& source) {
  DKIT_CHECK(bytes.size() >= 10 && bytes.substr(0, kNpyMagic.size()) == kNpyMagic, source,
             ": not a .npy file (it does not start with \\x93NUMPY and a header)");
  const auto major = static_cast<unsigned char>(bytes[6]);
  DKIT_CHECK(major >= 1 && major <= 3, source, ": .npy format version ", static_cast<int>(major), ".",
             static_cast<int>(static_cast<unsigned char>(bytes[7])), " is not one dkit reads (1.0 to 3.0)");
  const size_t length_bytes = major == 1 ? 2 : 4;
  DKIT_CHECK(bytes.size() >= 8 + length_bytes, source, ": the file ends inside the .npy header");
  const size_t header_start = 8 + length_bytes;
  const uint64_t header_length =
      little_endian(reinterpret_cast<const unsigned char*>(bytes.data()) + 8, length_bytes);
  DKIT_CHECK(header_start + header_length <= bytes.size() &&
                 static_cast<int64_t>(header_start + header_length) <= file_size,
             source, ": the .npy header says it is ", header_length, " bytes long, but the file ends before that");
  const std::string_view header = bytes.substr(header_start, header_length);
  DKIT_CHECK(!header.empty() && header.front() == '{', source, ": the .npy header is not a dict");

  NpyHeader result;
  const std::string_view descr = dict_value(header, "descr", source);
  DKIT_CHECK(descr.size() >= 5 && descr.front() == '\'' && descr.back() == '\'', source,
             ": the .npy header's descr is not a simple dtype: ", printable(std::string(descr)));
  const std::string_view code = descr.substr(2, descr.size() - 3);
  const char order = descr[1];
  DKIT_CHECK(order != '>', source, ": the array is big-endian (", printable(std::string(descr)),
             "); save it little-endian, e.g. with a.astype(a.dtype.newbyteorder('<'))");
  bool known = false;
  for (const auto& entry : kNpyDtypes) {
    if (entry.name == code && (order == '<' || order == '|' || order == '=')) {
      result.dtype = entry.dtype;
      result.uint16 = entry.uint16;
      known = true;
    }
  }
  DKIT_CHECK(known, source, ": dtype ", printable(std::string(descr)), " is not one dkit maps (",
             list_names(kNpyDtypes), ", little-endian)");
  const std::string_view fortran = dict_value(header, "fortran_order", source);
  DKIT_CHECK(fortran == "False" || fortran == "True", source, ": the .npy header's fortran_order is ",
             printable(std::string(fortran)), ", expected True or False");
  DKIT_CHECK(fortran == "False", source,
             ": the array is in Fortran order; save it in C order, e.g. with np.ascontiguousarray(a)");
  result.shape = parse_shape(dict_value(header, "shape", source), source);

  int64_t bytes_needed = c10::elementSize(result.dtype);
  for (const int64_t size : result.shape) {
    DKIT_CHECK(size == 0 || bytes_needed <= std::numeric_limits<int64_t>::max() / size, source,
               ": the .npy header's shape ", printable(std::string(dict_value(header, "shape", source))),
               " holds more bytes than any file");
    bytes_needed *= size;
  }
  result.data_offset = static_cast<int64_t>(header_start + header_length);
  result.data_bytes = bytes_needed;
  DKIT_CHECK(file_size - result.data_offset >= bytes_needed, source, ": the file is truncated: its header promises ",
             bytes_needed, " bytes of data, it holds ", file_size - result.data_offset);
  return result;
}

NpyHeader read_npy_header(const std::string& path) {
  return read_header(ReadOnlyFile(path), path);
}

at::Tensor map_npy(const std::string& path) {
  MappedNpy mapped = map_checked_npy(path);
  DKIT_CHECK(!mapped.uint16, path, ": dtype '<u2' (unsigned 16-bit) has no LibTorch tensor dtype to map it as; "
             "map_npy_dataset() reads it, widening its rows to int32");
  return std::move(mapped.array);
}

std::function<void()> mapped_size_check(const std::string& path, int64_t bytes) {
  return [path, bytes] {
    struct stat info {};
    DKIT_CHECK(::stat(path.c_str(), &info) == 0, "cannot read ", path, " while it is mapped: ", std::strerror(errno));
    DKIT_CHECK(static_cast<int64_t>(info.st_size) >= bytes, path, " has shrunk from ", bytes, " to ", info.st_size,
               " bytes while mapped: was it rewritten during training?");
  };
}

Dataset mapped_dataset(at::Tensor features, at::Tensor labels, const std::string& features_name,
                       const std::string& labels_name, std::function<void()> check_files, bool features_uint16,
                       bool labels_uint16) {
  Dataset data;
  data.mapped = true;
  data.features = std::move(features);
  data.features_uint16 = features_uint16;
  data.check_files = std::move(check_files);
  DKIT_CHECK(data.features.dim() >= 1, features_name, ": a data set's inputs need a shape [N, ...], got a scalar");
  data.description = detail::concat(features_name, " (mapped): ", data.features.size(0), " samples of shape ",
                                    data.features.sizes().slice(1), ", ",
                                    features_uint16 ? "uint16" : dtype_name(data.features.scalar_type()));
  if (!labels.defined()) {
    return data;
  }
  data.labels = std::move(labels);
  data.labels_uint16 = labels_uint16;
  DKIT_CHECK(data.labels.dim() >= 1 && data.labels.size(0) == data.features.size(0), labels_name, " holds ",
             data.labels.dim() >= 1 ? data.labels.size(0) : 0, " labels, but ", features_name, " holds ",
             data.features.size(0), " samples: one label row per sample");
  DKIT_CHECK(at::isIntegralType(data.labels.scalar_type(), /*includeBool=*/false), labels_name, " holds ",
             dtype_name(data.labels.scalar_type()), " labels: class indices must be integers");
  constexpr int64_t kRowsPerBlock = 1 << 20;
  for (int64_t first = 0; first < data.labels.size(0); first += kRowsPerBlock) {
    const at::Tensor block = widen_uint16(
        data.labels.narrow(0, first, std::min(kRowsPerBlock, data.labels.size(0) - first)), labels_uint16);
    if (block.numel() > 0) {
      DKIT_CHECK(block.min().item<int64_t>() >= 0, labels_name, " holds a negative class index");
      data.num_classes = std::max(data.num_classes, block.max().item<int64_t>() + 1);
    }
  }
  data.description += ", " + std::to_string(data.num_classes) + " classes";
  return data;
}

Dataset map_npy_dataset(const std::string& features_path, const std::string& labels_path) {
  MappedNpy features = map_checked_npy(features_path);
  if (labels_path.empty()) {
    return mapped_dataset(std::move(features.array), at::Tensor(), features_path, labels_path,
                          std::move(features.check), features.uint16);
  }
  MappedNpy labels = map_checked_npy(labels_path);
  return mapped_dataset(std::move(features.array), std::move(labels.array), features_path, labels_path,
                        [features_check = std::move(features.check), labels_check = std::move(labels.check)] {
                          features_check();
                          labels_check();
                        },
                        features.uint16, labels.uint16);
}

SampleSource map_token_windows(const std::string& path, TokenDtype dtype, int64_t seq_len) {
  DKIT_CHECK(seq_len >= 1, "map_token_windows: seq_len must be at least 1, got ", seq_len);
  const int64_t width = dtype == TokenDtype::kUInt16 ? 2 : 4;
  const ReadOnlyFile file(path);
  const int64_t bytes = file.size();
  DKIT_CHECK(bytes % width == 0, path, " holds ", bytes, " bytes, no whole number of ", name_of(kTokenDtypeNames, dtype),
             " tokens");
  const int64_t tokens = bytes / width;
  DKIT_CHECK(tokens >= seq_len + 1, path, " holds ", tokens, " tokens, fewer than one window of ", seq_len,
             " and its next token");
  void* map = file.map(static_cast<size_t>(bytes), path);
  std::shared_ptr<const unsigned char> mapped(static_cast<const unsigned char*>(map),
                                              [bytes](const unsigned char* p) {
                                                ::munmap(const_cast<unsigned char*>(p), static_cast<size_t>(bytes));
                                              });
  SampleSource source;
  source.size = tokens - seq_len;
  source.description = path + " (mapped): " + std::to_string(tokens) + " " +
                       std::string(name_of(kTokenDtypeNames, dtype)) + " tokens in windows of " +
                       std::to_string(seq_len);
  source.get = [mapped, dtype, seq_len, width](int64_t i) {
    at::Tensor window = torch::empty({seq_len + 1}, torch::kLong);
    int64_t* out = window.data_ptr<int64_t>();
    const unsigned char* in = mapped.get() + i * width;
    for (int64_t t = 0; t <= seq_len; ++t) {
      const unsigned char* token = in + t * width;
      switch (dtype) {
        case TokenDtype::kUInt16:
          out[t] = static_cast<int64_t>(little_endian(token, 2));
          break;
        case TokenDtype::kInt32:
          out[t] = static_cast<int64_t>(static_cast<int32_t>(little_endian(token, 4)));
          break;
        case TokenDtype::kUInt32:
          out[t] = static_cast<int64_t>(little_endian(token, 4));
          break;
      }
    }
    return std::make_pair(window.narrow(0, 0, seq_len), window.narrow(0, 1, seq_len));
  };
  return source;
}

} // namespace dkit
