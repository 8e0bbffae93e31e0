#include <dkit/model/mlp_file.h>

#include <dkit/checkpoint/detail/state_dict_value.h>
#include <dkit/checkpoint/detail/training_checkpoint_fields.h>
#include <dkit/checkpoint/safetensors.h>
#include <dkit/core/error.h>
#include <dkit/device/device.h>

#include <torch/torch.h>

#include <set>

namespace dkit {
namespace {

using detail::Fields;

void check_activation(const std::string& name, const std::string& where) {
  DKIT_CHECK(try_parse(kActivationNames, name).has_value(), where, ": unknown activation '", name,
             "': expected ", list_names(kActivationNames));
}

// A layer's weight must hold its values itself: an expanded view (stride 0) of a few stored values could claim
// any shape, and building a model of that shape would allocate memory the file never held.
void check_stored(const at::Tensor& tensor, const std::string& name, const std::string& source) {
  const auto stored = static_cast<int64_t>(tensor.storage().nbytes() / tensor.element_size());
  DKIT_CHECK(tensor.numel() <= stored, source, ": '", name, "' has shape ", tensor.sizes(), " but its storage holds ",
             stored, " values: an expanded view cannot be a layer's weight");
}

// The network 'model' describes must be the one whose weights 'model_state_dict' holds, checked before anything
// builds it, so that a hostile 'model' entry cannot make dkit allocate more than the file's own tensors.
void check_model_entry(const MlpOptions& model, const StateDict& state_dict, const std::string& source) {
  std::vector<int64_t> widths = {model.in_features()};
  widths.insert(widths.end(), model.hidden().begin(), model.hidden().end());
  widths.push_back(model.out_features());
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const std::string name = std::to_string(2 * i) + ".weight";
    const at::Tensor* weight = state_dict.find(name);
    const std::vector<int64_t> expected = {widths[i + 1], widths[i]};
    DKIT_CHECK(weight != nullptr, source, ": 'model' describes a layer ", name, " of shape ",
               c10::IntArrayRef(expected), " but 'model_state_dict' has no '", name, "'");
    DKIT_CHECK(weight->sizes() == c10::IntArrayRef(expected), source, ": 'model' describes ", name, " as ",
               c10::IntArrayRef(expected), " but 'model_state_dict' holds ", weight->sizes());
    check_stored(*weight, name, source);
  }
}

} // namespace

PickleValue mlp_description(const MlpOptions& options) {
  PickleValue hidden = PickleValue::list();
  for (const int64_t width : options.hidden()) {
    hidden.push_back(width);
  }
  return PickleValue::dict({{"in_features", options.in_features()},
                            {"hidden", std::move(hidden)},
                            {"out_features", options.out_features()},
                            {"activation", to_string(options.activation())},
                            {"dropout", options.dropout()}});
}

MlpOptions mlp_options_from(const TrainingCheckpoint& checkpoint, const std::string& source) {
  DKIT_CHECK(!checkpoint.model.is_none(), source,
             ": the checkpoint is not of a dkit::Mlp (it has no 'model' entry describing one); load its "
             "model_state_dict into the module it was trained from (load_state_dict())");
  const Fields model(checkpoint.model, source + ": 'model'");
  std::vector<int64_t> hidden;
  const PickleValue& widths = model.get("hidden");
  DKIT_CHECK(widths.is_list() || widths.is_tuple(), model.where(), ": 'hidden' is not a list");
  for (const auto& width : widths.items()) {
    DKIT_CHECK(width.is_int(), model.where(), ": 'hidden' holds a ", width.type_name(), ", expected ints");
    hidden.push_back(width.to_int());
  }
  check_activation(model.text("activation"), model.where());
  MlpOptions options = MlpOptions(model.integer("in_features"), std::move(hidden), model.integer("out_features"))
                           .activation(parse_activation(model.text("activation")))
                           .dropout(model.number("dropout"))
                           .bias(checkpoint.model_state_dict.contains("0.bias"));
  check_model_entry(options, checkpoint.model_state_dict, source);
  return options;
}

