// A CNN trained by dkit's Trainer, for the tests that kill, resume and launch processes (cnn_process_test.cpp and
// tests/distributed): synthetic 16x16 images, a convolution, optional BatchNorm and dropout, a linear layer.
//
//   dkit_cnn_run --out DIR [--epochs N] [--max-steps N] [--batch-size N] [--log-every N] [--checkpoint-every N]
//                [--precision fp32|bf16|fp16] [--batch-norm 0|1] [--dropout P] [--scheduler 0|1] [--buffers 0|1]
//                [--accumulate N] [--clip X] [--warmup N] [--max-time S] [--save-top-k K] [--patience N]
//
// --scheduler 1 steps a StepLR each epoch; --warmup N (N > 0) instead steps a warm-up of N steps and a cosine each
// optimizer step. --accumulate, --clip, --max-time, --save-top-k and --patience set the TrainerOptions of those names
// (save_top_k and patience watch val_loss).
//
// Every log line goes to stderr. A run started again with the same --out continues from its newest checkpoint.
// With --buffers 1 each training step first prints `rank R step S buffers SUM`, the sum of the module's buffers as
// that step finds them (after the previous step's broadcast), on every rank.
#include <dkit/dkit.h>

#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <string>

namespace {

struct CnnImpl : torch::nn::Module {
  CnnImpl(bool batch_norm, double dropout)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 3).padding(1)))),
        drop(register_module("drop", torch::nn::Dropout(dropout))),
        fc(register_module("fc", torch::nn::Linear(6 * 8 * 8, 10))) {
    if (batch_norm) {
      norm = register_module("norm", torch::nn::BatchNorm2d(6));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = conv(x);
    if (norm) {
      x = norm(x);
    }
    return fc(drop(torch::max_pool2d(torch::relu(x), 2).flatten(1)));
  }

  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d norm{nullptr};
  torch::nn::Dropout drop;
  torch::nn::Linear fc;
};
TORCH_MODULE(Cnn);

class CnnTask : public dkit::Task {
 public:
  CnnTask(Cnn net, bool scheduler, int64_t warmup, bool buffers)
      : net_(std::move(net)), scheduler_(scheduler), warmup_(warmup), buffers_(buffers) {}

  torch::nn::Module& module() override {
    return *net_;
  }
  std::vector<std::string> metric_names() const override {
    return {"accuracy"};
  }
  dkit::StepResult training_step(const dkit::Batch& batch) override {
    steps_ += net_->is_training() ? 1 : 0;
    if (buffers_ && net_->is_training()) {
      double sum = 0;
      for (const auto& buffer : net_->buffers()) {
        sum += buffer.to(torch::kDouble).sum().item<double>();
      }
      const char* rank = std::getenv("RANK");
      std::fprintf(stderr, "rank %s step %lld buffers %.17g\n", rank != nullptr ? rank : "0",
                   static_cast<long long>(steps_), sum);
    }
    const torch::Tensor logits = net_(batch.features);
    return {torch::nn::functional::cross_entropy(logits.to(torch::kFloat), batch.labels),
            {logits.argmax(1).eq(batch.labels).to(torch::kFloat).mean()}};
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizer() override {
    return std::make_unique<torch::optim::SGD>(net_->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  dkit::Scheduler configure_scheduler(torch::optim::Optimizer& optimizer, const dkit::TrainingPlan& plan) override {
    if (warmup_ > 0) {
      return {dkit::warmup_scheduler(dkit::WarmupScheduleOptions().warmup_steps(warmup_))(optimizer, plan),
              dkit::SchedulerInterval::kStep};
    }
    if (!scheduler_) {
      return {};
    }
    return {std::make_unique<torch::optim::StepLR>(optimizer, /*step_size=*/1, /*gamma=*/0.8),
            dkit::SchedulerInterval::kEpoch};
  }
  dkit::PickleValue state_dict() const override {
    return dkit::PickleValue::dict({{"steps", steps_}});
  }
  void load_state_dict(const dkit::PickleValue& state, const std::string& /*source*/) override {
    steps_ = state.find("steps")->to_int();
  }

 private:
  Cnn net_;
  bool scheduler_;
  int64_t warmup_;
  bool buffers_;
  int64_t steps_ = 0;
};

} // namespace

int main(int argc, char** argv) try {
  std::map<std::string, std::string> args = {
      {"out", ""},      {"epochs", "4"},     {"max-steps", "0"}, {"batch-size", "32"}, {"log-every", "1"},  {"checkpoint-every", "25"},
      {"precision", "fp32"}, {"batch-norm", "1"}, {"dropout", "0.2"}, {"scheduler", "0"}, {"buffers", "0"},
      {"accumulate", "1"}, {"clip", "0"}, {"warmup", "0"}, {"max-time", "0"}, {"save-top-k", "0"}, {"patience", "0"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = std::string(argv[i]).substr(2);
    DKIT_CHECK(args.count(name) == 1, "dkit_cnn_run: unknown option ", argv[i]);
    args[name] = argv[i + 1];
  }
  torch::manual_seed(7);
  CnnTask task(Cnn(args["batch-norm"] == "1", std::stod(args["dropout"])), args["scheduler"] == "1",
               std::stoll(args["warmup"]), args["buffers"] == "1");
  dkit::TrainerOptions options(args["out"]);
  options.device("cpu")
      .threads(1)
      .process_settings(true)
      .seed(5)
      .epochs(std::stoll(args["epochs"]))
      .max_steps(std::stoll(args["max-steps"]))
      .batch_size(std::stoll(args["batch-size"]))
      .log_every(std::stoll(args["log-every"]))
      .checkpoint_every(std::stoll(args["checkpoint-every"]))
      .precision(dkit::parse_name(dkit::kPrecisionNames, args["precision"], "precision"))
      .accumulate_grad_batches(std::stoll(args["accumulate"]))
      .clip_grad_norm(std::stod(args["clip"]))
      .max_time(std::stod(args["max-time"]))
      .save_top_k(std::stoll(args["save-top-k"]))
      .early_stopping_patience(std::stoll(args["patience"]))
      .features_dtype(torch::kFloat)
      .features_divisor(255)
      .auto_resume(true)
      .stop(dkit::stop_on_signals())
      .on_log([](const dkit::LogLine& line) { std::cerr << line.text << std::endl; });
  const dkit::DatasetSplit data = dkit::split(dkit::make_synthetic_images(2000, 16, 10), /*val_fraction=*/0.2, /*seed=*/0);
  const dkit::TrainSummary summary = dkit::Trainer(options).fit(task, data.train, data.val);
  std::cout << dkit::summary_to_json(summary);
  return summary.stopped_by_signal != 0 ? 128 + summary.stopped_by_signal : 0;
} catch (const std::exception& e) {
  std::cerr << "dkit_cnn_run: error: " << e.what() << "\n";
  return 1;
}
