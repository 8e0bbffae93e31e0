#include <dkit/metrics/event_file.h>

#include <dkit/core/error.h>

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dkit {
namespace {

// The reflected Castagnoli polynomial 0x1EDC6F41.
constexpr uint32_t kCastagnoli = 0x82F63B78u;
constexpr uint32_t kMaskDelta = 0xa282ead8u;
constexpr const char* kFileVersion = "brain.Event:2";
constexpr size_t kHeaderBytes = 12;
constexpr size_t kFooterBytes = 4;

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ ((crc & 1u) != 0 ? kCastagnoli : 0u);
    }
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

// Protobuf wire types.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Event (tensorboard/compat/proto/event.proto), Summary and Summary.Value (summary.proto), SessionLog.
enum EventField : uint32_t { kWallTime = 1, kStep = 2, kFileVersionField = 3, kSummary = 5, kSessionLog = 7 };
enum SummaryField : uint32_t { kValue = 1 };
enum ValueField : uint32_t { kTag = 1, kSimpleValue = 2 };
enum SessionLogField : uint32_t { kStatus = 1 };
constexpr uint64_t kSessionStart = 1;

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
  }
}

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7fu) | 0x80u));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (uint64_t{field} << 3) | type);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// An Event's fields before the `what` it holds, as protobuf writes them: a field at its default is left out.
std::string event_head(double wall_time, int64_t step) {
  std::string out;
  uint64_t bits = 0;
  std::memcpy(&bits, &wall_time, sizeof(bits));
  if (bits != 0) {
    put_key(out, kWallTime, kFixed64);
    put_le(out, bits, 8);
  }
  if (step != 0) {
    put_key(out, kStep, kVarint);
    put_varint(out, static_cast<uint64_t>(step));
  }
  return out;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
    return "localhost";
  }
  return name;
}

uint64_t get_le(std::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    value |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  }
  return value;
}

// Decodes protobuf fields from `data`; a malformed field is an error that says what is wrong.
class FieldReader {
 public:
  explicit FieldReader(std::string_view data) : data_(data) {}

  bool done() const {
    return pos_ == data_.size();
  }

  // The next field's number and wire type.
  std::pair<uint32_t, uint32_t> key() {
    const uint64_t key = varint();
    DKIT_CHECK(key >> 3 != 0 && key >> 3 <= 0x1fffffff, "a field number of ", key >> 3);
    return {static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7u)};
  }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      DKIT_CHECK(pos_ < data_.size(), "a varint runs past the end");
      const auto byte = static_cast<uint8_t>(data_[pos_++]);
      value |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80u) == 0) {
        return value;
      }
    }
    throw Error("a varint longer than 10 bytes");
  }

  std::string_view fixed(size_t bytes) {
    DKIT_CHECK(data_.size() - pos_ >= bytes, "a ", bytes, "-byte field runs past the end");
    const std::string_view out = data_.substr(pos_, bytes);
    pos_ += bytes;
    return out;
  }

  std::string_view length_delimited() {
    const uint64_t length = varint();
    DKIT_CHECK(length <= data_.size() - pos_, "a field of ", length, " bytes runs past the end");
    return fixed(static_cast<size_t>(length));
  }

  void skip(uint32_t type) {
    switch (type) {
      case kVarint:
        varint();
        return;
      case kFixed64:
        fixed(8);
        return;
      case kLengthDelimited:
        length_delimited();
        return;
      case kFixed32:
        fixed(4);
        return;
      default:
        throw Error(detail::concat("wire type ", type, ", which no Event field has"));
    }
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

void expect_type(const char* field, uint32_t type, uint32_t expected) {
  DKIT_CHECK(type == expected, field, " has wire type ", type, " instead of ", expected);
}

void read_summary(std::string_view data, int64_t step, double wall_time, std::vector<ScalarEvent>& scalars) {
  FieldReader summary(data);
  while (!summary.done()) {
    const auto [field, type] = summary.key();
    if (field != kValue) {
      summary.skip(type);
      continue;
    }
    expect_type("Summary.value", type, kLengthDelimited);
    FieldReader value(summary.length_delimited());
    ScalarEvent scalar;
    scalar.step = step;
    scalar.wall_time = wall_time;
    bool simple = false;
    while (!value.done()) {
      const auto [value_field, value_type] = value.key();
      if (value_field == kTag) {
        expect_type("Summary.Value.tag", value_type, kLengthDelimited);
        scalar.tag = std::string(value.length_delimited());
      } else if (value_field == kSimpleValue) {
        expect_type("Summary.Value.simple_value", value_type, kFixed32);
        const auto bits = static_cast<uint32_t>(get_le(value.fixed(4)));
        std::memcpy(&scalar.value, &bits, sizeof(bits));
        simple = true;
      } else {
        value.skip(value_type);
      }
    }
    if (simple) {
      scalars.push_back(std::move(scalar));
    }
  }
}

bool is_session_start(std::string_view data) {
  FieldReader session(data);
  bool start = false;
  while (!session.done()) {
    const auto [field, type] = session.key();
    if (field == kStatus) {
      expect_type("SessionLog.status", type, kVarint);
      start = session.varint() == kSessionStart;
    } else {
      session.skip(type);
    }
  }
  return start;
}

// Decodes one Event into `contents`; the first record's file_version becomes the file's.
void read_event(std::string_view payload, bool first, EventFileContents& contents) {
  FieldReader event(payload);
  double wall_time = 0;
  int64_t step = 0;
  std::vector<std::string_view> summaries;
  bool start = false;
  while (!event.done()) {
    const auto [field, type] = event.key();
    switch (field) {
      case kWallTime: {
        expect_type("Event.wall_time", type, kFixed64);
        const uint64_t bits = get_le(event.fixed(8));
        std::memcpy(&wall_time, &bits, sizeof(bits));
        break;
      }
      case kStep:
        expect_type("Event.step", type, kVarint);
        step = static_cast<int64_t>(event.varint());
        break;
      case kFileVersionField:
        expect_type("Event.file_version", type, kLengthDelimited);
        if (first) {
          contents.file_version = std::string(event.length_delimited());
        } else {
          event.length_delimited();
        }
        break;
      case kSummary:
        expect_type("Event.summary", type, kLengthDelimited);
        summaries.push_back(event.length_delimited());
        break;
      case kSessionLog:
        expect_type("Event.session_log", type, kLengthDelimited);
        start = is_session_start(event.length_delimited());
        break;
      default:
        event.skip(type);
    }
  }
  for (const auto summary : summaries) {
    read_summary(summary, step, wall_time, contents.scalars);
  }
  if (start) {
    contents.restarts.push_back(step);
  }
}

} // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (const char c : data) {
    crc = kCrcTable[(crc ^ static_cast<uint8_t>(c)) & 0xffu] ^ (crc >> 8);
  }
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