Mlp mlp_from_state_dict(const StateDict& state_dict, const MlpFromStateDictOptions& options) {
  const std::string& source = options.source();
  std::vector<std::string> weights;
  std::vector<std::string> biases;
  std::set<std::string> used;
  for (const auto& item : state_dict) {
    if (item.value().dim() != 2) {
      continue;
    }
    const std::string& name = item.key();
    weights.push_back(name);
    used.insert(name);
    std::string bias;
    if (name == "weight") {
      bias = "bias";
    } else if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0) {
      bias = name.substr(0, name.size() - 6) + "bias";
    }
    const at::Tensor* tensor = bias.empty() ? nullptr : state_dict.find(bias);
    if (tensor == nullptr) {
      biases.emplace_back();
      continue;
    }
    DKIT_CHECK(tensor->dim() == 1 && tensor->size(0) == item.value().size(0), source, ": bias '", bias,
               "' has shape ", tensor->sizes(), " but its weight '", name, "' has shape ", item.value().sizes(),
               ", so the bias should have shape [", item.value().size(0), "]");
    biases.push_back(bias);
    used.insert(bias);
  }
  DKIT_CHECK(!weights.empty(), source, ": no 2-D weights in the state dict, so no Linear layers to build an MLP from");
  for (const auto& name : weights) {
    const at::Tensor& weight = state_dict[name];
    const auto stored = static_cast<int64_t>(weight.storage().nbytes() / weight.element_size());
    DKIT_CHECK(weight.numel() <= stored, source, ": '", name, "' has shape ", weight.sizes(), " but its storage holds ",
               stored, " values: an expanded view cannot be a layer's weight");
  }
  for (const auto& item : state_dict) {
    DKIT_CHECK(used.count(item.key()) != 0, source, ": tensor '", item.key(), "' of shape ", item.value().sizes(),
               " is not part of an MLP: only 2-D weights and the biases named like them are read");
  }
  const auto with_bias = std::count_if(biases.begin(), biases.end(), [](const auto& b) { return !b.empty(); });
  DKIT_CHECK(with_bias == 0 || static_cast<size_t>(with_bias) == biases.size(), source,
             ": some Linear layers have a bias and others do not; dkit::Mlp needs all or none");
  std::vector<int64_t> hidden;
  for (size_t i = 1; i < weights.size(); ++i) {
    const at::Tensor& previous = state_dict[weights[i - 1]];
    const at::Tensor& next = state_dict[weights[i]];
    DKIT_CHECK(previous.size(0) == next.size(1), source, ": layers '", weights[i - 1], "' ", previous.sizes(),
               " and '", weights[i], "' ", next.sizes(), " do not chain: the first gives ", previous.size(0),
               " features, the second takes ", next.size(1));
    hidden.push_back(previous.size(0));
  }
  const int64_t in_features = state_dict[weights.front()].size(1);
  const int64_t out_features = state_dict[weights.back()].size(0);
  Mlp net(MlpOptions(in_features, hidden, out_features).activation(options.activation()).bias(with_bias > 0));
  StateDict renamed("state dict key");
  for (size_t i = 0; i < weights.size(); ++i) {
    renamed.insert(std::to_string(2 * i) + ".weight", state_dict[weights[i]]);
    if (!biases[i].empty()) {
      renamed.insert(std::to_string(2 * i) + ".bias", state_dict[biases[i]]);
    }
  }
  load_state_dict(*net, renamed, LoadStateDictOptions().source(source));
  return net;
}

at::Tensor LoadedMlp::predict(const at::Tensor& inputs) const {
  const auto& weight = net->layers().front()->weight;
  at::Tensor x = inputs.to(weight.device(), weight.scalar_type());
  if (input_mean.defined()) {
    x = (x - input_mean) / input_std;
  }
  torch::NoGradGuard no_grad;
  return net.ptr()->forward(x);
}

LoadedMlp load_mlp(const std::string& path, const LoadMlpOptions& options) {
  const ReadOptions read_options = ReadOptions().limits(options.limits());
  if (!is_safetensors_path(path)) {
    return mlp_from(read_torch_file(path, read_options).root, path, options);
  }
  return mlp_from(detail::state_dict_value(read_safetensors(path, read_options).tensors, /*ordered=*/false), path,
                  options);
}

LoadedMlp mlp_from(const PickleValue& root, const std::string& source, const LoadMlpOptions& options) {
  LoadedMlp loaded;
  if (is_training_checkpoint(root)) {
    TrainingCheckpoint checkpoint = training_checkpoint_from(root, source);
    loaded.net = Mlp(mlp_options_from(checkpoint, source));
    load_state_dict(*loaded.net, checkpoint.model_state_dict, LoadStateDictOptions().source(source));
    loaded.input_mean = checkpoint.input_mean;
    loaded.input_std = checkpoint.input_std;
  } else {
    StateDict state_dict = state_dict_from(root, source, options.state_dict());
    const at::Tensor* mean = state_dict.find("input_mean");
    const at::Tensor* std = state_dict.find("input_std");
    DKIT_CHECK((mean == nullptr) == (std == nullptr), source, ": has only one of 'input_mean' and 'input_std'");
    if (mean != nullptr) {
      loaded.input_mean = *mean;
      loaded.input_std = *std;
      state_dict.erase("input_mean");
      state_dict.erase("input_std");
    }
    loaded.net =
        mlp_from_state_dict(state_dict, MlpFromStateDictOptions().activation(options.activation()).source(source));
  }
  const int64_t in_features = loaded.net->options.in_features();
  if (loaded.input_mean.defined()) {
    DKIT_CHECK(loaded.input_mean.sizes() == at::IntArrayRef{in_features} &&
                   loaded.input_std.sizes() == at::IntArrayRef{in_features},
               source, ": input_mean and input_std have shapes ", loaded.input_mean.sizes(), " and ",
               loaded.input_std.sizes(), ", expected [", in_features, "] for the model's ", in_features, " inputs");
    loaded.input_mean = loaded.input_mean.to(options.device(), at::kFloat);
    loaded.input_std = loaded.input_std.to(options.device(), at::kFloat);
  }
  place_module(loaded.net, options.device());
  loaded.net->eval();
  return loaded;
}

void export_mlp(const std::string& path, const LoadedMlp& model) {
  StateDict state_dict("state dict key");
  for (const auto& item : model.net->named_parameters()) {
    state_dict.insert(item.key(), item.value().detach());
  }
  if (model.input_mean.defined()) {
    state_dict.insert("input_mean", model.input_mean);
    state_dict.insert("input_std", model.input_std);
  }
  if (is_safetensors_path(path)) {
    write_safetensors(path, state_dict);
    return;
  }
  write_torch_file(path, detail::state_dict_value(state_dict, /*ordered=*/false));
}

} // namespace dkit
