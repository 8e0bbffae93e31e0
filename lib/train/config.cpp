#include <dkit/train/config.h>

#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/data/dataset.h>
#include <dkit/data/loader.h>
#include <dkit/device/device.h>
#include <dkit/distributed/process_group.h>
#include <dkit/model/mlp.h>
#include <dkit/train/amp.h>
#include <dkit/train/trainer.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>

namespace dkit {
namespace {

namespace fs = std::filesystem;

struct Where {
  std::string text;
  bool from_set = false;
  std::string base_dir;
};

std::string describe(const YAML::Node& node) {
  if (node.IsSequence()) {
    return "a list";
  }
  if (node.IsMap()) {
    return "a map";
  }
  if (node.IsNull()) {
    return "nothing";
  }
  return "'" + printable(node.Scalar()) + "'";
}

[[noreturn]] void type_error(const std::string& key, const Where& where, const char* expected,
                             const YAML::Node& node) {
  throw Error(detail::concat("config key '", key, "' (", where.text, ") expects ", expected, ", got ",
                             describe(node)));
}

std::optional<int64_t> scalar_int(const YAML::Node& node) {
  if (!node.IsScalar()) {
    return std::nullopt;
  }
  const std::string& text = node.Scalar();
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

// How a key of type T is read and written back, and its type as the README shows it.
template <typename T>
struct Type;

template <>
struct Type<int64_t> {
  static constexpr const char* kName = "int";
  static int64_t read(const std::string& key, const YAML::Node& node, const Where& where) {
    const auto value = scalar_int(node);
    if (!value) {
      type_error(key, where, "an integer", node);
    }
    return *value;
  }
  static void write(YAML::Emitter& out, int64_t value) {
    out << value;
  }
};

template <>
struct Type<double> {
  static constexpr const char* kName = "float";
  static double read(const std::string& key, const YAML::Node& node, const Where& where) {
    if (node.IsScalar() && !node.Scalar().empty()) {
      const std::string& text = node.Scalar();
      char* end = nullptr;
      const double value = std::strtod(text.c_str(), &end);
      if (end == text.c_str() + text.size()) {
        return value;
      }
    }
    type_error(key, where, "a number", node);
  }
  static void write(YAML::Emitter& out, double value) {
    out << format_number(value);
  }
};

template <>
struct Type<bool> {
  static constexpr const char* kName = "bool";
  static bool read(const std::string& key, const YAML::Node& node, const Where& where) {
    if (node.IsScalar()) {
      const std::string& text = node.Scalar();
      if (text == "true" || text == "True" || text == "yes") {
        return true;
      }
      if (text == "false" || text == "False" || text == "no") {
        return false;
      }
    }
    type_error(key, where, "true or false", node);
  }
  static void write(YAML::Emitter& out, bool value) {
    out << value;
  }
};

template <>
struct Type<std::string> {
  static constexpr const char* kName = "string";
  static std::string read(const std::string& key, const YAML::Node& node, const Where& where) {
    if (!node.IsScalar()) {
      type_error(key, where, "a string", node);
    }
    if (printable(node.Scalar()) != node.Scalar()) {
      type_error(key, where, "a string without control characters", node);
    }
    return node.Scalar();
  }
  static void write(YAML::Emitter& out, const std::string& value) {
    out << value;
  }
};

template <>
struct Type<std::vector<int64_t>> {
  static constexpr const char* kName = "list of int";
  static std::vector<int64_t> read(const std::string& key, const YAML::Node& node, const Where& where) {
    if (!node.IsSequence()) {
      type_error(key, where, "a list of integers", node);
    }
    std::vector<int64_t> values;
    for (const auto& item : node) {
      const auto value = scalar_int(item);
      if (!value) {
        type_error(key, where, "a list of integers", item);
      }
      values.push_back(*value);
    }
    return values;
  }
  static void write(YAML::Emitter& out, const std::vector<int64_t>& values) {
    out << YAML::Flow << values;
  }
};

std::string read_path(const std::string& key, const YAML::Node& node, const Where& where) {
  const fs::path path = Type<std::string>::read(key, node, where);
  if (path.is_absolute()) {
    return path.lexically_normal().string();
  }
  const fs::path base = where.from_set ? fs::current_path() : fs::absolute(where.base_dir);
  return (base / path).lexically_normal().string();
}

const std::string& given(const TrainConfig& config, const std::string& name) {
  static const std::string kDefault = "default";
  const auto found = config.origins.find(name);
  return found == config.origins.end() ? kDefault : found->second;
}

std::string leaf(const std::string& name) {
  return name.substr(name.rfind('.') + 1);
}

// A default as the README shows it: what to_yaml() writes, a whole float without its `.0` (`0`, `0.001`).
template <typename T>
std::string default_text(const T& value) {
  YAML::Emitter out;
  Type<T>::write(out, value);
  std::string text = out.c_str();
  if (std::is_same_v<T, double> && text.size() > 2 && text.compare(text.size() - 2, 2, ".0") == 0) {
    text.resize(text.size() - 2);
  }
  return text;
}

template <typename T>
struct ElementOf {
  using type = T;
};

template <typename T>
struct ElementOf<std::vector<T>> {
  using type = T;
};

// What a value (each item of a list) must satisfy, and how the error says it: "must be <text>, got <value>".
template <typename T>
struct Requirement {
  std::function<bool(const typename ElementOf<T>::type&)> ok;
  const char* text = "";
};

template <typename T>
[[noreturn]] void requirement_error(const TrainConfig& config, const std::string& name, const T& value,
                                    const char* requirement) {
  if constexpr (std::is_same_v<T, std::string>) {
    throw Error(detail::concat("config key '", name, "' (", given(config, name), ") must be ", requirement,
                               ", got '", value, "'"));
  } else {
    throw Error(detail::concat("config key '", name, "' (", given(config, name), ") must be ", requirement,
                               ", got ", value));
  }
}

template <typename T>
void check(const TrainConfig& config, const std::string& name, const T& value, const Requirement<T>& requirement) {
  if (!requirement.ok) {
    return;
  }
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    for (const int64_t item : value) {
      if (!requirement.ok(item)) {
        requirement_error(config, name, item, requirement.text);
      }
    }
  } else if (!requirement.ok(value)) {
    requirement_error(config, name, value, requirement.text);
  }
}

// One configuration key: its doc, how parse_config() reads it into TrainConfig, how FullTrainConfig fills in its
// default, checks it and stores it, and how to_yaml() writes it back.
struct KeySpec {
  ConfigKey doc;
  std::function<ConfigValue(const YAML::Node&, const Where&)> read;
  std::function<void(const TrainConfig&, FullTrainConfig&)> resolve;
  std::function<void(const FullTrainConfig&, YAML::Emitter&)> write;
  // Whether the key is one of a Trainer's options (see trainer_fields()), rather than the data's or the MLP's.
  bool trainer = false;
};

// Marks `spec` as a Trainer's option.
KeySpec trainer_key(KeySpec spec) {
  spec.trainer = true;
  return spec;
}

// The defaults of the keys a Trainer takes: TrainerOptions holds them, the key table reads them from it.
const TrainerOptions& trainer_defaults() {
  static const TrainerOptions defaults("");
  return defaults;
}

// The value of `name` in `config.values` as a T, or nullptr when the key was not given.
template <typename T>
const T* written(const TrainConfig& config, const std::string& name, const char* type) {
  const auto found = config.values.find(name);
  if (found == config.values.end()) {
    return nullptr;
  }
  const T* value = std::get_if<T>(&found->second);
  DKIT_CHECK(value != nullptr, "config key '", name, "' (", given(config, name), ") holds another type than ", type);
  return value;
}

template <typename T>
KeySpec value_key(const char* name, T FullTrainConfig::*member, T fallback, const char* meaning,
                  Requirement<T> requirement = {}) {
  KeySpec spec;
  spec.doc = {name, Type<T>::kName, default_text(fallback), meaning, {}};
  spec.read = [name](const YAML::Node& node, const Where& where) {
    return ConfigValue(std::in_place_type<T>, Type<T>::read(name, node, where));
  };
  spec.resolve = [name, member, fallback, requirement](const TrainConfig& config, FullTrainConfig& full) {
    const T* value = written<T>(config, name, Type<T>::kName);
    full.*member = value == nullptr ? fallback : *value;
    check(config, name, full.*member, requirement);
  };
  spec.write = [name, member](const FullTrainConfig& full, YAML::Emitter& out) {
    out << YAML::Key << leaf(name) << YAML::Value;
    Type<T>::write(out, full.*member);
  };
  return spec;
}

template <typename Enum, std::size_t N>
KeySpec enum_key(const char* name, Enum FullTrainConfig::*member, const EnumNames<Enum, N>& names, Enum fallback,
                 const std::string& meaning) {
  KeySpec spec;
  spec.doc = {name, "string", std::string(name_of(names, fallback)), meaning, {}};
  for (const auto& entry : names) {
    spec.doc.choices.emplace_back(entry.name);
  }
  spec.read = [name](const YAML::Node& node, const Where& where) { return ConfigValue(Type<std::string>::read(name, node, where)); };
  spec.resolve = [name, member, &names, fallback](const TrainConfig& config, FullTrainConfig& full) {
    const std::string* text = written<std::string>(config, name, "string");
    if (text == nullptr) {
      full.*member = fallback;
      return;
    }
    const std::optional<Enum> parsed = try_parse(names, *text);
    DKIT_CHECK(parsed.has_value(), "config key '", name, "' (", given(config, name), ") must be one of ",
               list_names(names, /*last=*/", "), ", got '", *text, "'");
    full.*member = *parsed;
  };
  spec.write = [name, member, &names](const FullTrainConfig& full, YAML::Emitter& out) {
    out << YAML::Key << leaf(name) << YAML::Value << std::string(name_of(names, full.*member));
  };
  return spec;
}

// `data.path`: a path resolved at parse time, required unless the data is synthetic (so it follows data.source).
KeySpec data_path_key() {
  KeySpec spec;
  spec.doc = {"data.path", "path", "(required unless synthetic)",
              "the CSV file, IDX folder, `.npy` file of inputs (or folder of `x.npy` and `y.npy`) or `.safetensors` "
              "file; relative to the config file's folder (to the current folder in `--set`)",
              {}};
  spec.read = [](const YAML::Node& node, const Where& where) { return ConfigValue(read_path("data.path", node, where)); };
  spec.resolve = [](const TrainConfig& config, FullTrainConfig& full) {
    const std::string* path = written<std::string>(config, "data.path", "path");
    full.data_path = path == nullptr ? "" : *path;
    DKIT_CHECK(full.data_source == DataSource::kSynthetic || !full.data_path.empty(),
               "config key 'data.path' is required when data.source is ", to_string(full.data_source));
    if (full.data_source == DataSource::kSynthetic) {
      full.data_path.clear();
    }
  };
  spec.write = [](const FullTrainConfig& full, YAML::Emitter& out) {
    if (!full.data_path.empty()) {
      out << YAML::Key << "path" << YAML::Value << full.data_path;
    }
  };
  return spec;
}

// `data.targets`: an optional path, which only data.source npy reads.
KeySpec data_targets_key() {
  KeySpec spec;
  spec.doc = {"data.targets", "path", "(none)",
              "npy only: the `.npy` file of integer labels when `data.path` is the `.npy` file of inputs", {}};
  spec.read = [](const YAML::Node& node, const Where& where) {
    return ConfigValue(read_path("data.targets", node, where));
  };
  spec.resolve = [](const TrainConfig& config, FullTrainConfig& full) {
    const std::string* path = written<std::string>(config, "data.targets", "path");
    full.data_targets = path == nullptr ? "" : *path;
  };
  spec.write = [](const FullTrainConfig& full, YAML::Emitter& out) {
    if (!full.data_targets.empty()) {
      out << YAML::Key << "targets" << YAML::Value << full.data_targets;
    }
  };
  return spec;
}

// `train.nesterov`: checked against train.momentum, which key_specs() resolves before it.
KeySpec nesterov_key() {
  KeySpec spec = value_key<bool>("train.nesterov", &FullTrainConfig::nesterov, false,
                                 "SGD: Nesterov momentum (needs train.momentum above 0); other optimizers ignore it");
  spec.resolve = [resolve = spec.resolve](const TrainConfig& config, FullTrainConfig& full) {
    resolve(config, full);
    DKIT_CHECK(!full.nesterov || full.optimizer != OptimizerKind::kSgd || full.momentum > 0,
               "config key 'train.nesterov' (", given(config, "train.nesterov"),
               ") needs train.momentum above 0, got ", full.momentum);
  };
  return spec;
}

template <typename T>
Requirement<T> at_least(typename ElementOf<T>::type minimum, const char* text) {
  return {[minimum](const auto& value) { return value >= minimum; }, text};
}

Requirement<double> fraction() {
  return {[](double value) { return value >= 0.0 && value < 1.0; }, "in [0, 1)"};
}

bool valid_device(const std::string& text) {
  Device parsed = cpu();
  return try_parse_device(text, parsed);
}

using C = FullTrainConfig;

// Every key, in the order the README documents them and to_yaml() writes them; a section's keys stay together.
const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      trainer_key(value_key<std::string>(
          "device", &C::device, trainer_defaults().device(),
          "`auto` (the first GPU, else the CPU), `cpu`, `cuda` or `cuda:N`; an absent device is an error",
          {valid_device, "auto, cpu, cuda or cuda:N"})),
      trainer_key(value_key<int64_t>("seed", &C::seed, trainer_defaults().seed(),
                                     "seeds weight initialisation, dropout, the validation split and the sample order")),
      trainer_key(value_key<int64_t>("threads", &C::threads, trainer_defaults().threads(),
                                     "LibTorch's CPU threads; 0 uses every CPU this process may run on",
                                     at_least<int64_t>(0, "at least 0"))),
      enum_key("data.source", &C::data_source, kDataSourceNames, DataSource::kCsv,
               "`csv` (numbers, one sample per line), `mnist` (a folder of IDX files, MNIST or Fashion-MNIST), "
               "`synthetic` (seeded Gaussian blobs), `npy` or `safetensors` (arrays mapped from disk, never loaded "
               "whole)"),
      data_path_key(),
      data_targets_key(),
      value_key<int64_t>("data.label_column", &C::label_column, -1,
                         "CSV column holding the integer class label; negative counts from the end"),
      value_key<bool>("data.header", &C::csv_header, false,
                      "whether the CSV file's first line names the columns (it is skipped)"),
      enum_key("data.scaling", &C::scaling, kScalingNames, Scaling::kStandardize,
               "feature scaling fitted on the training part and stored in checkpoints: `none`, `standardize` (zero "
               "mean, unit variance) or `minmax` (to [0, 1])"),
      value_key<double>("data.val_fraction", &C::val_fraction, 0.2,
                        "fraction of samples held out for validation, in [0, 1)", fraction()),
      value_key<int64_t>("data.samples", &C::synthetic_samples, 2000, "synthetic only: number of samples",
                         at_least<int64_t>(2, "at least 2")),
      value_key<int64_t>("data.features", &C::synthetic_features, 32, "synthetic only: features per sample",
                         at_least<int64_t>(1, "at least 1")),
      value_key<int64_t>("data.classes", &C::synthetic_classes, 4, "synthetic only: number of classes",
                         at_least<int64_t>(2, "at least 2")),
      value_key<std::vector<int64_t>>("model.hidden", &C::hidden, {256, 256},
                                      "width of each hidden layer; `[]` is a linear model",
                                      at_least<std::vector<int64_t>>(1, "a list of positive widths")),
      enum_key("model.activation", &C::activation, kActivationNames, Activation::kReLU,
               list_names(kActivationNames, " or ", "`")),
      value_key<double>("model.dropout", &C::dropout, 0.0, "dropout after each hidden activation, in [0, 1)",
                        fraction()),
      trainer_key(value_key<int64_t>("train.epochs", &C::epochs, trainer_defaults().epochs(), "passes over the training data",
                                     at_least<int64_t>(1, "at least 1"))),
      trainer_key(value_key<int64_t>("train.max_steps", &C::max_steps, trainer_defaults().max_steps(),
                                     "stop after this many steps in all; 0 means no limit",
                                     at_least<int64_t>(0, "at least 0 (0: no limit)"))),
      trainer_key(value_key<int64_t>("train.batch_size", &C::batch_size, trainer_defaults().batch_size(),
                                     "samples per step and per process", at_least<int64_t>(1, "at least 1"))),
      value_key<double>("train.lr", &C::lr, 0.001, "learning rate",
                        {[](double lr) { return lr > 0.0 && std::isfinite(lr); }, "a positive number"}),
      enum_key("train.optimizer", &C::optimizer, kOptimizerNames, OptimizerKind::kAdam,
               list_names(kOptimizerNames, " or ", "`")),
      trainer_key(enum_key("train.precision", &C::precision, kPrecisionNames, trainer_defaults().precision(),
                           "`fp32`, or the forward pass under autocast in `bf16`, or in `fp16` with a loss scaler (one "
                           "device read per step); `bf16` on the CPU takes the written-out step (bitwise what "
                           "autocast and autograd compute), `fp16` and `bf16` on a GPU train through autograd")),
      value_key<double>("train.momentum", &C::momentum, 0.9, "SGD momentum, in [0, 1); other optimizers ignore it",
                        fraction()),
      nesterov_key(),
      value_key<double>("train.weight_decay", &C::weight_decay, 0.0,
                        "L2 penalty (sgd, adam) or decoupled weight decay (adamw)",
                        {[](double decay) { return decay >= 0.0 && std::isfinite(decay); }, "at least 0"}),
      enum_key("train.lr_schedule", &C::lr_schedule, kLrDecayNames, LrDecay::kConstant,
               "the learning rate after the warm-up, per optimizer step: `constant`, `cosine` (down to "
               "train.lr_min_factor times it at the last step) or `step` (times train.lr_gamma every "
               "train.lr_step_size steps)"),
      value_key<int64_t>("train.warmup_steps", &C::warmup_steps, 0,
                         "optimizer steps of a linear warm-up of the learning rate from 0",
                         at_least<int64_t>(0, "at least 0")),
      value_key<double>("train.lr_min_factor", &C::lr_min_factor, 0.0,
                        "`cosine`: the learning rate's floor, as a fraction of train.lr",
                        {[](double factor) { return factor >= 0.0 && factor <= 1.0; }, "in [0, 1]"}),
      value_key<int64_t>("train.lr_step_size", &C::lr_step_size, 1000, "`step`: optimizer steps between decays",
                         at_least<int64_t>(1, "at least 1")),
      value_key<double>("train.lr_gamma", &C::lr_gamma, 0.1, "`step`: the factor of each decay",
                        {[](double gamma) { return gamma > 0.0 && std::isfinite(gamma); }, "a positive number"}),
      trainer_key(value_key<int64_t>("train.accumulate_grad_batches", &C::accumulate_grad_batches,
                                     trainer_defaults().accumulate_grad_batches(),
                                     "batches whose gradients make one optimizer step (the gradients summed over "
                                     "processes once per step)",
                                     at_least<int64_t>(1, "at least 1"))),
      trainer_key(value_key<double>("train.clip_grad_norm", &C::clip_grad_norm, trainer_defaults().clip_grad_norm(),
                                    "clip the gradients' global L2 norm to this before each optimizer step (after "
                                    "unscaling and the sum over processes); 0 means no clipping",
                                    {[](double norm) { return norm >= 0.0 && std::isfinite(norm); }, "at least 0"})),
      trainer_key(value_key<double>("train.max_time", &C::max_time, trainer_defaults().max_time(),
                                    "seconds this run may train before it stops with a checkpoint (continue it with "
                                    "--auto-resume); 0 means no limit",
                                    {[](double seconds) { return seconds >= 0.0 && std::isfinite(seconds); },
                                     "at least 0"})),
      trainer_key(value_key<std::string>("train.monitor", &C::monitor, trainer_defaults().monitor(),
                                         "the validation figure train.save_top_k and early stopping watch: "
                                         "`val_loss` or `val_accuracy`",
                                         {[](const std::string& name) { return name.rfind("val_", 0) == 0; },
                                          "`val_loss` or `val_` and a metric's name"})),
      trainer_key(enum_key("train.monitor_mode", &C::monitor_mode, kMonitorModeNames, trainer_defaults().monitor_mode(),
                           "whether train.monitor improves downwards (`min`) or upwards (`max`)")),
      trainer_key(value_key<int64_t>("train.save_top_k", &C::save_top_k, trainer_defaults().save_top_k(),
                                     "keep the checkpoints of the k best validations by train.monitor "
                                     "(`checkpoints/best-*.pt`); 0 keeps none",
                                     at_least<int64_t>(0, "at least 0"))),
      trainer_key(value_key<int64_t>("train.early_stopping_patience", &C::early_stopping_patience,
                                     trainer_defaults().early_stopping_patience(),
                                     "stop after this many validations in a row without improving train.monitor; 0 "
                                     "never stops early",
                                     at_least<int64_t>(0, "at least 0"))),
      trainer_key(value_key<double>("train.early_stopping_min_delta", &C::early_stopping_min_delta,
                                    trainer_defaults().early_stopping_min_delta(),
                                    "the least change of train.monitor that counts as an improvement",
                                    {[](double delta) { return delta >= 0.0 && std::isfinite(delta); },
                                     "at least 0"})),
      trainer_key(value_key<int64_t>(
          "train.log_every", &C::log_every, trainer_defaults().log_every(),
          "steps between metric flushes: the only device-to-host transfers of the training loop",
          at_least<int64_t>(1, "at least 1"))),
      trainer_key(value_key<int64_t>("train.checkpoint_every", &C::checkpoint_every, trainer_defaults().checkpoint_every(),
                                     "steps between checkpoints; 0 writes one at the end only",
                                     at_least<int64_t>(0, "at least 0 (0: at the end only)"))),
      trainer_key(value_key<int64_t>("train.keep_checkpoints", &C::keep_checkpoints, trainer_defaults().keep_checkpoints(),
                                     "step-numbered checkpoints kept beside `last.pt`",
                                     at_least<int64_t>(0, "at least 0"))),
      trainer_key(value_key<bool>("train.tensorboard", &C::tensorboard, trainer_defaults().tensorboard(),
                                  "also write the metrics as a TensorBoard event file (`events.out.tfevents.*`) in "
                                  "the run folder, a new one each time the run starts or resumes")),
      trainer_key(enum_key("loader.placement", &C::placement, kPlacementNames, trainer_defaults().placement(),
                           "`device` (whole data set on the device), `pinned` (prefetched through reused pinned "
                           "buffers), `pageable`, or `auto` (pinned on a GPU, device on the CPU)")),
      trainer_key(value_key<int64_t>("loader.prefetch", &C::prefetch, trainer_defaults().prefetch(),
                                     "batches prepared ahead by the loader thread (pinned ring slots)",
                                     {[](int64_t prefetch) { return prefetch >= 1 && prefetch <= 64; }, "in [1, 64]"})),
      trainer_key(value_key<bool>("loader.shuffle", &C::shuffle, trainer_defaults().shuffle(),
                                  "a new sample order each epoch, from `seed` and the epoch")),
      trainer_key(value_key<int64_t>("loader.shuffle_block", &C::shuffle_block, trainer_defaults().shuffle_block(),
                                     "0 shuffles single samples; N > 0 shuffles blocks of N neighbouring samples, then "
                                     "the samples of each 16 blocks together: long reads from a slow disk",
                                     at_least<int64_t>(0, "at least 0"))),
      trainer_key(value_key<bool>("loader.drop_last", &C::drop_last, trainer_defaults().drop_last(),
                                  "skip the last batch of an epoch when it is short")),
      trainer_key(enum_key("dist.backend", &C::dist_backend, kBackendNames, trainer_defaults().dist_backend(),
                           "c10d backend for multi-process runs: `auto` (NCCL on CUDA, else Gloo), `gloo` or `nccl`")),
      trainer_key(value_key<int64_t>("dist.timeout", &C::dist_timeout, trainer_defaults().dist_timeout(),
                                     "seconds a rank waits for another (the rendezvous, a collective, the store, a "
                                     "heartbeat) before the run fails naming it",
                                     at_least<int64_t>(1, "at least 1"))),
      value_key<bool>(
          "dist.data_parallel", &C::dist_data_parallel, false,
          "one process on every visible GPU through LibTorch's DataParallel (CUDA builds; see `dkit devices`)"),
  };
  return specs;
}

