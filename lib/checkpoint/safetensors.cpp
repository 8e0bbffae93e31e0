#include <dkit/checkpoint/safetensors.h>

#include <dkit/checkpoint/detail/file_io.h>
#include <dkit/core/error.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cctype>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace dkit {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian, and dkit copies it to and from tensors as it is");

using Json = nlohmann::json;

// The largest header the official safetensors implementation reads or writes (its MAX_HEADER_SIZE).
constexpr uint64_t kFormatMaxHeaderBytes = 100'000'000;

constexpr const char* kMetadataKey = "__metadata__";

struct Entry {
  std::string name;
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t bytes = 0;
};

std::string readable_dtypes() {
  return list_names(kSafetensorsDtypes, " and ");
}

std::string offsets_text(uint64_t begin, uint64_t end) {
  return detail::concat("[", begin, ", ", end, "]");
}

std::string json_type(const Json& value) {
  if (value.is_number_unsigned()) {
    return "an integer";
  }
  if (value.is_number_integer()) {
    return "a negative integer";
  }
  if (value.is_number_float()) {
    return "a float";
  }
  if (value.is_string()) {
    return "a string";
  }
  if (value.is_boolean()) {
    return "a boolean";
  }
  if (value.is_array()) {
    return "a list";
  }
  if (value.is_object()) {
    return "an object";
  }
  return "null";
}

// Names in natural order: runs of digits compare as the numbers they spell, so `2.weight` comes before
// `10.weight`; names equal that way fall back to plain byte order.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0;
  size_t j = 0;
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      size_t a_end = i;
      size_t b_end = j;
      while (a_end < a.size() && digit(a[a_end])) {
        ++a_end;
      }
      while (b_end < b.size() && digit(b[b_end])) {
        ++b_end;
      }
      size_t a_start = i;
      size_t b_start = j;
      while (a_start + 1 < a_end && a[a_start] == '0') {
        ++a_start;
      }
      while (b_start + 1 < b_end && b[b_start] == '0') {
        ++b_start;
      }
      const std::string_view a_number(a.data() + a_start, a_end - a_start);
      const std::string_view b_number(b.data() + b_start, b_end - b_start);
      if (a_number.size() != b_number.size()) {
        return a_number.size() < b_number.size();
      }
      if (a_number != b_number) {
        return a_number < b_number;
      }
      i = a_end;
      j = b_end;
      continue;
    }
    if (a[i] != b[j]) {
      return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    }
    ++i;
    ++j;
  }
  if (i < a.size() || j < b.size()) {
    return j < b.size();
  }
  return a < b;
}

// Watches the parse of the header: its nesting, its number of values and names given twice in one object, each
// an error as soon as the parser reaches it.
class HeaderWatch {
 public:
  HeaderWatch(const std::string& path, const ReadLimits& limits) : path_(path), limits_(limits) {}

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        count_value();
        DKIT_CHECK(static_cast<int64_t>(levels_.size()) < limits_.max_depth(), path_,
                   ": the header nests deeper than ", limits_.max_depth(), " levels (max_depth)");
        levels_.push_back({{}, levels_.empty() ? "" : levels_.back().array ? levels_.back().name : levels_.back().key,
                           "", event == Json::parse_event_t::array_start});
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        levels_.pop_back();
        break;
      case Json::parse_event_t::key: {
        Level& level = levels_.back();
        level.key = parsed.get<std::string>();
        const bool fresh = level.keys.insert(level.key).second;
        DKIT_CHECK(fresh || levels_.size() > 1, path_, ": the header names '", level.key, "' twice");
        DKIT_CHECK(fresh, path_, ": the header has the key '", level.key, "' twice in '", level.name, "'");
        break;
      }
      case Json::parse_event_t::value:
        count_value();
        break;
    }
    return true;
  }

 private:
  // An object or array being parsed: the keys it has had, the key it is under (a list's items are under the
  // list's), and the key whose value comes next.
  struct Level {
    std::set<std::string> keys;
    std::string name;
    std::string key;
    bool array = false;
  };

  void count_value() {
    DKIT_CHECK(++values_ <= limits_.max_values(), path_, ": the header holds more than ", limits_.max_values(),
               " JSON values (max_values)");
  }

  const std::string& path_;
  const ReadLimits& limits_;
  std::vector<Level> levels_;
  int64_t values_ = 0;
};

