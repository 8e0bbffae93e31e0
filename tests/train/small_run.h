#pragma once

#include <dkit/train/config.h>

#include <string>
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

} // namespace dkit::test