// Keys that were renamed, old name to new: configs and checkpoints written before the rename still read.
const std::map<std::string, std::string> kRenamedKeys = {{"dist.timeout_seconds", "dist.timeout"}};

const KeySpec* find_key(const std::string& name) {
  for (const auto& spec : key_specs()) {
    if (spec.doc.name == name) {
      return &spec;
    }
  }
  return nullptr;
}

std::string section_of(const std::string& name) {
  const auto dot = name.find('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

// The sections (`data`, `model`, ...), in the order of their first key.
const std::vector<std::string>& sections() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> found;
    for (const auto& spec : key_specs()) {
      const std::string section = section_of(spec.doc.name);
      if (!section.empty() && std::find(found.begin(), found.end(), section) == found.end()) {
        found.push_back(section);
      }
    }
    return found;
  }();
  return names;
}

bool is_section(const std::string& name) {
  return std::find(sections().begin(), sections().end(), name) != sections().end();
}

std::string keys_in(const std::string& section) {
  std::string names;
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const auto& spec : key_specs()) {
    const std::string& name = spec.doc.name;
    if (name.compare(0, prefix.size(), prefix) != 0 || name.find('.', prefix.size()) != std::string::npos) {
      continue;
    }
    names += (names.empty() ? "" : ", ") + name.substr(prefix.size());
  }
  if (section.empty()) {
    for (const auto& s : sections()) {
      names += ", " + s;
    }
  }
  return names;
}