Json parse_header(const std::string& path, const std::string& text, const ReadLimits& limits) {
  HeaderWatch watch(path, limits);
  try {
    return Json::parse(text, std::ref(watch));
  } catch (const Json::parse_error& e) {
    DKIT_CHECK(e.byte <= text.size(), path, ": the header is not valid UTF-8 JSON: it ends inside a value");
    throw Error(detail::concat(path, ": the header is not valid UTF-8 JSON: parsing stops at byte ", e.byte,
                               " of ", text.size()));
  } catch (const Json::exception&) {
    throw Error(detail::concat(path, ": the header is not valid JSON: it holds a number out of range"));
  }
}

SafetensorsMetadata read_metadata(const std::string& path, const Json& value) {
  DKIT_CHECK(value.is_object(), path, ": __metadata__ is ", json_type(value),
             ", not an object of strings to strings");
  SafetensorsMetadata metadata;
  for (const auto& [key, item] : value.items()) {
    DKIT_CHECK(item.is_string(), path, ": __metadata__ '", key, "' is ", json_type(item),
               ", not a string (metadata values are strings)");
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

std::optional<uint64_t> unsigned_number(const Json& value) {
  if (!value.is_number_unsigned()) {
    return std::nullopt;
  }
  return value.get<uint64_t>();
}

Entry read_entry(const std::string& path, const std::string& name, const Json& value) {
  const std::string where = path + ": tensor '" + name + "'";
  DKIT_CHECK(value.is_object(), where, " is ", json_type(value), " in the header, not an object with dtype, shape "
             "and data_offsets");
  Entry entry;
  entry.name = name;

  const auto dtype = value.find("dtype");
  DKIT_CHECK(dtype != value.end(), where, " has no dtype");
  DKIT_CHECK(dtype->is_string(), where, " has a dtype that is ", json_type(*dtype), ", not a string");
  const auto known = try_parse(kSafetensorsDtypes, dtype->get<std::string>());
  DKIT_CHECK(known.has_value(), where, " has dtype '", dtype->get<std::string>(), "', which dkit does not read (it "
             "reads ", readable_dtypes(), ")");
  entry.dtype = *known;

  const auto shape = value.find("shape");
  DKIT_CHECK(shape != value.end(), where, " has no shape");
  DKIT_CHECK(shape->is_array(), where, " has a shape that is ", json_type(*shape), ", not a list of sizes");
  std::vector<uint64_t> sizes;
  for (const Json& size : *shape) {
    const auto number = unsigned_number(size);
    DKIT_CHECK(number.has_value(), where, " has a shape with a size that is ", json_type(size),
               ", not a non-negative integer");
    sizes.push_back(*number);
  }
  uint64_t elements = 1;
  uint64_t strided = 1;
  bool overflow = false;
  for (const uint64_t size : sizes) {
    overflow = overflow || size > static_cast<uint64_t>(INT64_MAX) ||
               __builtin_mul_overflow(elements, size, &elements) ||
               __builtin_mul_overflow(strided, std::max<uint64_t>(size, 1), &strided);
    entry.shape.push_back(static_cast<int64_t>(size));
  }
  const size_t item_size = c10::elementSize(entry.dtype);
  overflow = overflow || __builtin_mul_overflow(elements, item_size, &entry.bytes) ||
             strided > static_cast<uint64_t>(INT64_MAX) / item_size;
  DKIT_CHECK(!overflow, where, " has shape ", c10::ArrayRef<uint64_t>(sizes), ", whose size overflows 64 bits");

  const auto offsets = value.find("data_offsets");
  DKIT_CHECK(offsets != value.end(), where, " has no data_offsets");
  const bool pair = offsets->is_array() && offsets->size() == 2 && unsigned_number((*offsets)[0]).has_value() &&
                    unsigned_number((*offsets)[1]).has_value();
  DKIT_CHECK(pair, where, " has data_offsets that are not two non-negative integers [begin, end]");
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  return entry;
}

// Checks the entries, sorted by offsets, as the official implementation's validate() does: each tensor's data
// starts where the previous one's ends, holds exactly the bytes its shape and dtype need, and the last one ends
// at the end of the file.
void check_layout(const std::string& path, const std::vector<Entry>& entries, uint64_t data_bytes,
                  const ReadLimits& limits) {
  uint64_t expected = 0;
  const Entry* previous = nullptr;
  for (const Entry& entry : entries) {
    const std::string where = path + ": tensor '" + entry.name + "' has data_offsets " +
                              offsets_text(entry.begin, entry.end);
    DKIT_CHECK(entry.end >= entry.begin, where, ", which end before they begin");
    DKIT_CHECK(entry.begin >= expected, where, ", which overlap those of tensor '", previous->name, "' ",
               offsets_text(previous->begin, previous->end));
    DKIT_CHECK(entry.begin == expected || previous == nullptr, where, ", but tensor '", previous->name,
               "' ends at ", expected, ": bytes ", expected, " to ", entry.begin, " of the data belong to no tensor");
    DKIT_CHECK(entry.begin == expected, where, ": bytes 0 to ", entry.begin, " of the data belong to no tensor");
    DKIT_CHECK(entry.end <= data_bytes, where, ", past the end of the data (", data_bytes,
               " bytes after the header; the file may have been cut short)");
    DKIT_CHECK(entry.end - entry.begin == entry.bytes, where, ", ", entry.end - entry.begin, " bytes, but shape ",
               c10::IntArrayRef(entry.shape), " of ", name_of(kSafetensorsDtypes, entry.dtype), " needs ", entry.bytes,
               " bytes");
    DKIT_CHECK(entry.bytes <= static_cast<uint64_t>(limits.max_record_bytes()), path, ": tensor '", entry.name,
               "' is ", entry.bytes, " bytes, more than the limit of ", limits.max_record_bytes(),
               " (max_record_bytes)");
    expected = entry.end;
    previous = &entry;
  }
  DKIT_CHECK(expected == data_bytes, path, ": the tensors' data ends at byte ", expected, " of the ", data_bytes,
             " after the header: the last ", data_bytes - expected, " bytes belong to no tensor");
}

void check_bools(const std::string& path, const Entry& entry, const at::Tensor& tensor) {
  const auto* bytes = static_cast<const unsigned char*>(tensor.data_ptr());
  for (uint64_t i = 0; i < entry.bytes; ++i) {
    DKIT_CHECK(bytes[i] <= 1, path, ": tensor '", entry.name, "' of dtype BOOL holds the byte ",
               static_cast<int>(bytes[i]), " at element ", i, ": a BOOL is 0 or 1");
  }
}

void check_not_other_format(const std::string& path, const detail::ByteSource& file) {
  const detail::FileKind kind = detail::sniff(file);
  DKIT_CHECK(kind != detail::FileKind::kZip, path, ": not a safetensors file: it looks like a torch.save zip "
             "archive (dkit picks a file's format by its extension: name it .pt)");
  DKIT_CHECK(kind != detail::FileKind::kPickle, path, ": not a safetensors file: it looks like a pickle, as "
             "torch.save before PyTorch 1.6 wrote (dkit picks a file's format by its extension: name it .pt)");
}

// A whole file mapped read-only, unmapped when the last tensor viewing it goes.
std::shared_ptr<const char> map_file(const std::string& path, uint64_t expected_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DKIT_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
  struct stat info {};
  const bool sized = ::fstat(fd, &info) == 0;
  const int stat_error = errno;
  void* map = sized && static_cast<uint64_t>(info.st_size) == expected_size
                  ? ::mmap(nullptr, expected_size, PROT_READ, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
  const int map_error = errno;
  ::close(fd);
  DKIT_CHECK(sized, "cannot read ", path, ": ", std::strerror(stat_error));
  DKIT_CHECK(static_cast<uint64_t>(info.st_size) == expected_size, path, " changed while being read: it was ",
             expected_size, " bytes, now ", info.st_size);
  DKIT_CHECK(map != MAP_FAILED, "cannot map ", path, ": ", std::strerror(map_error));
  return std::shared_ptr<const char>(static_cast<const char*>(map), [expected_size](const char* p) {
    ::munmap(const_cast<char*>(p), expected_size);
  });
}

SafetensorsFile read_source(const detail::ByteSource& file, const std::string& path, const ReadOptions& options,
                            bool map = false) {
  const ReadLimits& limits = options.limits();
  const c10::Device device = options.map_location();
  const uint64_t size = file.size();
  DKIT_CHECK(size > 0, path, ": the file is empty");
  DKIT_CHECK(size <= static_cast<uint64_t>(limits.max_file_bytes()), path, ": the file is ", size,
             " bytes, more than the limit of ", limits.max_file_bytes(), " (max_file_bytes)");
  check_not_other_format(path, file);
  DKIT_CHECK(size >= 8, path, ": the file is ", size,
             " bytes, too short for a safetensors file, which starts with an 8-byte header length");
  unsigned char length[8];
  DKIT_CHECK(file.read_exact(0, length, sizeof(length)), path, ": cannot read the header length");
  uint64_t header_bytes = 0;
  for (size_t i = 0; i < sizeof(length); ++i) {
    header_bytes |= static_cast<uint64_t>(length[i]) << (8 * i);
  }
  if (header_bytes > size - 8 && size > 8) {
    char first = '\0';
    DKIT_CHECK(file.read_exact(8, &first, 1) && first == '{', path,
               ": not a safetensors file: it does not start with an 8-byte header length and a JSON object");
  }
  DKIT_CHECK(header_bytes <= size - 8, path, ": the header length is ", header_bytes, " bytes but only ", size - 8,
             " bytes follow it (the file may have been cut short)");
  DKIT_CHECK(header_bytes <= static_cast<uint64_t>(limits.max_header_bytes()), path, ": the header is ",
             header_bytes, " bytes, more than the limit of ", limits.max_header_bytes(), " (max_header_bytes)");
  std::string text(header_bytes, '\0');
  DKIT_CHECK(file.read_exact(8, text.data(), text.size()), path, ": cannot read the header");
  DKIT_CHECK(!text.empty() && text[0] == '{', path,
             ": the header does not start with '{': a safetensors header is a JSON object");
  const Json header = parse_header(path, text, limits);
  text = std::string();

  SafetensorsFile result;
  const int64_t count = static_cast<int64_t>(header.size()) - (header.contains(kMetadataKey) ? 1 : 0);
  DKIT_CHECK(count <= limits.max_records(), path, ": the header lists ", count, " tensors, more than the limit of ",
             limits.max_records(), " (max_records)");
  std::vector<Entry> entries;
  entries.reserve(static_cast<size_t>(count));
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      result.metadata = read_metadata(path, value);
    } else {
      entries.push_back(read_entry(path, name, value));
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  const uint64_t data_start = 8 + header_bytes;
  check_layout(path, entries, size - data_start, limits);

  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return natural_less(a.name, b.name); });
  result.tensors = StateDict("state dict key");
  if (map) {
    const std::shared_ptr<const char> mapped = map_file(path, size);
    for (const Entry& entry : entries) {
      void* data = const_cast<char*>(mapped.get() + data_start + entry.begin);
      result.tensors.insert(entry.name, torch::from_blob(data, entry.shape, [mapped](void*) {},
                                                         at::TensorOptions().dtype(entry.dtype)));
    }
    return result;
  }
  for (const Entry& entry : entries) {
    at::Tensor tensor = at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype));
    DKIT_CHECK(file.read_exact(data_start + entry.begin, tensor.data_ptr(), static_cast<size_t>(entry.bytes)), path,
               ": the file ended while reading tensor '", entry.name, "' (did it change while being read?)");
    if (entry.dtype == c10::kBool) {
      check_bools(path, entry, tensor);
    }
    result.tensors.insert(entry.name, device.is_cpu() ? tensor : tensor.to(device));
  }
  return result;
}

