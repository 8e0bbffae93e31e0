#pragma once

#include <dkit/metrics/event_file.h>

#include "../checkpoint/python.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace dkit::test {

/// Reads and writes event files with Python's protobuf (python3-protobuf) and crc32c (python3-crc32c) modules:
/// an oracle independent of dkit's hand-written encoder, decoder and CRC. The Event, Summary, Summary.Value,
/// SummaryMetadata, SessionLog and SourceMetadata messages are built at run time, with no protoc, from the field
/// numbers and types of TensorBoard's tensorboard/compat/proto/event.proto and summary.proto (a Value's `tensor`,
/// a TensorProto there, is kept as its bytes: the same wire format).
///   read PATH: checks both masked CRC-32Cs of every record, parses each Event, and prints one line per record,
///              `record OFFSET same|differs` (whether protobuf's own serialization of what it parsed is the same
///              bytes), then `file_version V`, `scalar STEP WALL_TIME VALUE TAG` per simple_value, or
///              `session_log STEP STATUS`.
///   write PATH: writes a file with protobuf's serializer, with fields dkit does not write (source_metadata, a
///              value's plugin metadata, a tensor value, several values in one summary).
inline constexpr const char* kEventFileOracle = R"(import struct, sys
try:
    import crc32c
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
except ImportError as error:
    print("missing module:", error)
    sys.exit(3)

F = descriptor_pb2.FieldDescriptorProto
proto = descriptor_pb2.FileDescriptorProto(name="dkit_event_oracle.proto", package="tensorboard", syntax="proto3")


def field(message, name, number, kind, type_name=None, repeated=False, oneof=None):
    added = message.field.add(name=name, number=number, type=kind,
                              label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
    if type_name:
        added.type_name = type_name
    if oneof is not None:
        added.oneof_index = oneof


source = proto.message_type.add(name="SourceMetadata")
field(source, "writer", 1, F.TYPE_STRING)
session = proto.message_type.add(name="SessionLog")
status = session.enum_type.add(name="SessionStatus")
for number, name in enumerate(["STATUS_UNSPECIFIED", "START", "STOP", "CHECKPOINT"]):
    status.value.add(name=name, number=number)
field(session, "status", 1, F.TYPE_ENUM, ".tensorboard.SessionLog.SessionStatus")
field(session, "checkpoint_path", 2, F.TYPE_STRING)
field(session, "msg", 3, F.TYPE_STRING)
metadata = proto.message_type.add(name="SummaryMetadata")
plugin = metadata.nested_type.add(name="PluginData")
field(plugin, "plugin_name", 1, F.TYPE_STRING)
field(plugin, "content", 2, F.TYPE_BYTES)
field(metadata, "plugin_data", 1, F.TYPE_MESSAGE, ".tensorboard.SummaryMetadata.PluginData")
field(metadata, "display_name", 2, F.TYPE_STRING)
field(metadata, "summary_description", 3, F.TYPE_STRING)
summary = proto.message_type.add(name="Summary")
value = summary.nested_type.add(name="Value")
value.oneof_decl.add(name="value")
field(value, "node_name", 7, F.TYPE_STRING)
field(value, "tag", 1, F.TYPE_STRING)
field(value, "metadata", 9, F.TYPE_MESSAGE, ".tensorboard.SummaryMetadata")
field(value, "simple_value", 2, F.TYPE_FLOAT, oneof=0)
field(value, "obsolete_old_style_histogram", 3, F.TYPE_BYTES, oneof=0)
field(value, "tensor", 8, F.TYPE_BYTES, oneof=0)
field(summary, "value", 1, F.TYPE_MESSAGE, ".tensorboard.Summary.Value", repeated=True)
event = proto.message_type.add(name="Event")
event.oneof_decl.add(name="what")
field(event, "wall_time", 1, F.TYPE_DOUBLE)
field(event, "step", 2, F.TYPE_INT64)
field(event, "file_version", 3, F.TYPE_STRING, oneof=0)
field(event, "graph_def", 4, F.TYPE_BYTES, oneof=0)
field(event, "summary", 5, F.TYPE_MESSAGE, ".tensorboard.Summary", oneof=0)
field(event, "session_log", 7, F.TYPE_MESSAGE, ".tensorboard.SessionLog", oneof=0)
field(event, "meta_graph_def", 9, F.TYPE_BYTES, oneof=0)
field(event, "source_metadata", 10, F.TYPE_MESSAGE, ".tensorboard.SourceMetadata")

pool = descriptor_pool.DescriptorPool()
pool.AddSerializedFile(proto.SerializeToString())


def message_class(name):
    descriptor = pool.FindMessageTypeByName("tensorboard." + name)
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


Event = message_class("Event")
Summary = message_class("Summary")
Value = message_class("Summary.Value")
SummaryMetadata = message_class("SummaryMetadata")
PluginData = message_class("SummaryMetadata.PluginData")
SessionLog = message_class("SessionLog")
SourceMetadata = message_class("SourceMetadata")


def masked_crc(data):
    crc = crc32c.crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def read(path):
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        header = data[at:at + 8]
        length, = struct.unpack("<Q", header)
        stored, = struct.unpack("<I", data[at + 8:at + 12])
        if masked_crc(header) != stored:
            sys.exit("the length CRC of the record at byte %d does not match" % at)
        payload = data[at + 12:at + 12 + length]
        stored, = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if len(payload) != length or masked_crc(payload) != stored:
            sys.exit("the data CRC of the record at byte %d does not match" % at)
        e = Event()
        e.ParseFromString(payload)
        print("record", at, "same" if e.SerializeToString() == payload else "differs")
        what = e.WhichOneof("what")
        if what == "file_version":
            print("file_version", e.file_version)
        elif what == "summary":
            for v in e.summary.value:
                if v.WhichOneof("value") == "simple_value":
                    print("scalar", e.step, repr(e.wall_time), repr(v.simple_value), v.tag)
        elif what == "session_log":
            print("session_log", e.step, SessionLog.SessionStatus.Name(e.session_log.status))
        at += 16 + length


def write(path):
    events = [
        Event(wall_time=1700000000.25, file_version="brain.Event:2",
              source_metadata=SourceMetadata(writer="dkit's Python oracle")),
        Event(wall_time=1700000001.5, step=7, summary=Summary(value=[
            Value(tag="a/first", simple_value=0.125,
                  metadata=SummaryMetadata(plugin_data=PluginData(plugin_name="scalars"))),
            Value(tag="a/tensor", tensor=b"\x08\x01\x12\x00"),
            Value(tag="a/second", simple_value=-2.5)])),
        Event(wall_time=1700000002.0, step=2 ** 40 + 3, session_log=SessionLog(status=SessionLog.START)),
        Event(wall_time=1700000003.0, step=2 ** 40 + 3, summary=Summary(value=[
            Value(tag="b", simple_value=float("inf"))])),
    ]
    with open(path, "wb") as out:
        for e in events:
            payload = e.SerializeToString()
            header = struct.pack("<Q", len(payload))
            out.write(header + struct.pack("<I", masked_crc(header)) + payload +
                      struct.pack("<I", masked_crc(payload)))


{"read": read, "write": write}[sys.argv[1]](sys.argv[2])
)";