struct Walker {
  TrainConfig& config;
  std::string source;
  std::string base_dir;
  const std::map<std::string, std::string>& set_origins;

  Where where(const std::string& name, const YAML::Node& key_node) const {
    for (std::string prefix = name;;) {
      const auto found = set_origins.find(prefix);
      if (found != set_origins.end()) {
        return {found->second, true, base_dir};
      }
      const auto dot = prefix.rfind('.');
      if (dot == std::string::npos) {
        break;
      }
      prefix.resize(dot);
    }
    const int line = key_node.Mark().line;
    return {line >= 0 ? source + " line " + std::to_string(line + 1) : source, false, base_dir};
  }

  void walk(const YAML::Node& map, const std::string& section) {
    for (const auto& entry : map) {
      const std::string key = entry.first.Scalar();
      const std::string name = section.empty() ? key : section + "." + key;
      const Where at = where(name, entry.first);
      if (section.empty() && is_section(key)) {
        if (entry.second.IsNull()) {
          continue;
        }
        if (!entry.second.IsMap()) {
          throw Error(detail::concat("config section '", key, "' (", at.text, ") must be a map of keys, got ",
                                     describe(entry.second)));
        }
        walk(entry.second, key);
        continue;
      }
      const auto renamed = kRenamedKeys.find(name);
      const KeySpec* spec = find_key(renamed == kRenamedKeys.end() ? name : renamed->second);
      if (spec == nullptr) {
        throw Error(detail::concat("unknown config key '", printable(name), "' (", at.text, "); known keys",
                                   section.empty() ? "" : " in '" + section + "'", ": ", keys_in(section)));
      }
      config.values[spec->doc.name] = spec->read(entry.second, at);
      config.origins[spec->doc.name] = at.text;
    }
  }
};

