// Runs a small dkit::Mlp on the first GPU when there is one, otherwise on the CPU.
#include <dkit/dkit.h>

#include <torch/torch.h>

#include <iostream>

int main() {
  const dkit::Device device = dkit::try_gpu();
  dkit::Mlp net(dkit::MlpOptions(/*in_features=*/8, /*hidden=*/{16}, /*out_features=*/3));
  dkit::place_module(net, device);
  net->eval();

  torch::NoGradGuard no_grad;
  const torch::Tensor input = torch::randn({4, 8}, torch::TensorOptions().device(device));
  const torch::Tensor output = net->forward(input);
  std::cout << "dkit " << DKIT_VERSION << ": output " << output.sizes() << " on " << output.device() << "\n";
  return 0;
}
