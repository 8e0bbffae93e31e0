#pragma once

// Internal to the training checkpoint's sources (optimizer_state.cpp, training_checkpoint.cpp); not one of the
// installed headers.

#include <dkit/checkpoint/pickle_value.h>
#include <dkit/core/error.h>

#include <string>
#include <utility>

namespace dkit::detail {

// Reads dict entries with errors that say which file and which entry.
class Fields {
 public:
  Fields(const PickleValue& dict, std::string where) : dict_(dict), where_(std::move(where)) {
    DKIT_CHECK(dict.is_dict(), where_, " is a ", dict.type_name(), ", expected a dict");
  }

  const PickleValue* find(const char* key) const {
    return dict_.find(key);
  }

  const PickleValue& get(const char* key) const {
    const PickleValue* value = dict_.find(key);
    DKIT_CHECK(value != nullptr, where_, " has no '", key, "'");
    return *value;
  }

  double number(const char* key) const {
    const PickleValue& value = get(key);
    DKIT_CHECK(value.is_int() || value.is_double(), where_, ": '", key, "' is a ", value.type_name(),
               ", expected a number");
    return value.to_double();
  }

  int64_t integer(const char* key) const {
    const PickleValue& value = get(key);
    DKIT_CHECK(value.is_int(), where_, ": '", key, "' is a ", value.type_name(), ", expected an int");
    return value.to_int();
  }

  bool flag(const char* key, bool fallback) const {
    const PickleValue* value = dict_.find(key);
    if (value == nullptr || value->is_none()) {
      return fallback;
    }
    DKIT_CHECK(value->is_bool(), where_, ": '", key, "' is a ", value->type_name(), ", expected a bool");
    return value->to_bool();
  }

  const std::string& text(const char* key) const {
    const PickleValue& value = get(key);
    DKIT_CHECK(value.is_string(), where_, ": '", key, "' is a ", value.type_name(), ", expected a str");
    return value.to_string();
  }

  // A tensor entry, or an undefined tensor when the entry is missing or None and `optional`.
  at::Tensor tensor(const char* key, bool optional = false) const {
    const PickleValue* value = dict_.find(key);
    if (optional && (value == nullptr || value->is_none())) {
      return {};
    }
    DKIT_CHECK(value != nullptr, where_, " has no '", key, "'");
    DKIT_CHECK(value->is_tensor(), where_, ": '", key, "' is a ", value->type_name(), ", expected a Tensor");
    return value->to_tensor();
  }

  const std::string& where() const {
    return where_;
  }

 private:
  const PickleValue& dict_;
  std::string where_;
};

} // namespace dkit::detail