void apply_override(YAML::Node& root, const std::string& assignment, std::map<std::string, std::string>& origins) {
  const auto eq = assignment.find('=');
  DKIT_CHECK(eq != std::string::npos && eq > 0, "--set expects KEY=VALUE, got '", printable(assignment), "'");
  const std::string name = assignment.substr(0, eq);
  const std::string origin = "--set " + printable(assignment);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw Error(detail::concat(origin, ": the value is not valid YAML: ", e.msg));
  }
  std::vector<std::string> parts;
  std::stringstream stream(name);
  for (std::string part; std::getline(stream, part, '.');) {
    DKIT_CHECK(!part.empty(), origin, ": empty part in key '", printable(name), "'");
    parts.push_back(part);
  }
  if (parts.size() == 1) {
    root[parts[0]] = value;
  } else {
    DKIT_CHECK(parts.size() == 2 && is_section(parts[0]), "unknown config key '", printable(name), "' (", origin,
               "); known keys: ", keys_in(""));
    YAML::Node section = root[parts[0]];
    if (!section.IsMap()) {
      section = YAML::Node(YAML::NodeType::Map);
      root[parts[0]] = section;
    }
    section[parts[1]] = value;
  }
  origins[name] = origin;
}

} // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = [] {
    std::vector<ConfigKey> docs;
    for (const auto& spec : key_specs()) {
      docs.push_back(spec.doc);
    }
    return docs;
  }();
  return keys;
}

