#pragma once

#include <dkit/train/config.h>
#include <dkit/train/mlp_task.h>
#include <dkit/train/trainer.h>

#include <string>
#include <utility>
#include <vector>

namespace dkit::test {

/// The trainer tests' run: 200 synthetic samples, 160 of them for training, 10 batches of 16 per epoch, 3 epochs
/// (30 steps), metrics flushed every 5 steps; `overrides` (`KEY=VALUE`) change it.
inline FullTrainConfig small_run(const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> all = {"device=cpu",        "threads=1",       "data.source=synthetic",
                                  "data.samples=200",  "data.features=8", "data.classes=3",
                                  "model.hidden=[16]", "train.epochs=3",  "train.batch_size=16",
                                  "train.log_every=5", "train.lr=0.01",   "train.checkpoint_every=0"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return FullTrainConfig(parse_config("", "test", ".", all));
}

/// Trains `config` as `dkit train` does (train_from_config()): its recipe as trainer_options() reads it, with the
/// run-level settings of `run` (its folder, resume point, process settings and group, stop request, callbacks).
inline TrainSummary train_config(const FullTrainConfig& config, const TrainerOptions& run) {
  TrainerOptions options = trainer_options(config, run.out_dir());
  options.resume(run.resume())
      .auto_resume(run.auto_resume())
      .process_settings(run.process_settings())
      .process_group(run.process_group())
      .join_launch(run.join_launch())
      .stop(run.stop())
      .on_log(run.on_log())
      .on_progress(run.on_progress())
      .on_validation_end(run.on_validation_end())
      .on_epoch_end(run.on_epoch_end())
      .check_syncs(run.check_syncs());
  return train_from_config(config, std::move(options));
}

} // namespace dkit::test
