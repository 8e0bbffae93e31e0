#include <dkit/checkpoint/training_checkpoint.h>

#include <dkit/checkpoint/detail/state_dict_value.h>
#include <dkit/checkpoint/safetensors.h>
#include <dkit/core/error.h>
#include <dkit/device/device.h>

#include <torch/torch.h>

namespace dkit {

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
    loaded.net = Mlp(checkpoint.model);
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
