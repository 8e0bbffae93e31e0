#pragma once

#include <dkit/data/dataset.h>
#include <dkit/train/config.h>

#include <cstdint>
#include <string>

namespace dkit::detail {

/// The data `dkit train`'s config names, ready to train on: read (or mapped), checksummed, split, and normalised
/// with the training part's statistics (in place in memory; per batch for mapped data).
struct TrainingData {
  /// Reads and prepares the data `config` names.
  explicit TrainingData(const FullTrainConfig& config);

  /// The data set's description, e.g. `digits.csv: 1797 samples, 64 features, 10 classes`.
  std::string description;
  /// A checksum of every feature and label, e.g. `fnv1a64:0123456789abcdef`: a resumed run must see the same.
  std::string checksum;
  /// Features per sample.
  int64_t in_features = 0;
  /// Classes.
  int64_t num_classes = 0;
  /// The normalisation fitted on the training part, which the checkpoint saves.
  Normalization normalization;
  /// The normalised training part.
  Dataset train;
  /// The normalised validation part; empty (`[0, F]`) when `data.val_fraction` is 0.
  Dataset val;
  /// Whether the parts are mapped files left as they are: each batch is then converted to float32, and scaled by
  /// `normalization`, after it reaches the device.
  bool scale_batches = false;
};

/// `data.features` and `data.labels` hashed with FNV-1a 64, as `fnv1a64:` and 16 hex digits.
std::string data_checksum(const Dataset& data);

} // namespace dkit::detail