std::string header_text(const std::string& what, const std::string& text, const std::string& path) {
  try {
    return Json(text).dump();
  } catch (const Json::type_error&) {
    throw Error(detail::concat("cannot write ", path, ": ", what, " is not valid UTF-8"));
  }
}

} // namespace

SafetensorsFile read_safetensors(const std::string& path, const ReadOptions& options) {
  detail::check_map_location(path, options.map_location());
  return read_source(detail::FileSource(path), path, options);
}

SafetensorsFile map_safetensors(const std::string& path, const ReadOptions& options) {
  DKIT_CHECK(options.map_location().is_cpu(), path, ": a mapped safetensors file stays on the CPU, not ",
             options.map_location().str());
  return read_source(detail::FileSource(path), path, options, /*map=*/true);
}

SafetensorsFile read_safetensors_bytes(std::string_view data, const std::string& source, const ReadOptions& options) {
  detail::check_map_location(source, options.map_location());
  return read_source(detail::MemorySource(data), source, options);
}

void write_safetensors(const std::string& path, const StateDict& tensors, const SafetensorsMetadata& metadata) {
  struct Item {
    const std::string* name;
    at::Tensor tensor;
    size_t rank;
    uint64_t bytes;
  };
  std::vector<Item> items;
  items.reserve(tensors.size());
  for (const auto& item : tensors) {
    const std::string& name = item.key();
    const at::Tensor& tensor = item.value();
    DKIT_CHECK(name != kMetadataKey, "cannot write ", path, ": no tensor can be named '", kMetadataKey,
               "', the key safetensors keeps for the metadata");
    DKIT_CHECK(tensor.defined(), "cannot write ", path, ": tensor '", name, "' is undefined");
    const auto found = std::find_if(kSafetensorsDtypes.begin(), kSafetensorsDtypes.end(),
                                    [&](const auto& dtype) { return dtype.value == tensor.scalar_type(); });
    DKIT_CHECK(found != kSafetensorsDtypes.end(), "cannot write ", path, ": tensor '", name, "' is ",
               dtype_name(tensor.scalar_type()), ", which dkit does not write to safetensors (it writes ",
               readable_dtypes(), ")");
    items.push_back({&name, tensor.detach(), static_cast<size_t>(found - kSafetensorsDtypes.begin()),
                     static_cast<uint64_t>(tensor.numel()) * tensor.element_size()});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.rank != b.rank ? a.rank < b.rank : *a.name < *b.name;
  });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      header += (header.back() == '{' ? "" : ",") + header_text("metadata key '" + key + "'", key, path) + ":" +
                header_text("metadata '" + key + "'", value, path);
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const Item& item : items) {
    header += (header.size() == 1 ? "" : ",") + header_text("tensor name '" + *item.name + "'", *item.name, path) +
              ":" +
              nlohmann::ordered_json::object({{"dtype", name_of(kSafetensorsDtypes, item.tensor.scalar_type())},
                            {"shape", item.tensor.sizes().vec()},
                            {"data_offsets", {offset, offset + item.bytes}}})
                  .dump();
    offset += item.bytes;
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  DKIT_CHECK(header.size() <= kFormatMaxHeaderBytes, "cannot write ", path, ": its header would be ", header.size(),
             " bytes, more than the ", kFormatMaxHeaderBytes, " that safetensors readers accept");

  detail::AtomicFile file(path);
  unsigned char length[8];
  for (size_t i = 0; i < sizeof(length); ++i) {
    length[i] = static_cast<unsigned char>((header.size() >> (8 * i)) & 0xff);
  }
  file.write(length, sizeof(length));
  file.write(header.data(), header.size());
  for (const Item& item : items) {
    if (item.bytes == 0) {
      continue;
    }
    const at::Tensor data = item.tensor.to(at::kCPU).contiguous();
    file.write(data.data_ptr(), static_cast<size_t>(item.bytes));
  }
  file.commit();
}

bool is_safetensors_path(const std::string& path) {
  constexpr std::string_view kExtension = ".safetensors";
  if (path.size() < kExtension.size()) {
    return false;
  }
  return std::equal(kExtension.begin(), kExtension.end(), path.end() - static_cast<std::ptrdiff_t>(kExtension.size()),
                    [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); });
}

} // namespace dkit
