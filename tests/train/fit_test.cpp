#include <dkit/train/trainer.h>

#include <dkit/checkpoint/state_dict.h>
#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/data/dataset.h>
#include <dkit/device/host_sync.h>
#include <dkit/train/task.h>

#include "../checkpoint/python.h"
#include "../support.h"

#include <dkit/checkpoint/torch_file.h>
#include <dkit/core/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dkit {
namespace {

using test::error_message;

// A CNN with BatchNorm (buffers) and dropout (randomness): what a resumed run must restore besides the weights.
struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)))),
        norm(register_module("norm", torch::nn::BatchNorm2d(4))),
        drop(register_module("drop", torch::nn::Dropout(0.2))),
        fc(register_module("fc", torch::nn::Linear(4 * 4 * 4, 3))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(norm(conv(x))), 2);
    return fc(drop(x.flatten(1)));
  }

  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d norm;
  torch::nn::Dropout drop;
  torch::nn::Linear fc;
};
TORCH_MODULE(SmallCnn);

// 8x8 uint8 images of noise with a bright 4x4 block in the quadrant the label names (0, 1 or 2).
Dataset quadrant_images(int64_t n, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  Dataset data;
  data.labels = torch::randint(0, 3, {n}, generator);
  at::Tensor images = torch::randint(0, 100, {n, 1, 8, 8}, generator).to(torch::kUInt8);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = data.labels[i].item<int64_t>();
    images[i].narrow(1, (label / 2) * 4, 4).narrow(2, (label % 2) * 4, 4).add_(150);
  }
  data.features = images;
  data.num_classes = 3;
  data.description = "quadrant images";
  return data;
}

bool same_state(const StateDict& a, const StateDict& b) {
  if (a.keys() != b.keys()) {
    return false;
  }
  for (const auto& item : a) {
    if (!torch::equal(item.value(), b[item.key()])) {
      return false;
    }
  }
  return true;
}

bool same_tree(const PickleValue& a, const PickleValue& b) {
  std::vector<at::Tensor> left;
  std::vector<at::Tensor> right;
  for_each_tensor(a, [&](const std::string&, const PickleValue& t) { left.push_back(t.to_tensor()); });
  for_each_tensor(b, [&](const std::string&, const PickleValue& t) { right.push_back(t.to_tensor()); });
  if (left.size() != right.size()) {
    return false;
  }
  for (size_t i = 0; i < left.size(); ++i) {
    if (!torch::equal(left[i], right[i])) {
      return false;
    }
  }
  return true;
}

// A task of its own: the CNN, SGD with momentum, a StepLR each epoch, and a count of its training steps as state.
class CnnTask : public Task {
 public:
  CnnTask() {
    torch::manual_seed(3);
    net = SmallCnn();
  }

