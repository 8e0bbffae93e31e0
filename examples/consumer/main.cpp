// Runs a small dkit::Mlp on the first GPU when there is one, otherwise on the CPU; then trains a module of its own
// with dkit's Trainer: a few steps on synthetic data in a temporary run folder, with this program's own progress
// lines and stop request.
#include <dkit/dkit.h>

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

int main() {
  const dkit::Device device = dkit::try_gpu();
  dkit::Mlp net(dkit::MlpOptions(/*in_features=*/8, /*hidden=*/{16}, /*out_features=*/3));
  dkit::place_module(net, device);
  net->eval();
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor input = torch::randn({4, 8}, torch::TensorOptions().device(device));
    const torch::Tensor output = net->forward(input);
    std::cout << "dkit " << DKIT_VERSION << ": output " << output.sizes() << " on " << output.device() << "\n";
  }

  const auto run_dir = std::filesystem::temp_directory_path() / "dkit-consumer-run";
  std::filesystem::remove_all(run_dir);
  const dkit::DatasetSplit data = dkit::split(
      dkit::make_synthetic(dkit::SyntheticOptions(/*samples=*/200, /*features=*/8, /*classes=*/3)), /*val_fraction=*/0.2,
      /*seed=*/0);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  dkit::ModuleTask task(model);
  auto stop = std::make_shared<dkit::StopRequest>();
  dkit::TrainerOptions options(run_dir.string());
  options.device(device.str()).epochs(1).batch_size(16).log_every(5).stop(stop).on_progress(
      [](const dkit::ProgressUpdate& update) { std::cout << "step " << update.step << "/" << update.total_steps << "\n"; });
  const dkit::TrainSummary summary = dkit::Trainer(std::move(options)).fit(task, data.train, data.val);
  std::cout << "trained " << summary.steps << " steps on " << summary.device << "\n";
  std::filesystem::remove_all(run_dir);
  return summary.steps > 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
