// LeNet as Dive into Deep Learning writes it (chapter 7, with ReLU and max pooling) trained on Fashion-MNIST by
// dkit's Trainer, on the GPU when there is one:
//
//   lenet --data DIR|synthetic --out DIR [--epochs N] [--max-steps N] [--batch-size N] [--lr X] [--seed N]
//         [--checkpoint-every N] [--device D] [--precision fp32|bf16|fp16]
//
// SGD with momentum 0.9 (learning rate --lr, 0.05 by default) on batches of 256 reaches 0.89 validation accuracy in
// 10 epochs. DIR holds Fashion-MNIST's IDX files (Debian's dataset-fashion-mnist installs them in
// /usr/share/datasets/fashion-mnist); `synthetic` trains on generated 28x28 images instead. The run folder gets
// train.log, metrics.csv, summary.json and checkpoints/; a run started again with the same --out continues from its
// newest checkpoint, and SIGINT or SIGTERM stops it with one. Under torchrun each process trains its share.
#include <dkit/dkit.h>

#include <torch/torch.h>

#include <iostream>
#include <map>
#include <string>

namespace {

torch::nn::Sequential lenet() {
  using namespace torch::nn;
  return Sequential(Conv2d(Conv2dOptions(1, 6, 5).padding(2)), ReLU(), MaxPool2d(MaxPool2dOptions(2)),
                    Conv2d(Conv2dOptions(6, 16, 5)), ReLU(), MaxPool2d(MaxPool2dOptions(2)), Flatten(),
                    Linear(16 * 5 * 5, 120), ReLU(), Linear(120, 84), ReLU(), Linear(84, 10));
}

// `--name value` pairs over defaults; an unknown name or a missing value is an error naming it.
std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> args = {
      {"data", ""},        {"out", ""},   {"epochs", "10"}, {"max-steps", "0"},   {"batch-size", "256"},
      {"lr", "0.05"},       {"seed", "0"}, {"device", "auto"}, {"checkpoint-every", "500"}, {"precision", "fp32"}};
  for (int i = 1; i < argc; i += 2) {
    const std::string name = std::string(argv[i]).substr(2);
    DKIT_CHECK(std::string(argv[i]).rfind("--", 0) == 0 && args.count(name) == 1 && i + 1 < argc,
               "lenet: unknown option or missing value: ", argv[i]);
    args[name] = argv[i + 1];
  }
  DKIT_CHECK(!args["data"].empty() && !args["out"].empty(), "lenet: --data DIR|synthetic and --out DIR are needed");
  return args;
}

} // namespace

int main(int argc, char** argv) try {
  auto args = parse(argc, argv);
  torch::manual_seed(std::stoll(args["seed"]));
  torch::nn::Sequential net = lenet();
  for (auto& module : net->modules(/*include_self=*/false)) {  // d2l initialises LeNet's weights with Xavier.
    if (auto* conv = module->as<torch::nn::Conv2d>()) torch::nn::init::xavier_uniform_(conv->weight);
    if (auto* linear = module->as<torch::nn::Linear>()) torch::nn::init::xavier_uniform_(linear->weight);
  }

  const dkit::DatasetSplit data =
      args["data"] == "synthetic"
          ? dkit::split(dkit::make_synthetic_images(5120, 28, 10), /*val_fraction=*/0.2, /*seed=*/0)
          : dkit::DatasetSplit{dkit::read_mnist_images(args["data"]), dkit::read_mnist_images(args["data"], false)};
  dkit::ModuleTask task(net, dkit::ModuleTaskOptions().optimizer(dkit::make_optimizer<torch::optim::SGD>(
                                 torch::optim::SGDOptions(std::stod(args["lr"])).momentum(0.9))));
  dkit::TrainerOptions options(args["out"]);
  options.device(args["device"])
      .epochs(std::stoll(args["epochs"]))
      .max_steps(std::stoll(args["max-steps"]))
      .batch_size(std::stoll(args["batch-size"]))
      .checkpoint_every(std::stoll(args["checkpoint-every"]))
      .precision(dkit::parse_name(dkit::kPrecisionNames, args["precision"], "precision"))
      .seed(std::stoll(args["seed"]))
      .features_dtype(torch::kFloat)
      .features_divisor(255)
      .auto_resume(true)
      .stop(dkit::stop_on_signals())
      .on_log([](const dkit::LogLine& line) { std::cerr << line.text << "\n"; });
  const dkit::TrainSummary summary = dkit::Trainer(options).fit(task, data.train, data.val);
  if (!summary.checkpoint.empty()) {  // rank 0, the one that writes the run folder
    std::cout << dkit::summary_to_json(summary);
  }
  return summary.stopped_by_signal != 0 ? 128 + summary.stopped_by_signal : 0;
} catch (const std::exception& e) {
  std::cerr << "lenet: error: " << e.what() << "\n";
  return 1;
}
