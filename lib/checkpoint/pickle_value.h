#pragma once

#include <dkit/core/format.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dkit {

/// A value of the pickle subset that `torch.save` writes for state dicts, general checkpoints and optimizer
/// state: None, bool, int, float, str, list, tuple, dict (ordered, keys str or int) and tensors. Nothing else
/// can be represented, so nothing else can be read or written.
class PickleValue {
 public:
  /// What a PickleValue holds; the names are Python's types.
  enum class Type { kNone, kBool, kInt, kDouble, kString, kList, kTuple, kDict, kTensor };
  /// The elements of a list or tuple.
  using Items = std::vector<PickleValue>;
  /// The entries of a dict, in insertion order.
  using Entries = std::vector<std::pair<PickleValue, PickleValue>>;

  /// None.
  PickleValue() = default;
  /// A Python bool.
  PickleValue(bool flag);
  /// A Python int.
  PickleValue(int64_t number);
  /// A Python int.
  PickleValue(int number);
  /// A Python float.
  PickleValue(double number);
  /// A Python str (UTF-8).
  PickleValue(std::string text);
  /// A Python str (UTF-8).
  PickleValue(const char* text);
  /// A tensor. `saved_on` is the device tag its storage carried in a file (`cpu`, `cuda:0`); empty otherwise.
  PickleValue(at::Tensor tensor, std::string saved_on = "");

  /// A list of `items`.
  static PickleValue list(Items items = {});
  /// A tuple of `items`.
  static PickleValue tuple(Items items = {});
  /// A plain dict with `entries`; a later duplicate key replaces the earlier one's value.
  static PickleValue dict(Entries entries = {});
  /// A `collections.OrderedDict` (what `state_dict()` returns) with `entries`.
  static PickleValue ordered_dict(Entries entries = {});

  /// What this value holds.
  Type type() const {
    return type_;
  }
  /// Python's name for the type: `NoneType`, `bool`, `int`, `float`, `str`, `list`, `tuple`, `dict`,
  /// `OrderedDict` or `Tensor`.
  std::string type_name() const;

  /// Whether this is None.
  bool is_none() const {
    return type_ == Type::kNone;
  }
  /// Whether this is a bool.
  bool is_bool() const {
    return type_ == Type::kBool;
  }
  /// Whether this is an int.
  bool is_int() const {
    return type_ == Type::kInt;
  }
  /// Whether this is a float.
  bool is_double() const {
    return type_ == Type::kDouble;
  }
  /// Whether this is a str.
  bool is_string() const {
    return type_ == Type::kString;
  }
  /// Whether this is a list.
  bool is_list() const {
    return type_ == Type::kList;
  }
  /// Whether this is a tuple.
  bool is_tuple() const {
    return type_ == Type::kTuple;
  }
  /// Whether this is a dict or an OrderedDict.
  bool is_dict() const {
    return type_ == Type::kDict;
  }
  /// Whether this is a dict that was, or is to be written as, a `collections.OrderedDict`.
  bool is_ordered_dict() const {
    return type_ == Type::kDict && ordered_;
  }
  /// Whether this is a tensor.
  bool is_tensor() const {
    return type_ == Type::kTensor;
  }

  /// The bool; an error for any other type.
  bool to_bool() const;
  /// The int; an error for any other type (a bool is not an int here).
  int64_t to_int() const;
  /// The float, or an int converted to one (Python writes `weight_decay=0` as an int).
  double to_double() const;
  /// The str.
  const std::string& to_string() const;
  /// The tensor.
  const at::Tensor& to_tensor() const;
  /// The device tag a tensor's storage was saved with (`cpu`, `cuda:0`); empty when it was not read from a file.
  const std::string& saved_on() const;
  /// The elements of a list or tuple.
  const Items& items() const;
  /// The elements of a list or tuple.
  Items& items();
  /// The entries of a dict.
  const Entries& entries() const;
  /// The entries of a dict.
  Entries& entries();

  /// The value under the str key `key` of a dict, or nullptr when there is none (or this is not a dict).
  const PickleValue* find(std::string_view key) const;
  /// The value under the int key `key` of a dict, or nullptr.
  const PickleValue* find(int64_t key) const;
  /// Sets `key` in a dict, replacing an existing entry's value in place or appending a new entry.
  void set(PickleValue key, PickleValue value);
  /// Appends to a list.
  void push_back(PickleValue item);

 private:
  void expect(Type type, const char* what) const;

  Type type_ = Type::kNone;
  bool ordered_ = false;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string string_;
  Items items_;
  Entries entries_;
  at::Tensor tensor_;
};


/// Calls `fn(path, tensor_value)` for every tensor under `value`, depth first in order; the path joins dict keys
/// and list indices with dots (`optimizer_state_dict.state.0.exp_avg`).
void for_each_tensor(const PickleValue& value,
                     const std::function<void(const std::string& path, const PickleValue& tensor)>& fn);

} // namespace dkit
