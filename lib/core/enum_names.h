#pragma once

#include <dkit/core/error.h>

#include <array>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dkit {

/// One value of an enum and the name that config files, checkpoints and messages spell it with.
template <typename Enum>
struct EnumName {
  /// The value.
  Enum value;
  /// Its name, e.g. `relu`.
  std::string_view name;
};

/// Every value of an enum with its name, in the order listings show them: the one place an enum's names are
/// spelled. Declared beside the enum, e.g.
/// ```
/// inline constexpr EnumNames<Scaling, 3> kScalingNames = {{
///     {Scaling::kNone, "none"}, {Scaling::kStandardize, "standardize"}, {Scaling::kMinMax, "minmax"}}};
/// ```
template <typename Enum, std::size_t N>
using EnumNames = std::array<EnumName<Enum>, N>;

/// The name of `value` in `names`. A value missing from its table is a bug in the table, a std::logic_error.
template <typename Enum, std::size_t N>
std::string_view name_of(const EnumNames<Enum, N>& names, Enum value) {
  for (const auto& entry : names) {
    if (entry.value == value) {
      return entry.name;
    }
  }
  throw std::logic_error(detail::concat("enum value ", static_cast<long long>(value), " has no name in its table"));
}

/// The value `name` names in `names` (exact, case-sensitive), or std::nullopt.
template <typename Enum, std::size_t N>
std::optional<Enum> try_parse(const EnumNames<Enum, N>& names, std::string_view name) {
  for (const auto& entry : names) {
    if (entry.name == name) {
      return entry.value;
    }
  }
  return std::nullopt;
}

/// The names for a message or a doc, in table order: `a, b or c` by default; `last` joins the last two
/// (`list_names(names, /*last=*/", ")` is `a, b, c`) and `quote` goes around each name
/// (with a backtick as `quote`, the names come out as code spans). Any table of entries with a `name` will do.
template <typename Entry, std::size_t N>
std::string list_names(const std::array<Entry, N>& names, std::string_view last = " or ", std::string_view quote = "") {
  std::string listing;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) {
      listing += i + 1 == N ? last : std::string_view(", ");
    }
    listing.append(quote).append(names[i].name).append(quote);
  }
  return listing;
}

/// The value `name` names in `names`; anything else is a dkit::Error `unknown WHAT 'NAME': expected a, b or c`.
template <typename Enum, std::size_t N>
Enum parse_name(const EnumNames<Enum, N>& names, std::string_view name, std::string_view what) {
  const std::optional<Enum> value = try_parse(names, name);
  DKIT_CHECK(value.has_value(), "unknown ", what, " '", name, "': expected ", list_names(names));
  return *value;
}

} // namespace dkit
