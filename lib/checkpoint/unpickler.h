#pragma once

#include <dkit/checkpoint/pickle_value.h>

#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace dkit {

/// Limits on what reading a file may cost. Every one is checked before the memory it guards is allocated, and
/// going over one is an error naming the limit, never a crash.
struct ReadLimits {
  /// Largest file accepted, in bytes.
  TORCH_ARG(int64_t, max_file_bytes) = int64_t{1} << 40;
  /// Largest record (one tensor storage; in a safetensors file, one tensor's data) accepted, in bytes.
  TORCH_ARG(int64_t, max_record_bytes) = int64_t{64} << 30;
  /// Most records in one archive (tensors in a safetensors file).
  TORCH_ARG(int64_t, max_records) = 1'000'000;
  /// Largest pickle (`data.pkl`) accepted, in bytes; this also bounds the number of opcodes.
  TORCH_ARG(int64_t, max_pickle_bytes) = int64_t{256} << 20;
  /// Largest JSON header of a safetensors file accepted, in bytes; Python's safetensors reads no more than
  /// 100,000,000.
  TORCH_ARG(int64_t, max_header_bytes) = 100'000'000;
  /// Deepest nesting of containers (a dict in a dict counts 2), in a pickle or a safetensors header.
  TORCH_ARG(int64_t, max_depth) = 100;
  /// Most pickle memo entries.
  TORCH_ARG(int64_t, max_memo) = 1'000'000;
  /// Most values in the unpickled tree, shared ones counted each time they appear, or in a safetensors header.
  TORCH_ARG(int64_t, max_values) = 1'000'000;
};

/// Gives the unpickler the storage of a persistent id `('storage', torch.FloatStorage, key, location, numel)`:
/// `numel` elements of `dtype`, on the device tensors are to be loaded to. Called once per key.
using StorageLoader = std::function<c10::Storage(const std::string& key, c10::ScalarType dtype, int64_t numel,
                                                 const std::string& location)>;

/// Reads a pickle with dkit's own restricted unpickler. Like PyTorch's `torch.load(weights_only=True)` it accepts
/// only containers, numbers, strings and tensors: the only globals allowed are `collections.OrderedDict`,
/// `torch._utils._rebuild_tensor_v2`, `_rebuild_parameter`, `_rebuild_parameter_with_state`, `torch.Size` and the
/// `torch.*Storage` types. Any other global (`posix.system`, `builtins.eval`, ...) is an error naming it, and
/// nothing in the pickle is ever executed. Every tensor's offset, sizes and strides are checked against its
/// storage. `source` names the pickle in error messages, e.g. `model.pt: data.pkl`.
PickleValue unpickle(std::string_view data, const StorageLoader& load_storage, const std::string& source,
                     const ReadLimits& limits = {});

} // namespace dkit