  torch::nn::Module& module() override {
    return *net;
  }
  std::vector<std::string> metric_names() const override {
    return {"accuracy"};
  }
  StepResult training_step(const Batch& batch) override {
    steps += net->is_training() ? 1 : 0;
    if (fail_at_step > 0 && steps == fail_at_step) {
      throw Error("the task failed on purpose");
    }
    const at::Tensor logits = net(batch.features);
    return {torch::nn::functional::cross_entropy(logits, batch.labels),
            {logits.argmax(1).eq(batch.labels).to(torch::kFloat).mean()}};
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizer() override {
    return std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  Scheduler configure_scheduler(torch::optim::Optimizer& optimizer, const TrainingPlan& /*plan*/) override {
    return {std::make_unique<torch::optim::StepLR>(optimizer, /*step_size=*/1, /*gamma=*/0.7),
            SchedulerInterval::kEpoch};
  }
  PickleValue state_dict() const override {
    return PickleValue::dict({{"steps", steps}});
  }
  void load_state_dict(const PickleValue& state, const std::string& /*source*/) override {
    steps = state.find("steps")->to_int();
  }

  SmallCnn net{nullptr};
  int64_t steps = 0;
  int64_t fail_at_step = 0;
};

class FitTest : public test::SeedingFixture {
 protected:
  FitTest() : train_(quadrant_images(240, 1)), val_(quadrant_images(60, 2)) {}

  TrainerOptions options(const std::string& name) const {
    return TrainerOptions(tmp_.file(name))
        .device("cpu")
        .epochs(3)
        .batch_size(16)
        .log_every(5)
        .checkpoint_every(10)
        .features_dtype(torch::kFloat)
        .features_divisor(255)
        .process_settings(true)
        .threads(1);
  }

  TrainingCheckpoint last(const std::string& name) const {
    return load_training_checkpoint(tmp_.file(name + "/checkpoints/last.pt"));
  }

  test::TempDir tmp_;
  Dataset train_;
  Dataset val_;
};

TEST_F(FitTest, TrainsACnnOnImagesScaledOnTheDeviceAndReadsTheDeviceOnlyAtFlushes) {
  CnnTask task;
  const TrainSummary summary = Trainer(options("run")).fit(task, train_, val_);
  EXPECT_EQ(summary.steps, 45);
  EXPECT_GT(summary.val_metric("accuracy"), 0.8) << test::read_file(tmp_.file("run/train.log"));
  EXPECT_EQ(summary.host_syncs, 45 / 5 + 3) << "one read per flush and one per validation";
  std::ifstream csv(tmp_.file("run/metrics.csv"));
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "step,epoch,loss,accuracy,lr,samples_per_second,val_loss,val_accuracy");
  const TrainingCheckpoint checkpoint = last("run");
  EXPECT_TRUE(checkpoint.model.is_none());
  EXPECT_TRUE(checkpoint.model_state_dict.contains("norm.running_mean"));
  EXPECT_TRUE(checkpoint.model_state_dict.contains("norm.num_batches_tracked"));
  EXPECT_EQ(checkpoint.task_state.find("steps")->to_int(), 45);
  EXPECT_EQ(checkpoint.scheduler_state_dict.find("step_count")->to_int(), 2) << "saved before the last epoch's end";
  const std::string config = checkpoint.config;
  EXPECT_NE(config.find("train:\n  epochs: 3\n"), std::string::npos) << config;
  EXPECT_EQ(test::read_file(tmp_.file("run/config.yaml")), config);
  EXPECT_EQ(std::get<int64_t>(parse_config(config, "config.yaml", ".").values.at("train.batch_size")), 16);
}

// A run that fails after its checkpoint at step 30 is continued from it: parameters, BatchNorm's buffers, the
// optimizer's momentum, the scheduler's position, dropout's generator and the task's own count end bitwise as in a
// run that never stopped, and metrics.csv holds each step once although the failed run had logged steps 31-34.
TEST_F(FitTest, AFailedRunContinuesFromItsCheckpointBitwise) {
  CnnTask whole;
  Trainer(options("whole").log_every(1)).fit(whole, train_, val_);
  CnnTask failing;
  failing.fail_at_step = 35;
  EXPECT_EQ(error_message([&] { Trainer(options("run").log_every(1)).fit(failing, train_, val_); }),
            "the task failed on purpose");
  CnnTask resumed;
  const TrainSummary summary = Trainer(options("run").log_every(1).auto_resume(true)).fit(resumed, train_, val_);
  EXPECT_EQ(summary.steps, 45);
  const TrainingCheckpoint a = last("whole");
  const TrainingCheckpoint b = last("run");
  EXPECT_TRUE(same_state(a.model_state_dict, b.model_state_dict));
  EXPECT_TRUE(same_tree(a.optimizer_state_dict, b.optimizer_state_dict));
  EXPECT_TRUE(same_tree(a.rng.cpu, b.rng.cpu));
  EXPECT_EQ(b.scheduler_state_dict.find("step_count")->to_int(), 2);
  EXPECT_EQ(b.task_state.find("steps")->to_int(), 45);
  std::istringstream csv(test::read_file(tmp_.file("run/metrics.csv")));
  std::vector<int64_t> train_steps;
  std::string line;
  std::getline(csv, line);
  while (std::getline(csv, line)) {
    if (line.back() == ',') {
      train_steps.push_back(std::stoll(line.substr(0, line.find(','))));
    }
  }
  std::vector<int64_t> expected(45);
  for (int64_t i = 0; i < 45; ++i) {
    expected[static_cast<size_t>(i)] = i + 1;
  }
  EXPECT_EQ(train_steps, expected);
}

// The checkpoint keeps PyTorch's layout: Python's torch.load(weights_only=True) reads it (PyTorch 2; 1.13's weights-only
// unpickler has no BINFLOAT, so there it reads it without), and the same CNN written in Python loads its
// model_state_dict strictly, computes the same logits and takes the optimizer's state.
TEST_F(FitTest, PythonLoadsTheCnnCheckpointWithWeightsOnly) {
  DKIT_SKIP_WITHOUT_PYTHON_TORCH();
  CnnTask task;
  Trainer(options("run").epochs(1)).fit(task, train_, val_);
  const at::Tensor x = val_.features.narrow(0, 0, 8).to(torch::kFloat) / 255;
  task.net->eval();
  const at::Tensor logits = task.net(x).detach();
  write_torch_file(tmp_.file("io.pt"), PickleValue::dict({{"x", x}, {"logits", logits}}));
  const auto result = test::run_python(tmp_.file("check.py"), R"(import sys, torch
from torch import nn
ck = torch.load(sys.argv[1], weights_only=int(torch.__version__.split(".")[0]) >= 2)
assert "model" not in ck and ck["task_state"] == {"steps": 15}, list(ck)
assert ck["scheduler_state_dict"] == {"step_count": 0}, ck["scheduler_state_dict"]
class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.drop, self.fc = nn.Dropout(0.2), nn.Linear(64, 3)
    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        return self.fc(self.drop(x.flatten(1)))
net = SmallCnn()
net.load_state_dict(ck["model_state_dict"], strict=True)
net.eval()
io = torch.load(sys.argv[2])
assert torch.allclose(net(io["x"]), io["logits"], atol=1e-5), (net(io["x"]) - io["logits"]).abs().max()
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
opt.load_state_dict(ck["optimizer_state_dict"])
print("ok")
)",
                                        tmp_.file("run/checkpoints/last.pt") + " " + tmp_.file("io.pt"));
  EXPECT_EQ(result.status, 0) << result.output;
}

