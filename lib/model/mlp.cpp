#include <dkit/model/mlp.h>

#include <dkit/core/error.h>
#include <dkit/device/device.h>

#include <torch/torch.h>

namespace dkit {

Activation parse_activation(std::string_view name) {
  return parse_name(kActivationNames, name, "activation");
}

std::string to_string(Activation activation) {
  return std::string(name_of(kActivationNames, activation));
}

MlpOptions::MlpOptions(int64_t in_features, std::vector<int64_t> hidden, int64_t out_features)
    : in_features_(in_features), hidden_(std::move(hidden)), out_features_(out_features) {}

MlpImpl::MlpImpl(MlpOptions options_) : options(std::move(options_)) {
  reset();
}

void MlpImpl::reset() {
  DKIT_CHECK(options.in_features() > 0, "Mlp in_features must be positive, got ", options.in_features());
  DKIT_CHECK(options.out_features() > 0, "Mlp out_features must be positive, got ", options.out_features());
  for (size_t i = 0; i < options.hidden().size(); ++i) {
    DKIT_CHECK(options.hidden()[i] > 0, "Mlp hidden size ", i, " must be positive, got ", options.hidden()[i]);
  }
  DKIT_CHECK(options.dropout() >= 0.0 && options.dropout() < 1.0, "Mlp dropout must be in [0, 1), got ",
             options.dropout());
  layers_.clear();
  std::vector<int64_t> sizes{options.in_features()};
  sizes.insert(sizes.end(), options.hidden().begin(), options.hidden().end());
  sizes.push_back(options.out_features());
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    auto linear = torch::nn::Linear(torch::nn::LinearOptions(sizes[i], sizes[i + 1]).bias(options.bias()));
    layers_.push_back(register_module(std::to_string(2 * i), linear));
  }
}

torch::Tensor MlpImpl::forward(torch::Tensor input) {
  const auto& first = layers_.front()->weight;
  DKIT_CHECK(input.dim() == 2 && input.size(1) == options.in_features(), "Mlp expects input of shape [N, ",
              options.in_features(), "], got ", input.sizes());
  check_same_device({{"input", input}, {"0.weight", first}});
  torch::Tensor x = std::move(input);
  for (size_t i = 0; i < layers_.size(); ++i) {
    x = layers_[i]->forward(x);
    if (i + 1 == layers_.size()) {
      break;
    }
    switch (options.activation()) {
      case Activation::kReLU: x = torch::relu(x); break;
      case Activation::kGELU: x = torch::gelu(x); break;
      case Activation::kTanh: x = torch::tanh(x); break;
    }
    if (options.dropout() > 0.0) {
      x = torch::dropout(x, options.dropout(), is_training());
    }
  }
  return x;
}

void MlpImpl::pretty_print(std::ostream& stream) const {
  stream << "dkit::Mlp(in=" << options.in_features() << ", hidden=[";
  for (size_t i = 0; i < options.hidden().size(); ++i) {
    stream << (i == 0 ? "" : ", ") << options.hidden()[i];
  }
  stream << "], out=" << options.out_features() << ", activation=" << to_string(options.activation())
         << ", dropout=" << options.dropout() << ")";
}

} // namespace dkit
