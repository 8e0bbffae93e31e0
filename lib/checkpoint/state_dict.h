#pragma once

#include <dkit/checkpoint/pickle.h>
#include <dkit/checkpoint/torch_file.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/ordered_dict.h>

#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
} // namespace torch::nn

namespace dkit {

/// Tensors by name, in order: what Python's `Module.state_dict()` returns.
using StateDict = torch::OrderedDict<std::string, at::Tensor>;

/// Key prefix renames, `{from, to}`.
using KeyRenames = std::vector<std::pair<std::string, std::string>>;

/// How a state dict is picked out of a file's contents and its keys rewritten.
struct StateDictOptions {
  /// Strips the prefixes `module.` (DataParallel, DistributedDataParallel) and `_orig_mod.` (torch.compile), as
  /// often as every key starts with one of them.
  TORCH_ARG(bool, strip_wrapper_prefixes) = true;
  /// Key prefix renames, `{from, to}`, applied after the stripping: a key starting with `from` has that part
  /// replaced by `to`. The first matching rename applies.
  TORCH_ARG(KeyRenames, renames) = {};
};

/// Whether `value` is a state dict: a dict whose values are all tensors.
bool is_state_dict(const PickleValue& value);

/// Looks for the state dict in a file's root value: the root itself, or the value under `model_state_dict`,
/// `state_dict` or `model` (checked in that order). Sets `key` to where it is (empty for the root) and returns
/// true, or returns false when there is none.
bool try_find_state_dict(const PickleValue& root, std::string& key);

/// The state dict in `root` (see try_find_state_dict()), with wrapper prefixes stripped and `options.renames()`
/// applied. `source` names the file in errors.
StateDict state_dict_from(const PickleValue& root, const std::string& source, const StateDictOptions& options = {});

/// Reads `path` and returns its state dict: a safetensors file's tensors when `path` ends in `.safetensors`
/// (read_safetensors()), otherwise the state dict in a `torch.save` file (read_torch_file(), state_dict_from()).
/// Either way wrapper prefixes are stripped and `options.renames()` applied as state_dict_from() does. A file whose
/// content is the other format is an error saying so.
StateDict read_state_dict(const std::string& path, const ReadOptions& read_options = {},
                          const StateDictOptions& options = {});

/// Writes `state_dict` to `path` in the format its extension names: a safetensors file for `.safetensors`
/// (write_safetensors(), without metadata), otherwise a `torch.save` file of an `OrderedDict`, as Python's
/// `torch.save(module.state_dict(), path)` does. Atomic either way.
void write_state_dict(const std::string& path, const StateDict& state_dict);

/// The parameters and buffers of `module`, named as LibTorch registers them and in Python's order (each module's
/// parameters, then its buffers, then its children's), detached from autograd but sharing their storage (what
/// Python's `module.state_dict()` returns).
StateDict module_state_dict(const torch::nn::Module& module);

/// How load_state_dict() treats keys that do not match.
struct LoadStateDictOptions {
  /// Whether a missing or unexpected key is an error, as in PyTorch's `load_state_dict(strict=True)`. A size
  /// mismatch is always an error.
  TORCH_ARG(bool, strict) = true;
  /// Names where the state dict came from in errors, e.g. the file's path; empty leaves it out.
  TORCH_ARG(std::string, source) = "";
};

/// The keys that did not match, as PyTorch's `load_state_dict` returns them.
struct LoadStateDictResult {
  /// Parameters and buffers of the module that the state dict lacks.
  std::vector<std::string> missing_keys;
  /// Entries of the state dict that the module has no parameter or buffer for.
  std::vector<std::string> unexpected_keys;
};

/// Copies `state_dict` into the parameters and buffers of `module`, converting float16, bfloat16, float32 and
/// float64 to each parameter's dtype and moving the values to each parameter's device (so the default
/// map_location is the module's device). Errors are worded as PyTorch's, on one line:
/// `Error(s) in loading state_dict for Mlp: Missing key(s) in state_dict: "2.bias". Unexpected key(s) in
/// state_dict: "3.bias". size mismatch for 0.weight: copying a param with shape [3, 4] from checkpoint, the shape
/// in current model is [5, 4].` Nothing is copied when there is an error.
LoadStateDictResult load_state_dict(torch::nn::Module& module, const StateDict& state_dict,
                                    const LoadStateDictOptions& options = {});

/// How load_state_dict() reads a file into a module.
struct LoadFileOptions {
  /// Where the file's tensors are read to (`map_location`) and the limits on the file; the values end up on each
  /// parameter's device whatever the map_location.
  TORCH_ARG(ReadOptions, read) = {};
  /// Prefix stripping and renames applied to the file's keys.
  TORCH_ARG(StateDictOptions, keys) = {};
  /// Whether a missing or unexpected key is an error, as in PyTorch's `load_state_dict(strict=True)`.
  TORCH_ARG(bool, strict) = true;
};

/// Writes the parameters and buffers of `module` (nested submodules included, named as LibTorch registers them,
/// which is how Python names the same network's) to `path`, in the format its extension names: `.safetensors` for
/// safetensors, anything else (`.pt`, `.pth`, ...) for the `torch.save` zip, which `torch.load(path)` reads in
/// PyTorch 2.6 and later with its default `weights_only=True`. Tensors on a GPU are copied to the CPU. The write is
/// atomic, as write_torch_file()'s.
void save_state_dict(const torch::nn::Module& module, const std::string& path);

/// Reads the state dict in `path` (a `torch.save` file, whose state dict may be nested as try_find_state_dict()
/// finds it, or a `.safetensors` file) and copies it into `module`, as load_state_dict() above does, naming the
/// file in errors.
LoadStateDictResult load_state_dict(torch::nn::Module& module, const std::string& path,
                                    const LoadFileOptions& options = {});

} // namespace dkit