// A user's torch::data dataset trains exactly as the tensors it serves.
class ImageDataset : public torch::data::datasets::Dataset<ImageDataset> {
 public:
  explicit ImageDataset(dkit::Dataset data) : data_(std::move(data)) {}
  torch::data::Example<> get(size_t index) override {
    return {data_.features[static_cast<int64_t>(index)], data_.labels[static_cast<int64_t>(index)]};
  }
  c10::optional<size_t> size() const override {
    return static_cast<size_t>(data_.size());
  }

 private:
  dkit::Dataset data_;
};

TEST_F(FitTest, ATorchDataDatasetTrainsAsItsTensors) {
  CnnTask from_tensors;
  Trainer(options("tensors").placement(Placement::kPinned)).fit(from_tensors, train_, val_);
  CnnTask from_samples;
  Trainer(options("samples").placement(Placement::kPinned))
      .fit(from_samples, samples_of(ImageDataset(train_)), samples_of(ImageDataset(val_)));
  EXPECT_TRUE(same_state(last("tensors").model_state_dict, last("samples").model_state_dict));
}

// The short case: any module holder with cross-entropy and accuracy, here a Sequential with Adam's default.
TEST_F(FitTest, AModuleTaskTrainsASequential) {
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(64, 16), torch::nn::ReLU(),
                            torch::nn::Linear(16, 3));
  ModuleTask task(net, ModuleTaskOptions().optimizer(make_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(1e-2))));
  EXPECT_EQ(task.metric_names(), std::vector<std::string>{"accuracy"});
  const TrainSummary summary = Trainer(options("run")).fit(task, train_, val_);
  EXPECT_GT(summary.val_metric("accuracy"), 0.8);
  EXPECT_EQ(last("run").model_state_dict.keys(), (std::vector<std::string>{"1.weight", "1.bias", "3.weight", "3.bias"}));
}