TrainConfig parse_config(const std::string& yaml, const std::string& source, const std::string& base_dir,
                         const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    throw Error(detail::concat(source, " line ", e.mark.line + 1, ", column ", e.mark.column + 1,
                               ": invalid YAML: ", e.msg));
  }
  if (root.IsNull()) {
    root = YAML::Node(YAML::NodeType::Map);
  }
  DKIT_CHECK(root.IsMap(), source, ": a config must be a map of keys, got ", describe(root));
  std::map<std::string, std::string> set_origins;
  for (const auto& assignment : overrides) {
    apply_override(root, assignment, set_origins);
  }
  TrainConfig config;
  Walker{config, source, base_dir, set_origins}.walk(root, "");
  return config;
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  DKIT_CHECK(in.good(), "cannot read config file '", path, "': ",
             fs::exists(path) ? "permission denied or not a file" : "no such file");
  std::stringstream text;
  text << in.rdbuf();
  const fs::path parent = fs::path(path).parent_path();
  return parse_config(text.str(), path, parent.empty() ? "." : parent.string(), overrides);
}

FullTrainConfig::FullTrainConfig(const TrainConfig& config) {
  for (const auto& spec : key_specs()) {
    spec.resolve(config, *this);
  }
}

namespace {

// The keys a Trainer takes, each a member of FullTrainConfig and of TrainerOptions: one list for both directions.
template <typename Copy>
void trainer_fields(FullTrainConfig& c, TrainerOptions& o, Copy copy) {
  copy(c.device, o.device());
  copy(c.seed, o.seed());
  copy(c.threads, o.threads());
  copy(c.epochs, o.epochs());
  copy(c.max_steps, o.max_steps());
  copy(c.batch_size, o.batch_size());
  copy(c.precision, o.precision());
  copy(c.log_every, o.log_every());
  copy(c.accumulate_grad_batches, o.accumulate_grad_batches());
  copy(c.clip_grad_norm, o.clip_grad_norm());
  copy(c.max_time, o.max_time());
  copy(c.monitor, o.monitor());
  copy(c.monitor_mode, o.monitor_mode());
  copy(c.save_top_k, o.save_top_k());
  copy(c.early_stopping_patience, o.early_stopping_patience());
  copy(c.early_stopping_min_delta, o.early_stopping_min_delta());
  copy(c.checkpoint_every, o.checkpoint_every());
  copy(c.keep_checkpoints, o.keep_checkpoints());
  copy(c.tensorboard, o.tensorboard());
  copy(c.placement, o.placement());
  copy(c.prefetch, o.prefetch());
  copy(c.shuffle, o.shuffle());
  copy(c.shuffle_block, o.shuffle_block());
  copy(c.drop_last, o.drop_last());
  copy(c.dist_backend, o.dist_backend());
  copy(c.dist_timeout, o.dist_timeout());
}

std::string yaml_of(const FullTrainConfig& config, bool trainer_only) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string open_section;
  for (const auto& spec : key_specs()) {
    if (trainer_only && !spec.trainer) {
      continue;
    }
    const std::string section = section_of(spec.doc.name);
    if (section != open_section) {
      if (!open_section.empty()) {
        out << YAML::EndMap;
      }
      out << YAML::Key << section << YAML::Value << YAML::BeginMap;
      open_section = section;
    }
    spec.write(config, out);
  }
  if (!open_section.empty()) {
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

} // namespace

std::string to_yaml(const FullTrainConfig& config) {
  return yaml_of(config, /*trainer_only=*/false);
}

TrainerOptions trainer_options(const FullTrainConfig& config, std::string out_dir) {
  TrainerOptions options(std::move(out_dir));
  FullTrainConfig source = config;
  trainer_fields(source, options, [](auto& from, auto& to) { to = from; });
  return options;
}

std::string to_yaml(const TrainerOptions& options) {
  // Synthetic data, which needs no data.path: only the Trainer's keys are written.
  FullTrainConfig config(parse_config("", "TrainerOptions", ".", {"data.source=synthetic"}));
  TrainerOptions source = options;
  trainer_fields(config, source, [](auto& to, auto& from) { to = from; });
  return yaml_of(config, /*trainer_only=*/true);
}

} // namespace dkit
