#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dkit {

/// The CRC-32C (Castagnoli polynomial, as iSCSI and TFRecord files use it) of `data`, continuing from `crc`:
/// `crc32c(b, crc32c(a))` is `crc32c(a + b)`.
uint32_t crc32c(std::string_view data, uint32_t crc = 0);

/// The masked CRC-32C a TFRecord file stores: the CRC rotated right by 15 bits, plus `0xa282ead8`, so that the CRC
/// of data that holds CRCs stays informative.
uint32_t masked_crc32c(std::string_view data);

/// One point of a TensorBoard curve: a `simple_value` of a summary in an event file.
struct ScalarEvent {
  /// The curve, e.g. `train/loss`.
  std::string tag;
  /// The value (TensorBoard stores a float).
  float value = 0;
  /// The x of the point: the training step.
  int64_t step = 0;
  /// When it was written, in seconds since 1970.
  double wall_time = 0;
};

/// What read_event_file() found in an event file.
struct EventFileContents {
  /// The `file_version` of the first record (`brain.Event:2` in files TensorBoard reads); empty when it has none.
  std::string file_version;
  /// Every scalar, in the order of the file.
  std::vector<ScalarEvent> scalars;
  /// The step of every `SessionLog` START event, in the order of the file.
  std::vector<int64_t> restarts;
  /// The number of records (events) in the file.
  int64_t records = 0;
};

/// Writes a TensorBoard event file without protobuf or TensorFlow: TFRecord framing (length, masked CRC-32C of the
/// length, the serialized `Event`, masked CRC-32C of it) around the few `Event` fields it needs, encoded by hand.
/// Example:
/// ```
/// dkit::EventFileWriter events(run_dir);
/// events.add_scalar("train/loss", 0.25f, /*step=*/100);
/// events.flush();
/// ```
/// `tensorboard --logdir DIR` shows the curves of every event file under DIR.
class EventFileWriter {
 public:
  /// Creates `events.out.tfevents.<unix seconds, 10 digits>.<host name>` in `folder` (which must exist), with
  /// `.1`, `.2`, ... appended when a file of that name exists, and writes its first record, an event with
  /// `file_version: "brain.Event:2"`, flushed to the operating system. An error names the file.
  explicit EventFileWriter(const std::string& folder);
  ~EventFileWriter();
  /// Moves the writer: the open file goes with it.
  EventFileWriter(EventFileWriter&&) noexcept;
  /// Moves the writer: the open file goes with it.
  EventFileWriter& operator=(EventFileWriter&&) noexcept;

  /// The file, as `folder / name`.
  const std::string& path() const {
    return path_;
  }

  /// Writes a point of the curve `tag`: an event at `step` whose summary holds `value` as a `simple_value`.
  /// `wall_time` is in seconds since 1970, the current time when left out. Written to the file's buffer; flush()
  /// hands it to the operating system.
  void add_scalar(const std::string& tag, float value, int64_t step, std::optional<double> wall_time = std::nullopt);

  /// Writes a `SessionLog` event with status START at `step`: TensorBoard (its Python event loader) then drops
  /// the points at `step` and later that it read before, as written by a run that was stopped and resumed from an
  /// earlier checkpoint.
  void add_restart(int64_t step, std::optional<double> wall_time = std::nullopt);

  /// Hands everything written so far to the operating system, where TensorBoard can read it; an error names the
  /// file.
  void flush();

 private:
  struct Close {
    void operator()(std::FILE* file) const;
  };

  void write_record(const std::string& payload);

  std::string path_;
  std::unique_ptr<std::FILE, Close> file_;
};

/// Reads an event file as EventFileWriter writes it, or as TensorBoard's and PyTorch's writers do: checks every
/// record's length against the file and both masked CRC-32Cs, and decodes each `Event` (fields it does not know are
/// skipped; summary values other than `simple_value`, such as tensors, are left out). A damaged or cut short file
/// is a dkit::Error naming the file and the byte offset of the record at fault.
EventFileContents read_event_file(const std::string& path);

} // namespace dkit
