#include <dkit/core/format.h>

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace dkit {
namespace {

template <typename T>
std::string shortest(T value) {
  if (std::isnan(value)) {
    return "nan";
  }
  if (std::isinf(value)) {
    return value > 0 ? "inf" : "-inf";
  }
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".e") == std::string::npos) {
    text += ".0";
  }
  return text;
}

} // namespace

std::string format_number(double value) {
  return shortest(value);
}

std::string format_number(float value) {
  return shortest(value);
}

std::string format_fixed(double value, int decimals) {
  char buffer[400];
  std::snprintf(buffer, sizeof(buffer), "%.*f", std::clamp(decimals, 0, 30), value);
  return buffer;
}

std::string format_significant(double value, int digits) {
  if (std::isnan(value)) {
    return "nan";
  }
  if (std::isinf(value)) {
    return value > 0 ? "inf" : "-inf";
  }
  if (value == 0.0) {
    return "0";
  }
  digits = std::max(digits, 1);
  const int magnitude = static_cast<int>(std::floor(std::log10(std::fabs(value))));
  const int decimals = std::clamp(digits - 1 - magnitude, 0, 15);
  std::string text = format_fixed(value, decimals);
  if (decimals > 0 && std::fabs(std::strtod(text.c_str(), nullptr)) >= std::pow(10.0, magnitude + 1)) {
    text = format_fixed(value, decimals - 1);
  }
  return text;
}

std::string format_rate(double per_second) {
  if (per_second >= 1e6) {
    return format_fixed(per_second / 1e6, 1) + "M";
  }
  if (per_second >= 1e3) {
    return format_fixed(per_second / 1e3, 1) + "k";
  }
  return format_fixed(per_second, 1);
}

std::string printable(const std::string& text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += {'\\', 'x', kHex[byte >> 4], kHex[byte & 0xf]};
    } else {
      out += c;
    }
  }
  return out;
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kLong: return "int64";
    case c10::kInt: return "int32";
    case c10::kShort: return "int16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kBool: return "bool";
    case c10::kComplexFloat: return "complex64";
    case c10::kComplexDouble: return "complex128";
    default: return c10::toString(dtype);
  }
}

std::string format_tensor(const std::vector<int64_t>& shape, c10::ScalarType dtype) {
  std::ostringstream out;
  out << c10::IntArrayRef(shape) << " (" << dtype_name(dtype) << ")";
  return out.str();
}

std::string format_tensor(const at::Tensor& tensor) {
  return tensor.defined() ? format_tensor(tensor.sizes().vec(), tensor.scalar_type()) : "(none)";
}

} // namespace dkit
