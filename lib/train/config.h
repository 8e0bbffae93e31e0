#pragma once

#include <dkit/checkpoint/optimizer_kind.h>
#include <dkit/core/enum_names.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace dkit {

// Declared with their name tables in the modules that use them (model/mlp.h, data/dataset.h, data/loader.h,
// distributed/process_group.h, train/amp.h, train/schedule.h, train/trainer.h); config.cpp includes those, this
// header stays free of LibTorch.
enum class Activation;
enum class Scaling;
enum class Placement;
enum class Backend;
enum class Precision;
enum class LrDecay;
enum class MonitorMode;

/// Where `data.source` reads samples from.
enum class DataSource {
  /// A CSV file of numbers, one sample per line (`data.path`).
  kCsv,
  /// A folder of MNIST or Fashion-MNIST IDX files (`data.path`).
  kMnist,
  /// Seeded Gaussian blobs (`data.samples`, `data.features`, `data.classes`).
  kSynthetic,
  /// NumPy `.npy` arrays, memory-mapped: the inputs' file (`data.path`) and the labels' (`data.targets`), or a
  /// folder holding `x.npy` and `y.npy`.
  kNpy,
  /// A safetensors file holding the tensors `x` (inputs) and `y` (labels), memory-mapped (`data.path`).
  kSafetensors,
};

/// The name of each DataSource, as `data.source` spells it.
inline constexpr EnumNames<DataSource, 5> kDataSourceNames = {{
    {DataSource::kCsv, "csv"},
    {DataSource::kMnist, "mnist"},
    {DataSource::kSynthetic, "synthetic"},
    {DataSource::kNpy, "npy"},
    {DataSource::kSafetensors, "safetensors"},
}};

/// One value as a config file or `--set` wrote it, read as its key's type: `bool`, `int64_t` (int), `double`
/// (float), `std::string` (string, path, and the name of an enum value, checked by FullTrainConfig) or
/// `std::vector<int64_t>` (list of int).
using ConfigValue = std::variant<bool, int64_t, double, std::string, std::vector<int64_t>>;

/// The training configuration as written: each key the YAML file or a `--set` gave, and nothing else. Every
/// value has its key's type (a wrong type is an error of parse_config()), but no default is filled in and no
/// range or name is checked: FullTrainConfig does that. config_keys() lists the keys.
struct TrainConfig {
  /// Each key given, by dotted name (`train.lr`). `data.path` is already absolute: resolved against the folder
  /// of the file that gave it, or the current folder for `--set`.
  std::map<std::string, ConfigValue> values;

  /// Where each key given came from, e.g. `configs/digits.yaml line 7` or `--set train.lr=0.1`; error messages
  /// quote it.
  std::map<std::string, std::string> origins;
};

/// The configuration with every default filled in and every value checked: nothing is left optional. Each
/// member is one key of config_keys(); the key table in config.cpp holds its default, its check and its doc.
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
  /// `data.targets`, absolute; empty when not given.
  std::string data_targets;
  /// `data.label_column` (negative counts from the end).
  int64_t label_column;
  /// `data.header`.
  bool csv_header;
  /// `data.scaling`.
  Scaling scaling;
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
  /// `model.activation`.
  Activation activation;
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
  /// `train.precision`.
  Precision precision;
  /// `train.momentum` (SGD).
  double momentum;
  /// `train.nesterov` (SGD).
  bool nesterov;
  /// `train.weight_decay`.
  double weight_decay;
  /// `train.lr_schedule`: what follows the warm-up.
  LrDecay lr_schedule;
  /// `train.warmup_steps`.
  int64_t warmup_steps;
  /// `train.lr_min_factor`: the cosine's floor.
  double lr_min_factor;
  /// `train.lr_step_size`: steps between decays of the step schedule.
  int64_t lr_step_size;
  /// `train.lr_gamma`: the step schedule's factor.
  double lr_gamma;
  /// `train.accumulate_grad_batches`.
  int64_t accumulate_grad_batches;
  /// `train.clip_grad_norm` (0: none).
  double clip_grad_norm;
  /// `train.max_time`, in seconds (0: no limit).
  double max_time;
  /// `train.monitor`.
  std::string monitor;
  /// `train.monitor_mode`.
  MonitorMode monitor_mode;
  /// `train.save_top_k`.
  int64_t save_top_k;
  /// `train.early_stopping_patience` (0: never).
  int64_t early_stopping_patience;
  /// `train.early_stopping_min_delta`.
  double early_stopping_min_delta;
  /// `train.log_every`.
  int64_t log_every;
  /// `train.checkpoint_every` (0: only at the end).
  int64_t checkpoint_every;
  /// `train.keep_checkpoints`.
  int64_t keep_checkpoints;
  /// `train.tensorboard`: the metrics also go into a TensorBoard event file in the run folder.
  bool tensorboard;

  /// `loader.placement`.
  Placement placement;
  /// `loader.prefetch`.
  int64_t prefetch;
  /// `loader.shuffle_block` (0: single samples).
  int64_t shuffle_block;
  /// `loader.shuffle`.
  bool shuffle;
  /// `loader.drop_last`.
  bool drop_last;

  /// `dist.backend`.
  Backend dist_backend;
  /// `dist.timeout`, in seconds.
  int64_t dist_timeout;
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
  /// The names an enum-valued key accepts, in the order messages list them; empty for other keys.
  std::vector<std::string> choices;
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

/// The name kDataSourceNames gives `source`.
inline std::string to_string(DataSource source) {
  return std::string(name_of(kDataSourceNames, source));
}

} // namespace dkit
