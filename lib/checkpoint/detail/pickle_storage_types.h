#pragma once

// Internal to dkit's unpickler and pickler; not one of the installed headers.

#include <c10/core/ScalarType.h>

#include <array>

namespace dkit::detail {

/// A typed storage that `torch.save` names in its persistent ids (`torch.FloatStorage`), and its element type.
struct StorageType {
  /// The element type.
  c10::ScalarType dtype;
  /// The name in module `torch`.
  const char* name;
};

/// The typed storages dkit reads and writes, one per dtype.
inline constexpr std::array<StorageType, 12> kStorageTypes = {{
    {c10::kFloat, "FloatStorage"},
    {c10::kDouble, "DoubleStorage"},
    {c10::kHalf, "HalfStorage"},
    {c10::kBFloat16, "BFloat16Storage"},
    {c10::kLong, "LongStorage"},
    {c10::kInt, "IntStorage"},
    {c10::kShort, "ShortStorage"},
    {c10::kChar, "CharStorage"},
    {c10::kByte, "ByteStorage"},
    {c10::kBool, "BoolStorage"},
    {c10::kComplexFloat, "ComplexFloatStorage"},
    {c10::kComplexDouble, "ComplexDoubleStorage"},
}};

} // namespace dkit::detail
