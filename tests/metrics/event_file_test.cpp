#include <dkit/metrics/event_file.h>

#include "../support.h"
#include "event_file_oracle.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <regex>
#include <string>

namespace dkit {
namespace {

using test::error_message;
using test::write_bytes;
namespace fs = std::filesystem;

std::string bytes_of(std::initializer_list<int> values) {
  std::string out;
  for (const int value : values) {
    out.push_back(static_cast<char>(value));
  }
  return out;
}

std::string little_endian(uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xffu));
  }
  return out;
}

// A TFRecord around `payload`, framed as TensorBoard's record_writer.py frames it.
std::string record(const std::string& payload) {
  const std::string length = little_endian(payload.size(), 8);
  return length + little_endian(masked_crc32c(length), 4) + payload + little_endian(masked_crc32c(payload), 4);
}

class EventFileTest : public test::SeedingFixture {
 protected:
  // A file of the writer's first record and one scalar; the second record starts at second_record_.
  std::string written_file() {
    EventFileWriter events(tmp_.path().string());
    events.add_scalar("train/loss", 0.5f, 10, 1700000000.5);
    events.flush();
    const std::string bytes = test::read_file(events.path());
    uint64_t first_length = 0;
    for (int i = 7; i >= 0; --i) {
      first_length = (first_length << 8) | static_cast<uint8_t>(bytes[i]);
    }
    second_record_ = 12 + first_length + 4;
    fs::remove(events.path());
    return bytes;
  }

  // Writes `bytes` to a file of its own and returns the error reading it.
  std::string read_error(const std::string& bytes) {
    write_bytes(path_, bytes);
    return error_message([&] { read_event_file(path_); });
  }

  test::TempDir tmp_;
  std::string path_ = tmp_.file("damaged.tfevents");
  size_t second_record_ = 0;
};

TEST_F(EventFileTest, Crc32cMatchesPublishedVectors) {
  // RFC 3720 (iSCSI), appendix B.4, and the check value of the CRC-32C catalogue entry.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  std::string descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  const std::string read_pdu = bytes_of({0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0,    0, 0, 0, 0, 0,
                                         0x14, 0,    0, 0, 0, 0, 4, 0, 0, 0, 0,    0x14, 0, 0, 0, 0x18,
                                         0x28, 0,    0, 0, 0, 0, 0, 0, 2, 0, 0,    0, 0, 0, 0, 0});
  ASSERT_EQ(read_pdu.size(), 48u);
  EXPECT_EQ(crc32c(read_pdu), 0xD9963A56u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST_F(EventFileTest, Crc32cContinuesAcrossPieces) {
  EXPECT_EQ(crc32c("56789", crc32c("1234")), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0xE3069283u), 0xE3069283u);
}

TEST_F(EventFileTest, MaskedCrcIsTheCrcRotatedRightBy15PlusTheDelta) {
  // The formula of TensorFlow's crc32c.h and TensorBoard's masked_crc32c, on the published check value.
  constexpr uint32_t kCheck = 0xE3069283u;
  constexpr uint32_t kMasked = ((kCheck >> 15) | (kCheck << 17)) + 0xa282ead8u;
  EXPECT_EQ(masked_crc32c("123456789"), kMasked);
  EXPECT_NE(masked_crc32c("123456789"), crc32c("123456789"));
}

TEST_F(EventFileTest, WriterNamesTheFileAsTensorBoardDoesAndStartsWithTheFileVersion) {
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const EventFileWriter events(tmp_.path().string());
  const fs::path path = events.path();
  EXPECT_EQ(path.parent_path(), tmp_.path());
  EXPECT_TRUE(std::regex_match(path.filename().string(), std::regex("events\\.out\\.tfevents\\.[0-9]{10}\\.(.*)")));
  EXPECT_EQ(path.filename().string().substr(31), host);
  const EventFileContents contents = read_event_file(events.path());
  EXPECT_EQ(contents.records, 1);
  EXPECT_EQ(contents.file_version, "brain.Event:2");
  EXPECT_TRUE(contents.scalars.empty());
  EXPECT_TRUE(contents.restarts.empty());
}

TEST_F(EventFileTest, SecondWriterInTheSameFolderNeverOverwritesTheFirst) {
  EventFileWriter first(tmp_.path().string());
  first.add_scalar("a", 1.0f, 1, 1.0);
  first.flush();
  const EventFileWriter second(tmp_.path().string());
  ASSERT_NE(second.path(), first.path());
  if (second.path().compare(0, first.path().size(), first.path()) == 0) {
    EXPECT_EQ(second.path(), first.path() + ".1") << "the same second: the first free suffix";
  }
  EXPECT_EQ(read_event_file(first.path()).scalars.size(), 1u);
  EXPECT_EQ(read_event_file(second.path()).records, 1);
}

