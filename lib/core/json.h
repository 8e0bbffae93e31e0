#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dkit {

/// A small streaming JSON writer for dkit's reports (`--json` outputs, summary.json). It writes compact,
/// valid JSON; commas and nesting are tracked for the caller.
class JsonWriter {
 public:
  /// Opens an object, as a value or as the value of the pending key.
  JsonWriter& begin_object();
  /// Closes the innermost object.
  JsonWriter& end_object();
  /// Opens an array.
  JsonWriter& begin_array();
  /// Closes the innermost array.
  JsonWriter& end_array();
  /// Writes an object key; the next call writes its value.
  JsonWriter& key(std::string_view name);
  /// Writes a string value, escaped.
  JsonWriter& value(std::string_view text);
  /// Writes a string value, escaped.
  JsonWriter& value(const char* text);
  /// Writes a boolean value.
  JsonWriter& value(bool flag);
  /// Writes an integer value.
  JsonWriter& value(int64_t number);
  /// Writes an integer value.
  JsonWriter& value(int number);
  /// Writes a floating-point value; NaN and infinities become null, as JSON has no spelling for them.
  JsonWriter& value(double number);
  /// Writes null.
  JsonWriter& null();
  /// The text written so far.
  const std::string& str() const {
    return out_;
  }

 private:
  void before_value();

  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

/// `text` as a quoted, escaped JSON string.
std::string json_quote(std::string_view text);

} // namespace dkit
