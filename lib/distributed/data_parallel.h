#pragma once

#include <dkit/device/device.h>
#include <dkit/model/mlp.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace dkit {

/// `model` applied to `input` as `torch::nn::parallel::data_parallel` does it: the rows of `input` are scattered
/// over `devices`, the model is replicated on each, the outputs are gathered on `devices[0]` (where the model
/// lives), and backward sums the replicas' gradients into the model's parameters. A build without the capability
/// throws a dkit::Error saying so.
at::Tensor data_parallel_forward(Mlp& model, const at::Tensor& input, const std::vector<Device>& devices);

} // namespace dkit
