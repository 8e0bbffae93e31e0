#include <dkit/bench/lenet_common.h>

#include <dkit/train/task.h>
#include <dkit/train/trainer.h>

#include <filesystem>

namespace dkit::bench::detail {

torch::nn::Sequential lenet() {
  using namespace torch::nn;
  return Sequential(Conv2d(Conv2dOptions(1, 6, 5).padding(2)), ReLU(), MaxPool2d(MaxPool2dOptions(2)),
                    Conv2d(Conv2dOptions(6, 16, 5)), ReLU(), MaxPool2d(MaxPool2dOptions(2)), Flatten(),
                    Linear(16 * 5 * 5, 120), ReLU(), Linear(120, 84), ReLU(), Linear(84, 10));
}

Dataset lenet_data(const std::string& folder) {
  std::error_code error;
  if (std::filesystem::exists(std::filesystem::path(folder) / "train-images-idx3-ubyte.gz", error)) {
    return read_mnist_images(folder);
  }
  return make_synthetic_images(10000, 28, 10);
}

LenetLoop::LenetLoop(torch::nn::Sequential net, Dataset data, int64_t batch)
    : net_(std::move(net)),
      data_(std::move(data)),
      batch_(batch),
      optimizer_(net_->parameters(), torch::optim::SGDOptions(kLenetLr)),
      loss_sum_(torch::zeros({})) {
  net_->train();
}

void LenetLoop::step() {
  const int64_t n = data_.size();
  if (!order_.defined() || position_ >= n) {
    order_ = sample_order(n, /*seed=*/0, epoch_++);
    position_ = 0;
  }
  const at::Tensor index = order_.narrow(0, position_, std::min(batch_, n - position_));
  position_ += batch_;
  const at::Tensor x = data_.features.index_select(0, index).to(torch::kFloat).div_(255);
  const at::Tensor y = data_.labels.index_select(0, index);
  for (auto& parameter : net_->parameters()) {
    parameter.mutable_grad() = at::Tensor();
  }
  const at::Tensor loss = torch::nn::functional::cross_entropy(net_->forward(x), y);
  loss.backward();
  optimizer_.step();
  loss_sum_ += loss.detach();
  if (++steps_ % kLenetFlush == 0) {
    (void)loss_sum_.item<float>();
    loss_sum_.zero_();
  }
}

double trainer_seconds(const torch::nn::Sequential& net, const Dataset& data, int64_t batch, int64_t steps,
                       const std::string& folder) {
  ModuleTask task(net, ModuleTaskOptions().metrics({}).optimizer(
                           make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(kLenetLr))));
  std::filesystem::remove_all(folder);
  TrainerOptions options(folder);
  options.device("cpu")
      .epochs(1000000)
      .max_steps(steps)
      .batch_size(batch)
      .log_every(kLenetFlush)
      .checkpoint_every(0)
      .keep_checkpoints(1)
      .features_dtype(torch::kFloat)
      .features_divisor(255)
      .join_launch(false)
      .data_checksum("the lenet suite's images");
  const TrainSummary summary = Trainer(options).fit(task, data);
  std::filesystem::remove_all(folder);
  return summary.train_seconds;
}

} // namespace dkit::bench::detail
