#pragma once

#include <dkit/checkpoint/pickle_value.h>
#include <dkit/checkpoint/state_dict.h>

namespace dkit::detail {

/// `state_dict` as the pickle value `torch.save` writes for it: a `collections.OrderedDict` (what Python's
/// `state_dict()` returns) when `ordered`, else a plain dict, its entries in the state dict's order.
inline PickleValue state_dict_value(const StateDict& state_dict, bool ordered) {
  PickleValue root = ordered ? PickleValue::ordered_dict() : PickleValue::dict();
  for (const auto& item : state_dict) {
    root.entries().emplace_back(item.key(), item.value());
  }
  return root;
}

} // namespace dkit::detail