// What a user gets wrong is one line naming it; nothing is trained past it.
class BadTask : public Task {
 public:
  explicit BadTask(std::string what) : what_(std::move(what)) {}
  torch::nn::Module& module() override {
    return *net_;
  }
  std::vector<std::string> metric_names() const override {
    return {"accuracy"};
  }
  StepResult training_step(const Batch& batch) override {
    const at::Tensor flat = batch.features.flatten(1);
    const at::Tensor logits = net_(what_ == "refused" ? batch.features : flat);
    auto reduction = torch::nn::functional::CrossEntropyFuncOptions();
    if (what_ == "loss") {
      reduction.reduction(torch::kNone);
    }
    const at::Tensor loss = torch::nn::functional::cross_entropy(logits, batch.labels, reduction);
    const at::Tensor right = logits.argmax(1).eq(batch.labels).to(torch::kFloat);
    return {loss, {what_ == "metric" ? right : right.mean()}};
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizer() override {
    auto params = net_->parameters();
    if (what_ == "device") {
      params.push_back(torch::zeros({3}, torch::TensorOptions().device(torch::kMeta)).set_requires_grad(true));
    }
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  }

 private:
  std::string what_;
  torch::nn::Linear net_{64, 3};
};

TEST_F(FitTest, BadTaskOutputsAreOneLineErrors) {
  const auto fail = [&](const std::string& what) {
    BadTask task(what);
    return error_message([&] { Trainer(options(what)).fit(task, train_, val_); });
  };
  EXPECT_EQ(fail("loss"),
            "training_step returned a loss of shape [16] (float32): a loss must be a 0-d floating-point tensor, the "
            "mean over the batch (reduce it, e.g. with .mean())");
  EXPECT_EQ(fail("metric"), "training_step returned metric 'accuracy' of shape [16] (float32): a metric must be a 0-d "
                            "tensor, the mean over the batch");
  EXPECT_EQ(fail("refused").rfind("training_step failed on a batch of features [16, 1, 8, 8] (float32) and labels "
                                  "[16] (int64) in module Linear (195 parameters): ",
                                  0),
            0u)
      << fail("refused");
  EXPECT_EQ(fail("device"), "a parameter of the optimizer (not the module's) is on meta but the run's device is cpu: "
                            "every parameter must be on one device (Task::module() and its optimizer)");
  EXPECT_NE(test::read_file(tmp_.file("loss/train.log")).find("[error] training_step returned a loss"),
            std::string::npos);
}

TEST_F(FitTest, ResumingAnotherArchitectureOrOptimizerNamesBoth) {
  CnnTask task;
  Trainer(options("run").epochs(1)).fit(task, train_, val_);
  const std::string file = tmp_.file("run/checkpoints/last.pt");
  torch::nn::Sequential other(torch::nn::Flatten(), torch::nn::Linear(64, 3));
  ModuleTask wrong_module(other);
  EXPECT_EQ(error_message([&] { Trainer(options("run").auto_resume(true)).fit(wrong_module, train_, val_); }),
            "Error(s) in loading state_dict for Sequential from " + file +
                ": Missing key(s) in state_dict: \"1.weight\", \"1.bias\". Unexpected key(s) in state_dict: "
                "\"conv.weight\", \"conv.bias\", \"norm.weight\", \"norm.bias\", \"norm.running_mean\", "
                "\"norm.running_var\", \"norm.num_batches_tracked\", \"fc.weight\", \"fc.bias\".");
  SmallCnn same;
  ModuleTask wrong_optimizer(same);
  EXPECT_EQ(error_message([&] { Trainer(options("run").auto_resume(true)).fit(wrong_optimizer, train_, val_); }),
            file + ": it holds the state of a torch.optim.SGD, but the optimizer is a torch::optim::Adam; resume with "
                   "the optimizer it was saved with");
}

// A loss that turns NaN stops the run at the next flush; the checkpoint before it stays the newest.
TEST_F(FitTest, ANanLossStopsTheRunAndKeepsTheLastGoodCheckpoint) {
  class Diverging : public CnnTask {
    StepResult training_step(const Batch& batch) override {
      StepResult result = CnnTask::training_step(batch);
      if (steps >= 23) {
        result.loss = result.loss * std::numeric_limits<float>::quiet_NaN();
      }
      return result;
    }
  } task;
  EXPECT_EQ(error_message([&] { Trainer(options("run")).fit(task, train_, val_); }),
            "training diverged: the loss is nan at step 25 (epoch 2); no checkpoint was written after it, the last "
            "good one is in '" +
                tmp_.file("run/checkpoints") + "'; lower train.lr");
  EXPECT_EQ(last("run").step, 20);
}


// tests/fixtures/conveniences_oracle.pt (tests/fixtures/make_conveniences_fixture.py, PyTorch 1.13): Python's
// torch.nn.utils.clip_grad_norm_ on fixed gradients. dkit's clip takes the same operations, so the same rounding.
TEST_F(FitTest, ClipGradNormMatchesPythons) {
  const PickleValue root = read_torch_file(test::fixture("conveniences_oracle.pt")).root;
  const auto& cases = root.find("clip")->items();
  ASSERT_EQ(cases.size(), 3u);
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    std::vector<at::Tensor> params;
    for (const auto& grad : cases[c].find("grads")->items()) {
      params.push_back(torch::zeros_like(grad.to_tensor()).requires_grad_());
      params.back().mutable_grad() = grad.to_tensor().clone();
    }
    const at::Tensor total = clip_grad_norm(params, cases[c].find("max_norm")->to_double());
    EXPECT_TRUE(torch::equal(total, cases[c].find("total_norm")->to_tensor()))
        << total << " " << cases[c].find("total_norm")->to_tensor();
    const auto& clipped = cases[c].find("clipped")->items();
    for (size_t p = 0; p < params.size(); ++p) {
      EXPECT_TRUE(torch::allclose(params[p].grad(), clipped[p].to_tensor(), /*rtol=*/1e-6, /*atol=*/0))
          << "parameter " << p;
    }
  }
}

