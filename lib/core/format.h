#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace at {
class Tensor;
} // namespace at

namespace dkit {

/// The one text form of a number that a program reads back: the shortest decimal that parses to exactly `value`
/// (`0.001`, `1e-08`), with `.0` after a whole number so YAML and CSV readers keep it a float (`3.0`); `nan`,
/// `inf` and `-inf` otherwise. Used by the resolved config.yaml, metrics.csv and `dkit predict`.
std::string format_number(double value);

/// format_number() for a float: the shortest decimal that parses back to the same float (`0.1`, not
/// `0.100000001`).
std::string format_number(float value);

/// The text form of a number for people: exactly `decimals` digits after the point, in fixed notation
/// (`format_fixed(2.5, 2)` is `2.50`). Used by log lines, the progress display and benchmark tables.
std::string format_fixed(double value, int decimals);

/// `value` rounded to `digits` significant digits, in fixed notation (`format_significant(0.012345, 3)` is
/// `0.0123`, `format_significant(12345.0, 3)` is `12345`): benchmark tables.
std::string format_significant(double value, int digits);

/// A rate for people, one decimal with a k or M suffix from a thousand and a million on: `812.5`, `310.2k`, `1.2M`.
std::string format_rate(double per_second);

/// `text` with each control character (bytes 0x00-0x1f and 0x7f) written as `\xNN` (NN: its hex code), all other bytes
/// as they are: how dkit shows text it did not write itself (a config value, a file name, a tensor's key) in a
/// message or a table, so that the text stays on one line and cannot move a terminal's cursor.
std::string printable(const std::string& text);

/// Python's name for a dtype (`float32`, `bfloat16`, `int64`, ...).
std::string dtype_name(c10::ScalarType dtype);

/// A shape and a dtype as messages give them: `[64, 784] (float32)`, the shape as LibTorch prints sizes.
std::string format_tensor(const std::vector<int64_t>& shape, c10::ScalarType dtype);

/// format_tensor() of a tensor's shape and dtype, or `(none)` for an undefined tensor.
std::string format_tensor(const at::Tensor& tensor);

} // namespace dkit