TEST_F(EventFileTest, ScalarsAndRestartsRoundTrip) {
  EventFileWriter events(tmp_.path().string());
  const float kInf = std::numeric_limits<float>::infinity();
  const std::vector<ScalarEvent> written = {{"train/loss", 2.3025851f, 1, 1700000000.125},
                                            {"train/lr", 1e-8f, 0, 1700000000.25},
                                            {"val/accuracy", -0.0f, int64_t{1} << 40, 0.0},
                                            {"x", kInf, 7, 1.5},
                                            {"y", std::nanf(""), 8, 2.5},
                                            {"", 3.0f, -2, 3.5}};
  for (const auto& scalar : written) {
    events.add_scalar(scalar.tag, scalar.value, scalar.step, scalar.wall_time);
  }
  events.add_restart(5, 4.0);
  events.flush();
  const EventFileContents contents = read_event_file(events.path());
  EXPECT_EQ(contents.file_version, "brain.Event:2");
  EXPECT_EQ(contents.records, 1 + 6 + 1);
  ASSERT_EQ(contents.scalars.size(), written.size());
  for (size_t i = 0; i < written.size(); ++i) {
    EXPECT_TRUE(test::same_scalar(contents.scalars[i], written[i])) << i << ": " << contents.scalars[i].tag;
  }
  EXPECT_TRUE(std::signbit(contents.scalars[2].value));
  EXPECT_EQ(contents.restarts, std::vector<int64_t>{5});
}

TEST_F(EventFileTest, AMovedWriterWritesOnToTheSameFile) {
  EventFileWriter first(tmp_.path().string());
  const std::string path = first.path();
  EventFileWriter second(std::move(first));
  EXPECT_EQ(second.path(), path);
  second.add_scalar("a", 2.0f, 3, 1.0);
  second.flush();
  EXPECT_EQ(read_event_file(path).scalars.size(), 1u);
  EXPECT_EQ(error_message([&] { first.add_scalar("a", 1.0f, 1); }),  // NOLINT(bugprone-use-after-move)
            "an EventFileWriter was used after it was moved from");
}

TEST_F(EventFileTest, WallTimeDefaultsToNow) {
  const double before = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EventFileWriter events(tmp_.path().string());
  events.add_scalar("a", 1.0f, 1);
  events.flush();
  const double after = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const auto scalars = read_event_file(events.path()).scalars;
  ASSERT_EQ(scalars.size(), 1u);
  EXPECT_GE(scalars[0].wall_time, before);
  EXPECT_LE(scalars[0].wall_time, after);
}

TEST_F(EventFileTest, ReaderRejectsAFlippedBitInTheLength) {
  std::string bytes = written_file();
  bytes[second_record_] ^= 0x01;
  EXPECT_EQ(read_error(bytes), "event file '" + path_ + "': the length of the record at byte " +
                                   std::to_string(second_record_) + " fails its CRC-32C check");
}

TEST_F(EventFileTest, ReaderRejectsAFlippedBitInTheLengthCrc) {
  std::string bytes = written_file();
  bytes[second_record_ + 9] ^= 0x40;
  EXPECT_EQ(read_error(bytes), "event file '" + path_ + "': the length of the record at byte " +
                                   std::to_string(second_record_) + " fails its CRC-32C check");
}

TEST_F(EventFileTest, ReaderRejectsAFlippedBitInTheData) {
  std::string bytes = written_file();
  bytes[second_record_ + 12 + 3] ^= 0x04;
  EXPECT_EQ(read_error(bytes), "event file '" + path_ + "': the data of the record at byte " +
                                   std::to_string(second_record_) + " fails its CRC-32C check");
}

TEST_F(EventFileTest, ReaderRejectsAFlippedBitInTheDataCrc) {
  std::string bytes = written_file();
  bytes[bytes.size() - 1] ^= 0x80;
  EXPECT_EQ(read_error(bytes), "event file '" + path_ + "': the data of the record at byte " +
                                   std::to_string(second_record_) + " fails its CRC-32C check");
}

TEST_F(EventFileTest, ReaderRejectsATruncatedRecord) {
  const std::string bytes = written_file();
  const std::string cut = bytes.substr(0, bytes.size() - 1);
  EXPECT_EQ(read_error(cut), "event file '" + path_ + "' is cut short: the record at byte " +
                                 std::to_string(second_record_) + " needs " +
                                 std::to_string(bytes.size() - second_record_) + " bytes, " +
                                 std::to_string(cut.size() - second_record_) + " are left");
  EXPECT_EQ(read_error(bytes.substr(0, second_record_ + 5)),
            "event file '" + path_ + "' is cut short: the record at byte " + std::to_string(second_record_) +
                " needs 12 header bytes, 5 are left");
}

TEST_F(EventFileTest, ReaderRejectsARecordThatIsNoEvent) {
  // Both CRCs hold, but the summary (field 5) claims 9 bytes where 2 follow.
  const std::string prefix = "event file '" + path_ + "': the record at byte 0 is no valid Event: ";
  EXPECT_EQ(read_error(record(bytes_of({0x2a, 0x09, 'a', 'b'}))), prefix + "a field of 9 bytes runs past the end");
  // The step (field 2) with the wire type of a string.
  EXPECT_EQ(read_error(record(bytes_of({0x12, 0x00}))), prefix + "Event.step has wire type 2 instead of 0");
}