// The same fixture's warm-up + cosine schedules: PyTorch's LambdaLR over SGD with the lambda WarmupLR computes. The
// learning rate at every optimizer step is the same double.
TEST_F(FitTest, WarmupLrMatchesLambdaLrAtEveryStep) {
  const PickleValue root = read_torch_file(test::fixture("conveniences_oracle.pt")).root;
  for (const auto& oracle : root.find("schedule")->items()) {
    const int64_t total = oracle.find("total_steps")->to_int();
    SCOPED_TRACE("total_steps " + std::to_string(total));
    at::Tensor param = torch::zeros({1}, torch::requires_grad());
    torch::optim::SGD sgd({param}, torch::optim::SGDOptions(oracle.find("lr")->to_double()));
    WarmupLR schedule(sgd, WarmupScheduleOptions(total)
                               .warmup_steps(oracle.find("warmup_steps")->to_int())
                               .min_factor(oracle.find("min_factor")->to_double()));
    const auto& lrs = oracle.find("lrs")->items();
    for (size_t step = 0; step < lrs.size(); ++step) {
      EXPECT_EQ(sgd.param_groups()[0].options().get_lr(), lrs[step].to_double()) << "step " << step;
      schedule.step();
    }
  }
}

// A task over a network without BatchNorm or dropout, trained with plain SGD, for the tests that compare runs
// whose batches differ.
class LinearTask : public ModuleTask {
 public:
  explicit LinearTask(double lr = 0.1)
      : ModuleTask(make_net(), ModuleTaskOptions().optimizer(
                                   make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(lr).momentum(0.9)))) {}

 private:
  static torch::nn::Sequential make_net() {
    torch::manual_seed(11);
    return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(64, 16), torch::nn::Tanh(),
                                 torch::nn::Linear(16, 3));
  }
};

