#pragma once

#include <dkit/core/enum_names.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dkit {

/// The nonlinearity between an Mlp's Linear layers.
enum class Activation {
  /// `torch.nn.ReLU`.
  kReLU,
  /// `torch.nn.GELU` (exact, not the tanh approximation).
  kGELU,
  /// `torch.nn.Tanh`.
  kTanh,
};

/// The name of each Activation, as `model.activation`, checkpoints and `dkit predict --activation` spell it.
inline constexpr EnumNames<Activation, 3> kActivationNames = {{
    {Activation::kReLU, "relu"},
    {Activation::kGELU, "gelu"},
    {Activation::kTanh, "tanh"},
}};

/// Reads a name of kActivationNames; anything else is an error naming the accepted values.
Activation parse_activation(std::string_view name);

/// The lower-case name parse_activation() reads back.
std::string to_string(Activation activation);

/// Options for Mlp. Example:
/// ```
/// dkit::Mlp net(dkit::MlpOptions(/*in=*/20, /*hidden=*/{256}, /*out=*/10).dropout(0.1));
/// ```
struct MlpOptions {
  /// A network from `in_features` through each of `hidden` to `out_features`.
  MlpOptions(int64_t in_features, std::vector<int64_t> hidden, int64_t out_features);

  /// Size of each input sample.
  TORCH_ARG(int64_t, in_features);
  /// Width of each hidden layer, in order; empty for a single Linear layer.
  TORCH_ARG(std::vector<int64_t>, hidden);
  /// Size of each output sample.
  TORCH_ARG(int64_t, out_features);
  /// Nonlinearity after every layer but the last.
  TORCH_ARG(Activation, activation) = Activation::kReLU;
  /// Probability of zeroing a hidden activation in training; 0 disables dropout.
  TORCH_ARG(double, dropout) = 0.0;
  /// Whether the Linear layers learn a bias.
  TORCH_ARG(bool, bias) = true;
};

/// A multilayer perceptron: Linear, activation, [dropout,] ..., Linear. Its parameters are named as PyTorch's
/// `nn.Sequential(Linear, ReLU, Linear, ...)` names them (`0.weight`, `0.bias`, `2.weight`, ...), so its state
/// dict loads into that Python model and back. Dropout has no parameters and is applied in forward(), so it
/// never shifts those names.
class MlpImpl : public torch::nn::Cloneable<MlpImpl> {
 public:
  /// Builds the layers described by `options`.
  explicit MlpImpl(MlpOptions options);

  /// Creates and registers the Linear layers; called by the constructor and by clone().
  void reset() override;

  /// Logits for a batch `[N, in_features]`: `[N, out_features]`.
  torch::Tensor forward(torch::Tensor input);

  /// Prints `dkit::Mlp(in=64, hidden=[256, 256], out=10, activation=relu, dropout=0)`.
  void pretty_print(std::ostream& stream) const override;

  /// The Linear layers, input first.
  const std::vector<torch::nn::Linear>& layers() const {
    return layers_;
  }

  /// The options the network was built with.
  MlpOptions options;

 private:
  std::vector<torch::nn::Linear> layers_;
};

/// A module holder for MlpImpl, as `torch::nn::Linear` is for `LinearImpl`.
TORCH_MODULE(Mlp);

} // namespace dkit