TEST_F(EventFileTest, ReaderSkipsFieldsItDoesNotKnow) {
  // wall_time, step 3, source_metadata (10) with a writer, then a summary whose value has plugin metadata (9) and a
  // simple_value, and a value holding a tensor (8) that is no scalar.
  const std::string value =
      bytes_of({0x0a, 0x01, 'v', 0x4a, 0x03, 0x0a, 0x01, 's', 0x15}) + little_endian(0x3f000000, 4);
  const std::string tensor = bytes_of({0x0a, 0x01, 't', 0x42, 0x02, 0x08, 0x01});
  const std::string summary = bytes_of({0x0a, static_cast<int>(value.size())}) + value +
                              bytes_of({0x0a, static_cast<int>(tensor.size())}) + tensor;
  const std::string event = bytes_of({0x09}) + little_endian(0x3ff0000000000000, 8) + bytes_of({0x10, 0x03}) +
                            bytes_of({0x52, 0x03, 0x0a, 0x01, 'w', 0x2a, static_cast<int>(summary.size())}) + summary;
  write_bytes(path_, record(event));
  const EventFileContents contents = read_event_file(path_);
  EXPECT_EQ(contents.records, 1);
  EXPECT_EQ(contents.file_version, "");
  ASSERT_EQ(contents.scalars.size(), 1u);
  EXPECT_TRUE(test::same_scalar(contents.scalars[0], ScalarEvent{"v", 0.5f, 3, 1.0}));
}

TEST_F(EventFileTest, MissingFilesAndFoldersAreNamed) {
  EXPECT_EQ(error_message([&] { read_event_file(tmp_.file("none")); }),
            "cannot read event file '" + tmp_.file("none") + "': no such file");
  const std::string message = error_message([&] { EventFileWriter(tmp_.file("missing")); });
  EXPECT_EQ(message.rfind("cannot create event file '" + tmp_.file("missing") + "/events.out.tfevents.", 0), 0u)
      << message;
  const std::string tail = "': No such file or directory";
  EXPECT_EQ(message.substr(message.size() - std::min(message.size(), tail.size())), tail) << message;
}

TEST_F(EventFileTest, PythonProtobufReadsWhatTheWriterWrote) {
  DKIT_SKIP_WITHOUT_EVENT_ORACLE();
  EventFileWriter events(tmp_.path().string());
  events.add_scalar("train/loss", 0.693147f, 50, 1700000000.75);
  events.add_scalar("train/samples_per_second", 123456.789f, int64_t{1} << 35, 1700000001.0);
  events.add_scalar("val/accuracy", 0.0f, 60, 1700000002.0);
  events.add_restart(51, 1700000003.0);
  events.flush();
  const EventFileContents mine = read_event_file(events.path());
  const test::OracleReading theirs = test::read_with_python(tmp_.file("oracle.py"), events.path());
  EXPECT_EQ(theirs.differing_records, 0) << "a record is not the bytes protobuf serializes for it";
  EXPECT_EQ(theirs.contents.records, mine.records);
  EXPECT_EQ(theirs.contents.file_version, "brain.Event:2");
  EXPECT_EQ(theirs.contents.restarts, std::vector<int64_t>{51});
  ASSERT_EQ(theirs.contents.scalars.size(), 3u);
  ASSERT_EQ(mine.scalars.size(), 3u);
  for (size_t i = 0; i < mine.scalars.size(); ++i) {
    EXPECT_TRUE(test::same_scalar(theirs.contents.scalars[i], mine.scalars[i])) << i;
  }
  EXPECT_EQ(theirs.contents.scalars[1].value, 123456.789f);
  EXPECT_EQ(theirs.contents.scalars[1].step, int64_t{1} << 35);
}

TEST_F(EventFileTest, ReaderReadsWhatPythonProtobufWrote) {
  DKIT_SKIP_WITHOUT_EVENT_ORACLE();
  const std::string path = tmp_.file("events.out.tfevents.1700000000.python");
  test::write_with_python(tmp_.file("oracle.py"), path);
  const EventFileContents contents = read_event_file(path);
  EXPECT_EQ(contents.records, 4);
  EXPECT_EQ(contents.file_version, "brain.Event:2");
  const int64_t late = (int64_t{1} << 40) + 3;
  EXPECT_EQ(contents.restarts, std::vector<int64_t>{late});
  ASSERT_EQ(contents.scalars.size(), 3u) << "the tensor value is no scalar";
  EXPECT_TRUE(test::same_scalar(contents.scalars[0], ScalarEvent{"a/first", 0.125f, 7, 1700000001.5}));
  EXPECT_TRUE(test::same_scalar(contents.scalars[1], ScalarEvent{"a/second", -2.5f, 7, 1700000001.5}));
  EXPECT_TRUE(test::same_scalar(contents.scalars[2],
                                ScalarEvent{"b", std::numeric_limits<float>::infinity(), late, 1700000003.0}));
}

} // namespace
} // namespace dkit
