#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dkit {

/// An error caused by what the user gave dkit: a bad config value, a missing or corrupt file, a device that does
/// not exist. Its message names the thing at fault and is meant to be shown to the user as it is.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

/// Streams every argument into one string.
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

} // namespace detail
} // namespace dkit

/// Throws dkit::Error with the streamed arguments as its message when `cond` is false.
#define DKIT_CHECK(cond, ...)                                    \
  do {                                                           \
    if (!(cond)) {                                               \
      throw ::dkit::Error(::dkit::detail::concat(__VA_ARGS__));  \
    }                                                            \
  } while (false)
