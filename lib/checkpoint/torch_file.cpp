#include <dkit/checkpoint/torch_file.h>

#include <dkit/checkpoint/detail/file_io.h>
#include <dkit/core/error.h>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/versions.h>
#include <torch/torch.h>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string_view>

namespace dkit {
namespace {

using detail::AtomicFile;
using detail::ByteSource;
using detail::FileKind;
using detail::FileSource;
using detail::MemorySource;

// The first bytes of PyTorch's legacy format: pickle protocol 2, then LONG1 of the magic number
// 0x1950a86a20f9469cfc6c.
constexpr unsigned char kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                          0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

struct ZipRecord {
  uint64_t compressed = 0;
  uint64_t size = 0;
  uint64_t data = 0;
  uint16_t method = 0;
};

uint64_t le(const unsigned char* p, size_t n) {
  uint64_t value = 0;
  for (size_t i = 0; i < n; ++i) {
    value |= static_cast<uint64_t>(p[i]) << (8 * i);
  }
  return value;
}

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

// LibTorch's zip reader (miniz) finds records by name ignoring ASCII case; dkit's lookups do the same.
std::string lower(std::string text) {
  for (char& c : text) {
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
  }
  return text;
}

void check_file_kind(const std::string& path, const ByteSource& file) {
  DKIT_CHECK(file.size() > 0, path, ": the file is empty");
  unsigned char head[sizeof(kLegacyMagic)] = {};
  const size_t n = std::min<uint64_t>(file.size(), sizeof(head));
  file.read_exact(0, head, n);
  DKIT_CHECK(n < sizeof(kLegacyMagic) || std::memcmp(head, kLegacyMagic, sizeof(kLegacyMagic)) != 0, path,
             ": this file uses PyTorch's legacy serialization format (torch.save before PyTorch 1.6, or with "
             "_use_new_zipfile_serialization=False), which dkit does not read; re-save it with a recent PyTorch: "
             "torch.save(torch.load('", path, "'), 'new.pt')");
  DKIT_CHECK(n < 8 || std::memcmp(head, "PYTORCH1", 8) != 0, path,
             ": this file uses the archive format of PyTorch's 1.0 preview, which dkit does not read; re-save it "
             "with a recent PyTorch");
  if (n >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) {
    return;
  }
  DKIT_CHECK(detail::sniff(file) != FileKind::kSafetensors, path,
             ": not a torch.save file: it looks like a safetensors file (dkit picks a file's format by its extension: "
             "name it .safetensors)");
  DKIT_CHECK(head[0] != 0x80, path,
             ": this is a plain pickle, not a torch.save archive; load it in Python and save it with torch.save");
  std::string start;
  for (size_t i = 0; i < std::min<size_t>(n, 4); ++i) {
    char hex[4];
    std::snprintf(hex, sizeof(hex), "%s%02x", i == 0 ? "" : " ", head[i]);
    start += hex;
  }
  throw Error(detail::concat(path, ": not a PyTorch file: it starts with bytes ", start,
                             ", neither a torch.save zip archive nor PyTorch's legacy format"));
}

// Reads the zip's central directory with dkit's own code, so that every record's claimed size is checked against
// the file and the limits before LibTorch's reader allocates memory for it.
std::map<std::string, ZipRecord> read_central_directory(const std::string& path, const ByteSource& file,
                                                        const ReadLimits& limits) {
  const std::string corrupt = path + ": truncated or corrupt zip archive: ";
  const uint64_t size = file.size();
  const uint64_t tail_size = std::min<uint64_t>(size, 22 + 65535);
  std::vector<unsigned char> tail(tail_size);
  DKIT_CHECK(file.read_exact(size - tail_size, tail.data(), tail_size), corrupt, "cannot read its end");
  int64_t eocd = -1;
  for (int64_t i = static_cast<int64_t>(tail_size) - 22; i >= 0; --i) {
    if (le(&tail[static_cast<size_t>(i)], 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  DKIT_CHECK(eocd >= 0, corrupt, "no end of central directory record (the file may have been cut short)");
  const unsigned char* end = &tail[static_cast<size_t>(eocd)];
  uint64_t count = le(end + 10, 2);
  uint64_t directory_size = le(end + 12, 4);
  uint64_t directory_offset = le(end + 16, 4);
  const uint64_t eocd_offset = size - tail_size + static_cast<uint64_t>(eocd);
  unsigned char locator[20];
  if (eocd_offset >= 20 && file.read_exact(eocd_offset - 20, locator, 20) && le(locator, 4) == 0x07064b50) {
    unsigned char end64[56];
    DKIT_CHECK(file.read_exact(le(locator + 8, 8), end64, 56) && le(end64, 4) == 0x06064b50, corrupt,
               "bad zip64 end of central directory record");
    count = le(end64 + 32, 8);
    directory_size = le(end64 + 40, 8);
    directory_offset = le(end64 + 48, 8);
  }
  DKIT_CHECK(directory_offset <= size && directory_size <= size - directory_offset, corrupt,
             "its central directory lies outside the file");
  DKIT_CHECK(count <= static_cast<uint64_t>(limits.max_records()), path, ": the archive holds ", count,
             " records, more than the limit of ", limits.max_records(), " (max_records)");

  std::map<std::string, ZipRecord> records;
  std::set<std::string> names;
  uint64_t at = directory_offset;
  for (uint64_t i = 0; i < count; ++i) {
    unsigned char header[46];
    DKIT_CHECK(file.read_exact(at, header, sizeof(header)) && le(header, 4) == 0x02014b50, corrupt,
               "bad central directory entry ", i);
    const size_t name_length = le(header + 28, 2);
    const size_t extra_length = le(header + 30, 2);
    const size_t comment_length = le(header + 32, 2);
    std::vector<unsigned char> variable(name_length + extra_length);
    DKIT_CHECK(file.read_exact(at + 46, variable.data(), variable.size()), corrupt, "bad central directory entry ", i);
    std::string name(variable.begin(), variable.begin() + static_cast<std::ptrdiff_t>(name_length));
    ZipRecord record;
    record.method = static_cast<uint16_t>(le(header + 10, 2));
    record.compressed = le(header + 20, 4);
    record.size = le(header + 24, 4);
    uint64_t local = le(header + 42, 4);
    for (size_t x = name_length; x + 4 <= variable.size();) {
      const uint64_t id = le(&variable[x], 2);
      const size_t length = le(&variable[x + 2], 2);
      size_t field = x + 4;
      const size_t field_end = std::min(field + length, variable.size());
      if (id == 0x0001) {
        for (uint64_t* value : {&record.size, &record.compressed, &local}) {
          if (*value == 0xffffffffu && field + 8 <= field_end) {
            *value = le(&variable[field], 8);
            field += 8;
          }
        }
      }
      x = field_end;
    }
    unsigned char local_header[30];
    DKIT_CHECK(file.read_exact(local, local_header, sizeof(local_header)) && le(local_header, 4) == 0x04034b50, corrupt,
               "record '", name, "' has no local header");
    const uint64_t data = local + 30 + le(local_header + 26, 2) + le(local_header + 28, 2);
    DKIT_CHECK(data <= size && record.compressed <= size - data, corrupt, "record '", name,
               "' reaches past the end of the file (the file may have been cut short)");
    DKIT_CHECK(record.method == 0 || record.method == 8, path, ": record '", name,
               "' uses zip compression method ", record.method, " (only stored and deflated records are read)");
    DKIT_CHECK(record.method != 0 || record.size == record.compressed, corrupt, "record '", name, "' claims ",
               record.size, " bytes but stores ", record.compressed);
    const bool inflatable = record.size / 1032 <= record.compressed && (record.compressed > 0 || record.size == 0);
    DKIT_CHECK(record.method != 8 || inflatable, corrupt, "record '", name, "' claims ", record.size,
               " bytes, more than ", record.compressed, " compressed bytes can hold");
    // miniz, LibTorch's zip reader, hands back a folder entry's bytes without writing them (uninitialized
    // memory) and refuses encrypted and patch records only after PyTorchStreamReader's constructor has begun.
    const bool folder = (!name.empty() && name.back() == '/') || (le(header + 38, 4) & 0x10) != 0;
    DKIT_CHECK(!folder, corrupt, "record '", name, "' is a folder entry, which torch.save never writes");
    DKIT_CHECK((le(header + 8, 2) & 0x61) == 0, path, ": record '", name,
               "' is encrypted or a patch, which torch.save never writes");
    DKIT_CHECK(record.size <= static_cast<uint64_t>(limits.max_record_bytes()), path, ": record '", name, "' is ",
               record.size, " bytes, more than the limit of ", limits.max_record_bytes(), " (max_record_bytes)");
    DKIT_CHECK(names.insert(lower(name)).second, corrupt, "record '", name,
               "' appears twice (record names are compared ignoring case)");
    record.data = data;
    records.emplace(std::move(name), record);
    at += 46 + name_length + extra_length + comment_length;
  }
  return records;
}

// The archive's format version, read and checked as PyTorchStreamReader's constructor reads and checks it,
// before that constructor runs: in LibTorch 1.13 it leaks its zip reader's memory when it throws.
int64_t read_version(const std::string& path, const ByteSource& file, const ZipRecord& record) {
  constexpr uint64_t kMaxVersionBytes = 64;
  DKIT_CHECK(record.size <= kMaxVersionBytes, path, ": the archive's version record is ", record.size,
             " bytes, not a format version");
  std::string text(record.size, '\0');
  if (record.method == 0) {
    DKIT_CHECK(file.read_exact(record.data, text.data(), text.size()), path,
               ": truncated or corrupt zip archive: cannot read its version record");
  } else {
    std::vector<unsigned char> packed(record.compressed);
    DKIT_CHECK(file.read_exact(record.data, packed.data(), packed.size()), path,
               ": truncated or corrupt zip archive: cannot read its version record");
    z_stream stream{};
    DKIT_CHECK(inflateInit2(&stream, -MAX_WBITS) == Z_OK, path, ": cannot inflate its version record");
    stream.next_in = packed.data();
    stream.avail_in = static_cast<uInt>(packed.size());
    stream.next_out = reinterpret_cast<Bytef*>(text.data());
    stream.avail_out = static_cast<uInt>(text.size());
    const int status = inflate(&stream, Z_FINISH);
    const bool whole = status == Z_STREAM_END && stream.avail_out == 0;
    inflateEnd(&stream);
    DKIT_CHECK(whole, path, ": truncated or corrupt zip archive: its version record does not inflate to ",
               record.size, " bytes");
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long version = std::strtoull(text.c_str(), &end, 10);
  const auto shown = first_line(text.substr(0, text.find('\0')));
  DKIT_CHECK(end != text.c_str() && errno == 0, path, ": the archive's version record holds '", shown,
             "', not a format version");
  DKIT_CHECK(version >= caffe2::serialize::kMinSupportedFileFormatVersion &&
                 version <= caffe2::serialize::kMaxSupportedFileFormatVersion,
             path, ": archive format version ", version, ", this LibTorch reads versions ",
             caffe2::serialize::kMinSupportedFileFormatVersion, " to ",
             caffe2::serialize::kMaxSupportedFileFormatVersion);
  return static_cast<int64_t>(version);
}

TorchFile read_archive(const std::shared_ptr<ByteSource>& source, const std::string& path,
                       const ReadOptions& options) {
  const auto& limits = options.limits();
  const c10::Device device = options.map_location();
  const ByteSource& file = *source;
  check_file_kind(path, file);
  DKIT_CHECK(file.size() <= static_cast<uint64_t>(limits.max_file_bytes()), path, ": the file is ", file.size(),
             " bytes, more than the limit of ", limits.max_file_bytes(), " (max_file_bytes)");
  const auto all = read_central_directory(path, file, limits);
  DKIT_CHECK(!all.empty(), path, ": the zip archive is empty: not a file written by torch.save");
  const std::string& first = all.begin()->first;
  const std::string archive = first.substr(0, first.find('/'));
  std::map<std::string, ZipRecord> records;
  for (const auto& [name, record] : all) {
    DKIT_CHECK(name.size() > archive.size() && name.compare(0, archive.size() + 1, archive + "/") == 0, path,
               ": not a file written by torch.save: its zip records are not all in one folder");
    records.emplace(lower(name.substr(archive.size() + 1)), record);
  }
  const bool torchscript = records.count("constants.pkl") != 0 ||
                           std::any_of(records.begin(), records.end(),
                                       [](const auto& r) { return r.first.rfind("code/", 0) == 0; });
  DKIT_CHECK(!torchscript, path,
             ": this is a TorchScript archive (torch.jit.save), not a torch.save file; save its weights in Python "
             "with torch.save(torch.jit.load('", path, "').state_dict(), 'weights.pt')");
  DKIT_CHECK(records.count("data.pkl") != 0, path, ": the zip archive has no data.pkl: not a file written by torch.save");
  DKIT_CHECK(records.count("version") != 0 || records.count(".data/version") != 0, path,
             ": the zip archive has no version record: not a file written by torch.save");
  DKIT_CHECK(records.at("data.pkl").size <= static_cast<uint64_t>(limits.max_pickle_bytes()), path,
             ": data.pkl is ", records.at("data.pkl").size, " bytes, more than the limit of ",
             limits.max_pickle_bytes(), " (max_pickle_bytes)");

  TorchFile result;
  result.archive = archive;
  result.version = read_version(path, file, records.count(".data/version") != 0 ? records.at(".data/version")
                                                                                 : records.at("version"));

  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  const auto get_record = [&](const std::string& name) {
    try {
      return reader->getRecord(name);
    } catch (const c10::Error& e) {
      throw Error(detail::concat(path, ": cannot read record '", name, "': ", first_line(e.what_without_backtrace())));
    }
  };
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(source);
  } catch (const c10::Error& e) {
    throw Error(detail::concat(path, ": corrupt zip archive: ", first_line(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    throw Error(detail::concat(path, ": corrupt zip archive: ", first_line(e.what())));
  }
  if (records.count("byteorder") != 0) {
    auto [data, size] = get_record("byteorder");
    const std::string order(static_cast<const char*>(data.get()), size);
    DKIT_CHECK(order == "little", path, ": the tensors were saved in '", order,
               "' byte order; dkit reads only little-endian files");
  }

  const StorageLoader load_storage = [&](const std::string& key, c10::ScalarType dtype, int64_t numel,
                                         const std::string& /*location*/) {
    const std::string name = "data/" + key;
    const auto found = records.find(lower(name));
    DKIT_CHECK(found != records.end(), path, ": the pickle refers to storage '", key, "' but the archive has no ",
               name, " record");
    uint64_t needed = 0;
    const bool overflow = __builtin_mul_overflow(static_cast<uint64_t>(numel), c10::elementSize(dtype), &needed);
    DKIT_CHECK(!overflow && found->second.size == needed, path, ": record ", name, " holds ", found->second.size,
               " bytes but the pickle says its storage is ", numel, " ", dtype_name(dtype), " values");
    auto [data, size] = get_record(name);
    DKIT_CHECK(size == needed, path, ": corrupt zip archive: record ", name, " reads as ", size,
               " bytes, its directory entry says ", needed);
    c10::Storage storage(c10::Storage::use_byte_size_t(), size, std::move(data), /*allocator=*/nullptr,
                         /*resizable=*/false);
    if (device.is_cpu()) {
      return storage;
    }
    auto whole = at::empty({0}, at::TensorOptions().dtype(dtype));
    whole.set_(storage, 0, {numel}, {1});
    return whole.to(device).storage();
  };

  auto [data, size] = get_record("data.pkl");
  result.root = unpickle(std::string_view(static_cast<const char*>(data.get()), size), load_storage, path, limits);
  return result;
}

} // namespace

TorchFile read_torch_file(const std::string& path, const ReadOptions& options) {
  detail::check_map_location(path, options.map_location());
  return read_archive(std::make_shared<FileSource>(path), path, options);
}

TorchFile read_torch_bytes(std::string_view data, const std::string& source, const ReadOptions& options) {
  detail::check_map_location(source, options.map_location());
  return read_archive(std::make_shared<MemorySource>(data), source, options);
}

void write_torch_file(const std::string& path, const PickleValue& root) {
  const Pickled pickled = pickle(root);
  AtomicFile file(path);
  {
    caffe2::serialize::PyTorchStreamWriter writer(
        [&file](const void* data, size_t n) { return file.write(data, n); });
    writer.writeRecord("data.pkl", pickled.data.data(), pickled.data.size());
    writer.writeRecord("byteorder", "little", 6);
    for (size_t i = 0; i < pickled.storages.size(); ++i) {
      const at::Tensor storage = pickled.storages[i].cpu();
      writer.writeRecord("data/" + std::to_string(i), storage.data_ptr(), storage.nbytes());
    }
    writer.writeEndOfFile();
  }
  file.commit();
}

} // namespace dkit
