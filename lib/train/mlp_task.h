#pragma once

#include <dkit/data/dataset.h>
#include <dkit/model/mlp.h>
#include <dkit/train/config.h>
#include <dkit/train/task.h>
#include <dkit/train/trainer.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dkit {

class TrainStep;

/// dkit's Mlp as a Task, as `dkit train` trains it: cross-entropy and accuracy, the optimizer `train.optimizer` names
/// (dkit's fused SGD, Adam and AdamW), TrainStep's step (its backward pass written out where the model allows), and,
/// with `dist.data_parallel`, DataParallel over every visible GPU. Its checkpoints describe the network and the input
/// scaling, so that `dkit predict` rebuilds them.
class MlpTask : public Task {
 public:
  /// The Mlp `config` describes for `in_features` inputs and `classes` classes, built now from LibTorch's default
  /// generator; `normalization` is what training scales the inputs by, saved with each checkpoint. With
  /// `scale_batches` (data mapped from files, left as they are) each batch is converted to float32 and int64 labels
  /// and scaled on the device; otherwise the data must be scaled already.
  MlpTask(const FullTrainConfig& config, int64_t in_features, int64_t classes, Normalization normalization,
          bool scale_batches = false);
  ~MlpTask() override;
  MlpTask(const MlpTask&) = delete;
  MlpTask& operator=(const MlpTask&) = delete;

  /// The network.
  Mlp& model() {
    return model_;
  }

  torch::nn::Module& module() override;
  std::vector<std::string> metric_names() const override;
  StepResult training_step(const Batch& batch) override;
  std::unique_ptr<torch::optim::Optimizer> configure_optimizer() override;
  Scheduler configure_scheduler(torch::optim::Optimizer& optimizer, const TrainingPlan& plan) override;
  void on_train_start(const StepContext& context) override;
  std::optional<StepResult> take_step(const Batch& batch, const StepContext& context) override;
  void describe(TrainingCheckpoint& checkpoint) const override;
  std::string description() const override;

 private:
  FullTrainConfig config_;
  Mlp model_{nullptr};
  Normalization normalization_;
  bool scale_batches_ = false;
  std::vector<Device> data_parallel_devices_;
  std::unique_ptr<TrainStep> step_;
};

/// Trains what `config` names, as `dkit train` does: reads its data (checksummed, split, scaled), builds an MlpTask
/// and fits it with `options`, which trainer_options() of the same config made and the caller completed (resume
/// point, callbacks, ...). With `options.process_settings()`, `threads` and `seed` are applied before the network
/// is built, so that its initial weights follow the seed. A data error is refused before the run folder is created.
TrainSummary train_from_config(const FullTrainConfig& config, TrainerOptions options);

} // namespace dkit