/// Whether kPython imports google.protobuf and crc32c, which the event file oracle needs.
inline bool python_has_event_oracle() {
  static const bool has =
      std::system((std::string(kPython) + " -c 'import google.protobuf, crc32c' >/dev/null 2>&1").c_str()) == 0;
  return has;
}

/// An event file as the oracle read it.
struct OracleReading {
  /// What it found, as read_event_file() reports it.
  EventFileContents contents;
  /// The records whose bytes differ from protobuf's serialization of what they hold.
  int64_t differing_records = 0;
};

/// The event file at `path` as the oracle reads it (the script is written to `script_path`); a failure of the
/// oracle (a CRC that does not match, a record protobuf cannot parse) fails the test.
inline OracleReading read_with_python(const std::string& script_path, const std::string& path) {
  OracleReading reading;
  const PythonResult result = run_python(script_path, kEventFileOracle, "read '" + path + "'");
  EXPECT_EQ(result.status, 0) << result.output;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "record") {
      std::string offset;
      std::string same;
      fields >> offset >> same;
      ++reading.contents.records;
      reading.differing_records += same == "same" ? 0 : 1;
    } else if (kind == "file_version" && reading.contents.records == 1) {
      fields >> reading.contents.file_version;
    } else if (kind == "scalar") {
      ScalarEvent scalar;
      std::string wall_time;
      std::string value;
      fields >> scalar.step >> wall_time >> value >> scalar.tag;
      scalar.wall_time = std::strtod(wall_time.c_str(), nullptr);
      scalar.value = static_cast<float>(std::strtod(value.c_str(), nullptr));
      reading.contents.scalars.push_back(scalar);
    } else if (kind == "session_log") {
      int64_t step = 0;
      std::string status;
      fields >> step >> status;
      if (status == "START") {
        reading.contents.restarts.push_back(step);
      }
    }
  }
  return reading;
}

/// Writes the oracle's event file (see kEventFileOracle) to `path`.
inline void write_with_python(const std::string& script_path, const std::string& path) {
  const PythonResult result = run_python(script_path, kEventFileOracle, "write '" + path + "'");
  ASSERT_EQ(result.status, 0) << result.output;
}

/// Whether two scalars are the same point: tag, step, wall time, and equal values (a NaN equal to a NaN).
inline bool same_scalar(const ScalarEvent& a, const ScalarEvent& b) {
  return a.tag == b.tag && a.step == b.step && a.wall_time == b.wall_time &&
         (a.value == b.value || (a.value != a.value && b.value != b.value));
}

} // namespace dkit::test

/// Skips the test, saying why, when Debian's Python lacks the oracle's modules.
#define DKIT_SKIP_WITHOUT_EVENT_ORACLE()                                                                         \
  do {                                                                                                           \
    if (!::dkit::test::python_has_event_oracle()) {                                                              \
      GTEST_SKIP() << ::dkit::test::kPython << " cannot import google.protobuf and crc32c (install "             \
                      "python3-protobuf and python3-crc32c): the test checks dkit's event files with them";      \
    }                                                                                                            \
  } while (false)