void EventFileWriter::Close::operator()(std::FILE* file) const {
  std::fclose(file);
}

EventFileWriter::EventFileWriter(const std::string& folder) {
  const double wall_time = now_seconds();
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%010lld", static_cast<long long>(wall_time));
  const std::string base =
      (std::filesystem::path(folder) / (std::string("events.out.tfevents.") + seconds + "." + host_name())).string();
  for (int n = 0; !file_; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    file_.reset(std::fopen(path_.c_str(), "wbx"));
    DKIT_CHECK(file_ || (errno == EEXIST && n < 1000), "cannot create event file '", path_, "': ",
               std::strerror(errno));
  }
  std::string event = event_head(wall_time, 0);
  put_bytes(event, kFileVersionField, kFileVersion);
  write_record(event);
  flush();
}

EventFileWriter::~EventFileWriter() = default;
EventFileWriter::EventFileWriter(EventFileWriter&&) noexcept = default;
EventFileWriter& EventFileWriter::operator=(EventFileWriter&&) noexcept = default;

void EventFileWriter::add_scalar(const std::string& tag, float value, int64_t step, std::optional<double> wall_time) {
  std::string summary_value;
  put_bytes(summary_value, kTag, tag);
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  put_key(summary_value, kSimpleValue, kFixed32);
  put_le(summary_value, bits, 4);
  std::string summary;
  put_bytes(summary, kValue, summary_value);
  std::string event = event_head(wall_time.value_or(now_seconds()), step);
  put_bytes(event, kSummary, summary);
  write_record(event);
}

void EventFileWriter::add_restart(int64_t step, std::optional<double> wall_time) {
  std::string session_log;
  put_key(session_log, kStatus, kVarint);
  put_varint(session_log, kSessionStart);
  std::string event = event_head(wall_time.value_or(now_seconds()), step);
  put_bytes(event, kSessionLog, session_log);
  write_record(event);
}

void EventFileWriter::flush() {
  DKIT_CHECK(file_, "an EventFileWriter was used after it was moved from");
  DKIT_CHECK(std::fflush(file_.get()) == 0, "cannot write event file '", path_, "': ", std::strerror(errno));
}

void EventFileWriter::write_record(const std::string& payload) {
  DKIT_CHECK(file_, "an EventFileWriter was used after it was moved from");
  std::string record;
  record.reserve(kHeaderBytes + payload.size() + kFooterBytes);
  put_le(record, payload.size(), 8);
  put_le(record, masked_crc32c(record), 4);
  record += payload;
  put_le(record, masked_crc32c(payload), 4);
  DKIT_CHECK(std::fwrite(record.data(), 1, record.size(), file_.get()) == record.size(), "cannot write event file '",
             path_, "': ", std::strerror(errno));
}

EventFileContents read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DKIT_CHECK(in.good(), "cannot read event file '", path, "': ",
             std::filesystem::exists(path) ? "permission denied or not a file" : "no such file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string data = buffer.str();
  const std::string_view view(data);
  EventFileContents contents;
  for (size_t at = 0; at < view.size();) {
    const size_t left = view.size() - at;
    DKIT_CHECK(left >= kHeaderBytes, "event file '", path, "' is cut short: the record at byte ", at, " needs ",
               kHeaderBytes, " header bytes, ", left, " are left");
    const std::string_view length_bytes = view.substr(at, 8);
    DKIT_CHECK(masked_crc32c(length_bytes) == get_le(view.substr(at + 8, 4)), "event file '", path,
               "': the length of the record at byte ", at, " fails its CRC-32C check");
    const uint64_t length = get_le(length_bytes);
    const size_t room = left - kHeaderBytes;
    DKIT_CHECK(room >= kFooterBytes && length <= room - kFooterBytes, "event file '", path,
               "' is cut short: the record at byte ", at, " needs ", length + kHeaderBytes + kFooterBytes, " bytes, ",
               left, " are left");
    const std::string_view payload = view.substr(at + kHeaderBytes, static_cast<size_t>(length));
    DKIT_CHECK(masked_crc32c(payload) == get_le(view.substr(at + kHeaderBytes + payload.size(), kFooterBytes)),
               "event file '", path, "': the data of the record at byte ", at, " fails its CRC-32C check");
    try {
      read_event(payload, contents.records == 0, contents);
    } catch (const Error& e) {
      throw Error(detail::concat("event file '", path, "': the record at byte ", at, " is no valid Event: ",
                                 e.what()));
    }
    ++contents.records;
    at += kHeaderBytes + payload.size() + kFooterBytes;
  }
  return contents;
}

} // namespace dkit
