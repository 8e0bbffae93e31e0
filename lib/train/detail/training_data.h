#pragma once

#include <dkit/data/dataset.h>
#include <dkit/data/loader.h>
#include <dkit/device/device.h>
#include <dkit/train/config.h>

#include <cstdint>
#include <optional>
#include <string>

namespace dkit::detail {

/// A run's data, ready to train on: read, checksummed, split, normalised with the training part's statistics,
/// the training part behind a Loader of this rank's share of each global batch, and this rank's slice of the
/// validation part on the device.
struct TrainingData {
  /// Reads and prepares the data `config` names for rank `rank` of `world_size`, on `device`.
  TrainingData(const FullTrainConfig& config, const Device& device, int64_t rank, int64_t world_size);

  /// The data set's description, e.g. `digits.csv: 1797 samples, 64 features, 10 classes`.
  std::string description;
  /// A checksum of every feature and label, e.g. `fnv1a64:0123456789abcdef`: a resumed run must see the same.
  std::string checksum;
  /// Samples in the training part, over all ranks.
  int64_t train_size = 0;
  /// Samples in the validation part, over all ranks.
  int64_t val_size = 0;
  /// Features per sample.
  int64_t in_features = 0;
  /// Classes.
  int64_t num_classes = 0;
  /// The normalisation fitted on the training part, which the checkpoint saves.
  Normalization normalization;
  /// This rank's batches of the training part.
  std::optional<Loader> loader;
  /// This rank's slice of the normalised validation features, on the device; undefined without a validation part.
  at::Tensor val_features;
  /// The labels of val_features.
  at::Tensor val_labels;
};

/// `data.features` and `data.labels` hashed with FNV-1a 64, as `fnv1a64:` and 16 hex digits.
std::string data_checksum(const Dataset& data);

} // namespace dkit::detail
