#include <dkit/checkpoint/state_dict.h>

#include <dkit/checkpoint/detail/state_dict_value.h>
#include <dkit/checkpoint/safetensors.h>
#include <dkit/core/error.h>

#include <torch/torch.h>

#include <set>

namespace dkit {
namespace {

constexpr const char* kNestedKeys[] = {"model_state_dict", "state_dict", "model"};
constexpr const char* kWrapperPrefixes[] = {"module.", "_orig_mod."};

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) {
    out += (i == 0 ? "\"" : ", \"") + keys[i] + "\"";
  }
  return out;
}

std::string describe_root(const PickleValue& root) {
  if (!root.is_dict()) {
    return "the file holds a " + root.type_name();
  }
  std::string keys;
  size_t shown = 0;
  for (const auto& [key, value] : root.entries()) {
    if (shown == 8) {
      keys += ", ...";
      break;
    }
    keys += (shown++ == 0 ? "'" : ", '") + (key.is_int() ? std::to_string(key.to_int()) : key.to_string()) + "'";
  }
  return "the file holds a " + root.type_name() + " with keys " + (keys.empty() ? "(none)" : keys);
}

// `dkit::MlpImpl` -> `Mlp`, as PyTorch names the module by its class.
std::string module_class_name(const torch::nn::Module& module) {
  std::string name = module.name();
  const auto colon = name.rfind("::");
  if (colon != std::string::npos) {
    name = name.substr(colon + 2);
  }
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) {
    name.resize(name.size() - 4);
  }
  return name;
}

// The state dict of `entries` with wrapper prefixes stripped and renames applied.
StateDict renamed(std::vector<std::pair<std::string, at::Tensor>> entries, const std::string& source,
                  const StateDictOptions& options) {
  for (bool stripped = options.strip_wrapper_prefixes(); stripped && !entries.empty();) {
    stripped = false;
    for (const std::string prefix : kWrapperPrefixes) {
      if (std::all_of(entries.begin(), entries.end(), [&](const auto& e) { return starts_with(e.first, prefix); })) {
        for (auto& entry : entries) {
          entry.first.erase(0, prefix.size());
        }
        stripped = true;
      }
    }
  }
  StateDict state_dict("state dict key");
  for (auto& [name, tensor] : entries) {
    for (const auto& [from, to] : options.renames()) {
      if (starts_with(name, from)) {
        name = to + name.substr(from.size());
        break;
      }
    }
    DKIT_CHECK(!state_dict.contains(name), source, ": two tensors are named '", name,
               "' once prefixes are stripped and renamed");
    state_dict.insert(name, std::move(tensor));
  }
  return state_dict;
}

} // namespace

bool is_state_dict(const PickleValue& value) {
  if (!value.is_dict()) {
    return false;
  }
  for (const auto& [key, item] : value.entries()) {
    if (!key.is_string() || !item.is_tensor()) {
      return false;
    }
  }
  return true;
}

bool try_find_state_dict(const PickleValue& root, std::string& key) {
  if (is_state_dict(root)) {
    key.clear();
    return true;
  }
  for (const char* nested : kNestedKeys) {
    const PickleValue* value = root.find(nested);
    if (value != nullptr && is_state_dict(*value)) {
      key = nested;
      return true;
    }
  }
  return false;
}

StateDict state_dict_from(const PickleValue& root, const std::string& source, const StateDictOptions& options) {
  std::string key;
  DKIT_CHECK(try_find_state_dict(root, key), source,
             ": no state dict found: expected a dict of tensors, or one under 'model_state_dict', 'state_dict' or "
             "'model'; ",
             describe_root(root));
  const PickleValue& found = key.empty() ? root : *root.find(key);
  std::vector<std::pair<std::string, at::Tensor>> entries;
  for (const auto& [name, tensor] : found.entries()) {
    entries.emplace_back(name.to_string(), tensor.to_tensor());
  }
  return renamed(std::move(entries), source, options);
}

StateDict read_state_dict(const std::string& path, const ReadOptions& read_options, const StateDictOptions& options) {
  if (!is_safetensors_path(path)) {
    return state_dict_from(read_torch_file(path, read_options).root, path, options);
  }
  const SafetensorsFile file = read_safetensors(path, read_options);
  std::vector<std::pair<std::string, at::Tensor>> entries;
  for (const auto& item : file.tensors) {
    entries.emplace_back(item.key(), item.value());
  }
  return renamed(std::move(entries), path, options);
}

void write_state_dict(const std::string& path, const StateDict& state_dict) {
  if (is_safetensors_path(path)) {
    write_safetensors(path, state_dict);
    return;
  }
  write_torch_file(path, detail::state_dict_value(state_dict, /*ordered=*/true));
}

StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict state_dict("state dict key");
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& parameter : item.value()->named_parameters(/*recurse=*/false)) {
      state_dict.insert(prefix + parameter.key(), parameter.value().detach());
    }
    for (const auto& buffer : item.value()->named_buffers(/*recurse=*/false)) {
      state_dict.insert(prefix + buffer.key(), buffer.value().detach());
    }
  }
  return state_dict;
}

LoadStateDictResult load_state_dict(torch::nn::Module& module, const StateDict& state_dict,
                                    const LoadStateDictOptions& options) {
  StateDict targets = module_state_dict(module);
  LoadStateDictResult result;
  std::vector<std::string> errors;
  for (const auto& target : targets) {
    const at::Tensor* source = state_dict.find(target.key());
    if (source == nullptr) {
      result.missing_keys.push_back(target.key());
      continue;
    }
    if (source->sizes() != target.value().sizes()) {
      errors.push_back(detail::concat("size mismatch for ", target.key(), ": copying a param with shape ",
                                      source->sizes(), " from checkpoint, the shape in current model is ",
                                      target.value().sizes(), "."));
    } else if (source->scalar_type() != target.value().scalar_type() &&
               !(source->is_floating_point() && target.value().is_floating_point())) {
      errors.push_back("dtype mismatch for " + target.key() + ": copying a param of dtype " +
                       dtype_name(source->scalar_type()) + " from checkpoint, the dtype in current model is " +
                       dtype_name(target.value().scalar_type()) + ".");
    }
  }
  for (const auto& item : state_dict) {
    if (!targets.contains(item.key())) {
      result.unexpected_keys.push_back(item.key());
    }
  }
  if (options.strict() && !result.unexpected_keys.empty()) {
    errors.insert(errors.begin(), "Unexpected key(s) in state_dict: " + quoted_keys(result.unexpected_keys) + ".");
  }
  if (options.strict() && !result.missing_keys.empty()) {
    errors.insert(errors.begin(), "Missing key(s) in state_dict: " + quoted_keys(result.missing_keys) + ".");
  }
  if (!errors.empty()) {
    std::string message = "Error(s) in loading state_dict for " + module_class_name(module);
    if (!options.source().empty()) {
      message += " from " + options.source();
    }
    message += ":";
    for (const auto& error : errors) {
      message += " " + error;
    }
    throw Error(message);
  }
  torch::NoGradGuard no_grad;
  for (auto& target : targets) {
    if (const at::Tensor* source = state_dict.find(target.key())) {
      target.value().copy_(*source);
    }
  }
  return result;
}

void save_state_dict(const torch::nn::Module& module, const std::string& path) {
  write_state_dict(path, module_state_dict(module));
}

LoadStateDictResult load_state_dict(torch::nn::Module& module, const std::string& path,
                                    const LoadFileOptions& options) {
  return load_state_dict(module, read_state_dict(path, options.read(), options.keys()),
                         LoadStateDictOptions().strict(options.strict()).source(path));
}

} // namespace dkit
