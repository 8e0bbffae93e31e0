#pragma once

#include <dkit/checkpoint/optimizer_kind.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dkit {

/// Where `data.source` reads samples from.
enum class DataSource {
  /// A CSV file of numbers, one sample per line (`data.path`).
  kCsv,
  /// A folder of MNIST or Fashion-MNIST IDX files (`data.path`).
  kMnist,
  /// Seeded Gaussian blobs (`data.samples`, `data.features`, `data.classes`).
  kSynthetic,
};

/// The training configuration as written: each key the YAML file or a `--set` gave, and nothing else. Missing
/// keys stay empty; FullTrainConfig fills them with defaults and checks every value.
struct TrainConfig {
  /// `device`: `auto | cpu | cuda | cuda:N`.
  std::optional<std::string> device;
  /// `seed`: seeds weight initialisation, dropout, the split and the sample order.
  std::optional<int64_t> seed;
  /// `threads`: LibTorch's CPU threads; 0 uses every CPU this process may run on.
  std::optional<int64_t> threads;

  /// `data.*` as written.
  struct Data {
    /// `data.source`.
    std::optional<std::string> source;
    /// `data.path`, resolved against the folder of the file that gave it (or the current folder for `--set`).
    std::optional<std::string> path;
    /// `data.label_column`.
    std::optional<int64_t> label_column;
    /// `data.scaling`.
    std::optional<std::string> scaling;
    /// `data.val_fraction`.
    std::optional<double> val_fraction;
    /// `data.samples` (synthetic).
    std::optional<int64_t> samples;
    /// `data.features` (synthetic).
    std::optional<int64_t> features;
    /// `data.classes` (synthetic).
    std::optional<int64_t> classes;
  } data;

  /// `model.*` as written.
  struct Model {
    /// `model.hidden`.
    std::optional<std::vector<int64_t>> hidden;
    /// `model.activation`.
    std::optional<std::string> activation;
    /// `model.dropout`.
    std::optional<double> dropout;
  } model;

  /// `train.*` as written.
  struct Train {
    /// `train.epochs`.
    std::optional<int64_t> epochs;
    /// `train.max_steps`.
    std::optional<int64_t> max_steps;
    /// `train.batch_size`.
    std::optional<int64_t> batch_size;
    /// `train.lr`.
    std::optional<double> lr;
    /// `train.optimizer`.
    std::optional<std::string> optimizer;
    /// `train.momentum`.
    std::optional<double> momentum;
    /// `train.weight_decay`.
    std::optional<double> weight_decay;
    /// `train.log_every`.
    std::optional<int64_t> log_every;
    /// `train.checkpoint_every`.
    std::optional<int64_t> checkpoint_every;
    /// `train.keep_checkpoints`.
    std::optional<int64_t> keep_checkpoints;
  } train;

  /// `loader.*` as written.
  struct Loader {
    /// `loader.placement`.
    std::optional<std::string> placement;
    /// `loader.prefetch`.
    std::optional<int64_t> prefetch;
    /// `loader.shuffle`.
    std::optional<bool> shuffle;
    /// `loader.drop_last`.
    std::optional<bool> drop_last;
  } loader;

  /// `dist.*` as written.
  struct Dist {
    /// `dist.backend`.
    std::optional<std::string> backend;
    /// `dist.timeout_seconds`.
    std::optional<int64_t> timeout_seconds;
    /// `dist.data_parallel`.
    std::optional<bool> data_parallel;
  } dist;

  /// Where each key given came from, e.g. `configs/digits.yaml line 7` or `--set train.lr=0.1`; error messages
  /// quote it.
  std::map<std::string, std::string> origins;
};

/// The configuration with every default filled in and every value checked: nothing is left optional.
struct FullTrainConfig {
  /// Resolves `config`; an out-of-range or unknown value is a dkit::Error naming the key and where it was given.
  explicit FullTrainConfig(const TrainConfig& config);

  /// `device`, as written (`auto`, `cpu`, `cuda`, `cuda:N`); its syntax is checked here, its presence when
  /// training starts.
  std::string device;
  /// `seed`.
  int64_t seed;
  /// `threads` (0: every CPU this process may run on).
  int64_t threads;

  /// `data.source`.
  DataSource data_source;
  /// `data.path`, absolute; empty for synthetic data.
  std::string data_path;
  /// `data.label_column` (negative counts from the end).
  int64_t label_column;
  /// `data.scaling`: `none`, `standardize` or `minmax`.
  std::string scaling;
  /// `data.val_fraction`, in [0, 1).
  double val_fraction;
  /// `data.samples` (synthetic).
  int64_t synthetic_samples;
  /// `data.features` (synthetic).
  int64_t synthetic_features;
  /// `data.classes` (synthetic).
  int64_t synthetic_classes;

  /// `model.hidden`.
  std::vector<int64_t> hidden;
  /// `model.activation`: `relu`, `gelu` or `tanh`.
  std::string activation;
  /// `model.dropout`, in [0, 1).
  double dropout;

  /// `train.epochs`.
  int64_t epochs;
  /// `train.max_steps` (0: no limit).
  int64_t max_steps;
  /// `train.batch_size`, per process.
  int64_t batch_size;
  /// `train.lr`.
  double lr;
  /// `train.optimizer`.
  OptimizerKind optimizer;
  /// `train.momentum` (SGD).
  double momentum;
  /// `train.weight_decay`.
  double weight_decay;
  /// `train.log_every`.
  int64_t log_every;
  /// `train.checkpoint_every` (0: only at the end).
  int64_t checkpoint_every;
  /// `train.keep_checkpoints`.
  int64_t keep_checkpoints;

  /// `loader.placement`: `auto`, `device`, `pinned` or `pageable`.
  std::string placement;
  /// `loader.prefetch`.
  int64_t prefetch;
  /// `loader.shuffle`.
  bool shuffle;
  /// `loader.drop_last`.
  bool drop_last;

  /// `dist.backend`: `auto`, `gloo` or `nccl`.
  std::string dist_backend;
  /// `dist.timeout_seconds`.
  int64_t dist_timeout_seconds;
  /// `dist.data_parallel`: one process on every visible GPU (DataParallel).
  bool dist_data_parallel;
};

/// One key of the configuration, for documentation and `dkit train --help`.
struct ConfigKey {
  /// Dotted name, e.g. `train.lr`.
  std::string name;
  /// Type as the README shows it, e.g. `int`, `float`, `list of int`.
  std::string type;
  /// Default value as YAML text.
  std::string default_value;
  /// What it does.
  std::string meaning;
};

/// Every configuration key, in the order the README documents them.
const std::vector<ConfigKey>& config_keys();

/// Reads a YAML configuration. `source` names it in error messages (a file path); relative `data.path` values
/// are resolved against `base_dir`. Each `KEY=VALUE` of `overrides` replaces or adds a key; VALUE is parsed as
/// YAML (`model.hidden=[256,256]`) and a relative path in it is resolved against the current folder. Unknown
/// keys, wrong types and broken YAML are dkit::Error naming the key or the line.
TrainConfig parse_config(const std::string& yaml, const std::string& source, const std::string& base_dir,
                         const std::vector<std::string>& overrides = {});

/// parse_config() of a file; a missing or unreadable file is an error naming it.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// The resolved configuration as YAML that parse_config() reads back to the same values.
std::string to_yaml(const FullTrainConfig& config);

/// `source` as `data.source` spells it.
const char* to_string(DataSource source);

} // namespace dkit
