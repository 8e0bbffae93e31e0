#pragma once

#include <dkit/checkpoint/pickle_value.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace dkit {

/// A pickle as `torch.save` writes it, and the storages its persistent ids refer to.
struct Pickled {
  /// The pickle (protocol 2), for the archive's `data.pkl`.
  std::string data;
  /// Storage `i` of the persistent ids, for the archive's `data/i`: 1-D tensors covering each storage, on the
  /// device the tensors were on.
  std::vector<at::Tensor> storages;
};

/// Writes `value` as the protocol 2 pickle `torch.save` would write, tensors as `torch._utils._rebuild_tensor_v2`
/// over `('storage', torch.FloatStorage, key, 'cpu', numel)` persistent ids. Tensors that share a storage share
/// it in the pickle too. Python's `pickle` and PyTorch's `weights_only` unpickler read what it writes.
Pickled pickle(const PickleValue& value);

} // namespace dkit