// Four batches of 8 summed into each step train as one batch of 32: the same samples in the same order, the mean
// over the 32; the last window of an epoch (240 samples: 30 batches of 8) holds two batches, as the last batch of 32
// holds 16 samples.
TEST_F(FitTest, AccumulatingFourBatchesOfEightTrainsAsBatchesOf32) {
  LinearTask whole;
  const TrainSummary a = Trainer(options("whole").batch_size(32)).fit(whole, train_, val_);
  LinearTask accumulated;
  const TrainSummary b =
      Trainer(options("accumulated").batch_size(8).accumulate_grad_batches(4)).fit(accumulated, train_, val_);
  EXPECT_EQ(a.steps, 24);
  EXPECT_EQ(b.steps, 24);
  EXPECT_EQ(b.samples, a.samples);
  const StateDict left = last("whole").model_state_dict;
  const StateDict right = last("accumulated").model_state_dict;
  for (const auto& item : left) {
    EXPECT_LE((item.value() - right[item.key()]).abs().max().item<double>(), 1e-6) << item.key();
  }
  EXPECT_NE(test::read_file(tmp_.file("accumulated/train.log")).find("each optimizer step: the gradients of 4 batches summed"),
            std::string::npos);
}

// Clipping to a tiny norm makes every update tiny: the parameters move, but by at most lr x the norm a step.
TEST_F(FitTest, ClippingBoundsEachUpdate) {
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(64, 3));
  const at::Tensor before = net->parameters()[0].detach().clone();
  ModuleTask task(net, ModuleTaskOptions().optimizer(make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(1.0))));
  Trainer(options("run").epochs(1).max_steps(5).clip_grad_norm(1e-3)).fit(task, train_, val_);
  const double moved = (net->parameters()[0].detach() - before).norm().item<double>();
  EXPECT_GT(moved, 0.0);
  EXPECT_LE(moved, 5 * 1e-3 * (1 + 1e-5));
}

// Under fp16 the GradScaler's gradients are unscaled before they are clipped: each update is bounded by lr x the
// norm, not by lr x the norm / the scale (65,536 at first), which clipping the scaled gradients would give.
TEST_F(FitTest, ClippingUnderFp16ClipsTheUnscaledGradients) {
  try {
    check_autocast(c10::DeviceType::CPU, at::kHalf);
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(64, 3));
  const at::Tensor before = net->parameters()[0].detach().clone();
  ModuleTask task(net, ModuleTaskOptions().optimizer(make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(1.0))));
  const TrainSummary summary =
      Trainer(options("run").epochs(1).max_steps(5).clip_grad_norm(1e-3).precision(Precision::kFloat16))
          .fit(task, train_, val_);
  EXPECT_EQ(summary.steps, 5);
  const double moved = (net->parameters()[0].detach() - before).norm().item<double>();
  EXPECT_GT(moved, 1e-4) << "steps of about 1e-3, not of 1e-3 / 65536";
  EXPECT_LE(moved, 5 * 1e-3 * (1 + 1e-3));
  EXPECT_FALSE(last("run").scaler_state_dict.is_none());
}

// With a learning rate of 0 the validation loss never improves after the first epoch: patience 2 stops the run after
// the third, with a checkpoint, says why, and a run started again on the folder trains nothing more.
TEST_F(FitTest, EarlyStoppingEndsTheRunAndARestartStaysStopped) {
  const auto opts = [&] { return options("run").epochs(10).early_stopping_patience(2).auto_resume(true); };
  LinearTask task(/*lr=*/0.0);
  const TrainSummary summary = Trainer(opts()).fit(task, train_, val_);
  EXPECT_EQ(summary.steps, 3 * 15);
  EXPECT_EQ(summary.stop_reason, StopReason::kEarlyStopping);
  EXPECT_EQ(last("run").step, 45);
  const std::string log = test::read_file(tmp_.file("run/train.log"));
  EXPECT_NE(log.find("early stopping after step 45: val_loss did not improve for 2 validation(s) (best "),
            std::string::npos)
      << log;
  const std::string json = test::read_file(tmp_.file("run/summary.json"));
  EXPECT_NE(json.find("\"stop_reason\":\"early_stopping\",\"monitor\":\"val_loss\""), std::string::npos) << json;
  LinearTask again(/*lr=*/0.0);
  const TrainSummary restarted = Trainer(opts()).fit(again, train_, val_);
  EXPECT_EQ(restarted.steps, 45);
  EXPECT_EQ(restarted.stop_reason, StopReason::kEarlyStopping);
}

