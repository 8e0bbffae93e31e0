#pragma once

// The `lenet` suite's model, data and loops (bench/lenet_suite.cpp), and the program that runs one loop alone for
// callgrind (bench/lenet_steps.cpp).

#include <dkit/data/dataset.h>

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace dkit::bench::detail {

/// Where Debian's dataset-fashion-mnist puts Fashion-MNIST.
inline constexpr const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

/// Steps between the reads of the loss, in every loop: TrainerOptions' default `log_every`.
inline constexpr int64_t kLenetFlush = 50;

/// The learning rate of every loop's SGD.
inline constexpr double kLenetLr = 0.1;

/// d2l's LeNet (chapter 7, ReLU and max pooling) as a Sequential, LibTorch's default initialisation.
torch::nn::Sequential lenet();

/// The images the loops train on: Fashion-MNIST's training set (uint8 `[60000, 1, 28, 28]`) when `folder` has it,
/// else 10,000 synthetic images of the same shape.
Dataset lenet_data(const std::string& folder);

/// A bare hand-written LibTorch loop doing the Trainer's steps: the batches of its Loader's order (sample_order()
/// with seed 0), gathered from the uint8 images, converted to float32 and divided by 255, forward,
/// cross-entropy, gradients set to none, backward, SGD; the loss summed on the device and read every kLenetFlush
/// steps.
class LenetLoop {
 public:
  /// A loop training `net` on `data` in batches of `batch`.
  LenetLoop(torch::nn::Sequential net, Dataset data, int64_t batch);
  /// One step.
  void step();

 private:
  torch::nn::Sequential net_;
  Dataset data_;
  int64_t batch_;
  torch::optim::SGD optimizer_;
  at::Tensor order_;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
  int64_t steps_ = 0;
  at::Tensor loss_sum_;
};

/// Trains `net` on `data` for `steps` steps of `batch` with dkit::Trainer (a ModuleTask without metrics, SGD, no
/// validation, a run folder under `folder`) and returns the seconds its steps took (TrainSummary::train_seconds).
double trainer_seconds(const torch::nn::Sequential& net, const Dataset& data, int64_t batch, int64_t steps,
                       const std::string& folder);

} // namespace dkit::bench::detail
