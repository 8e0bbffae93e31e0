#pragma once

#include <dkit/checkpoint/pickle.h>
#include <dkit/checkpoint/state_dict.h>
#include <dkit/checkpoint/torch_file.h>
#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/model/mlp.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <string>

namespace dkit {

/// The `model` entry of a training checkpoint for an Mlp: a dict of `in_features`, `hidden`, `out_features`,
/// `activation` and `dropout`, which `dkit predict` and load_mlp() rebuild the network from.
PickleValue mlp_description(const MlpOptions& options);

/// The Mlp a training checkpoint's `model` entry describes, checked against its `model_state_dict` before anything
/// is built from it (each layer's weight there, of the shape the entry says, holding its values itself); `source`
/// names the file in errors. An error when the checkpoint is not of an Mlp.
MlpOptions mlp_options_from(const TrainingCheckpoint& checkpoint, const std::string& source);

/// How mlp_from_state_dict() builds the network.
struct MlpFromStateDictOptions {
  /// Nonlinearity between the layers; a state dict does not record it.
  TORCH_ARG(Activation, activation) = Activation::kReLU;
  /// Names where the state dict came from in errors, e.g. the file's path.
  TORCH_ARG(std::string, source) = "state dict";
};

/// An Mlp whose shape comes from the state dict: its Linear layers are the 2-D tensors in the order they appear,
/// whatever their names (`hidden.weight`, `output.weight` work as `0.weight`, `2.weight` do), each with the
/// 1-D tensor named like it with `bias` for `weight` as its bias. Each layer's input size must equal the previous
/// layer's output size; a tensor that is neither a weight nor its bias is an error.
Mlp mlp_from_state_dict(const StateDict& state_dict, const MlpFromStateDictOptions& options = {});

/// An Mlp read from a file, ready to predict, with the input normalisation training used.
struct LoadedMlp {
  /// The network, in eval mode, on the requested device.
  Mlp net{nullptr};
  /// Per-feature mean to subtract from inputs; undefined when the file has none.
  at::Tensor input_mean;
  /// Per-feature standard deviation to divide inputs by; undefined when the file has none.
  at::Tensor input_std;

  /// Logits for raw inputs `[N, in_features]`: normalised as in training, then the network.
  at::Tensor predict(const at::Tensor& inputs) const;
};

/// How load_mlp() reads a model file.
struct LoadMlpOptions {
  /// Device the network and normalisation tensors are placed on.
  TORCH_ARG(c10::Device, device) = c10::Device(c10::kCPU);
  /// Nonlinearity for files that do not record one (anything but a dkit training checkpoint).
  TORCH_ARG(Activation, activation) = Activation::kReLU;
  /// How the state dict is found and renamed in files that are not dkit training checkpoints.
  TORCH_ARG(StateDictOptions, state_dict) = {};
  /// Limits on what reading the file may cost.
  TORCH_ARG(ReadLimits, limits) = {};
};

/// The network in a dkit training checkpoint, a file written by export_mlp(), or any PyTorch MLP state dict
/// (plain or nested, see state_dict_from() and mlp_from_state_dict()), in a `torch.save` file or, when `path`
/// ends in `.safetensors`, a safetensors file. `input_mean` and `input_std` come from the checkpoint, or from
/// entries of those names beside the weights.
LoadedMlp load_mlp(const std::string& path, const LoadMlpOptions& options = {});

/// Like load_mlp(), for a file's root value already read; `source` names the file in errors. `options.limits()`
/// is not used here: it applies to reading the file.
LoadedMlp mlp_from(const PickleValue& root, const std::string& source, const LoadMlpOptions& options = {});

/// Writes the network's tensors, keys in `nn.Sequential` naming (`0.weight`, `0.bias`, `2.weight`, ...), plus
/// `input_mean` and `input_std` when the model has them, in the format `path`'s extension names: a safetensors file
/// for `.safetensors` (write_safetensors()), otherwise a plain dict that Python's `torch.load` reads.
void export_mlp(const std::string& path, const LoadedMlp& model);

} // namespace dkit