// save_top_k keeps the checkpoints of the two best validation accuracies, named by epoch, step and value.
TEST_F(FitTest, SaveTopKKeepsTheBestCheckpointsByTheMonitor) {
  std::vector<std::pair<double, int64_t>> validations;
  CnnTask task;
  const TrainSummary summary =
      Trainer(options("run")
                  .epochs(4)
                  .save_top_k(2)
                  .monitor("val_accuracy")
                  .monitor_mode(MonitorMode::kMax)
                  .on_validation_end([&](const ValidationResult& r) {
                    validations.emplace_back(r.metrics[0].second, r.step);
                  }))
          .fit(task, train_, val_);
  ASSERT_EQ(validations.size(), 4u);
  std::vector<std::string> expected;
  for (size_t e = 0; e < validations.size(); ++e) {
    expected.push_back("best-epoch=" + std::to_string(e + 1) + "-step=" + std::to_string(validations[e].second) +
                       "-val_accuracy=" + format_fixed(validations[e].first, 4) + ".pt");
  }
  std::vector<size_t> order{0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return validations[a].first > validations[b].first; });
  std::vector<std::string> kept;
  for (const auto& entry : std::filesystem::directory_iterator(tmp_.file("run/checkpoints"))) {
    if (entry.path().filename().string().rfind("best-", 0) == 0) {
      kept.push_back(entry.path().filename().string());
    }
  }
  std::sort(kept.begin(), kept.end());
  std::vector<std::string> best{expected[order[0]], expected[order[1]]};
  std::sort(best.begin(), best.end());
  EXPECT_EQ(kept, best);
  EXPECT_EQ(summary.best_value, validations[order[0]].first);
  EXPECT_EQ(summary.best_checkpoint, tmp_.file("run/checkpoints/" + expected[order[0]]));
  EXPECT_EQ(load_training_checkpoint(summary.best_checkpoint).step, validations[order[0]].second);
}

// A max_time already spent stops the run after its first step with a checkpoint; the next run continues it and ends
// bitwise as a run never stopped.
TEST_F(FitTest, MaxTimeStopsAfterAStepAndTheNextRunContinuesBitwise) {
  CnnTask whole;
  Trainer(options("whole")).fit(whole, train_, val_);
  CnnTask first;
  const TrainSummary stopped = Trainer(options("run").max_time(1e-9)).fit(first, train_, val_);
  EXPECT_EQ(stopped.steps, 1);
  EXPECT_EQ(stopped.stop_reason, StopReason::kMaxTime);
  EXPECT_NE(test::read_file(tmp_.file("run/train.log")).find("stopped after step 1: max_time of 1e-09 s spent"),
            std::string::npos);
  CnnTask rest;
  const TrainSummary finished = Trainer(options("run").auto_resume(true)).fit(rest, train_, val_);
  EXPECT_EQ(finished.steps, 45);
  EXPECT_EQ(finished.stop_reason, StopReason::kNone);
  EXPECT_TRUE(same_state(last("whole").model_state_dict, last("run").model_state_dict));
  EXPECT_TRUE(same_tree(last("whole").optimizer_state_dict, last("run").optimizer_state_dict));
}

TEST_F(FitTest, BadConvenienceOptionsAreOneLineErrors) {
  const auto fail = [&](TrainerOptions opts) {
    CnnTask task;
    return error_message([&] { Trainer(std::move(opts)).fit(task, train_, val_); });
  };
  EXPECT_EQ(fail(options("a").save_top_k(1).monitor("val_acc")),
            "TrainerOptions::monitor (train.monitor) is 'val_acc', which is none of this task's validation figures: "
            "val_loss, val_accuracy");
  EXPECT_EQ(fail(options("b").accumulate_grad_batches(0)),
            "TrainerOptions::accumulate_grad_batches must be at least 1, got 0");
  EXPECT_EQ(fail(options("c").clip_grad_norm(-1)),
            "TrainerOptions::clip_grad_norm must be at least 0 (0: no clipping), got -1");
  CnnTask task;
  EXPECT_EQ(error_message([&] { Trainer(options("d").early_stopping_patience(1)).fit(task, train_); }),
            "save_top_k and early stopping watch val_loss, but the run has no validation data");
}
} // namespace
} // namespace dkit
