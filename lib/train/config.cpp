#include <dkit/train/config.h>

#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/device/device.h>

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

namespace dkit {
namespace {

namespace fs = std::filesystem;

struct Where {
  std::string text;
  bool from_set = false;
  std::string base_dir;
};

struct KeySpec {
  ConfigKey doc;
  std::function<void(TrainConfig&, const YAML::Node&, const Where&)> read;
};

const char* const kSections[] = {"data", "model", "train", "loader", "dist"};

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
  return "'" + node.Scalar() + "'";
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

int64_t read_int(const std::string& key, const YAML::Node& node, const Where& where) {
  const auto value = scalar_int(node);
  if (!value) {
    type_error(key, where, "an integer", node);
  }
  return *value;
}

double read_double(const std::string& key, const YAML::Node& node, const Where& where) {
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

bool read_bool(const std::string& key, const YAML::Node& node, const Where& where) {
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

std::string read_string(const std::string& key, const YAML::Node& node, const Where& where) {
  if (!node.IsScalar()) {
    type_error(key, where, "a string", node);
  }
  return node.Scalar();
}

std::vector<int64_t> read_int_list(const std::string& key, const YAML::Node& node, const Where& where) {
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

std::string read_path(const std::string& key, const YAML::Node& node, const Where& where) {
  const fs::path path = read_string(key, node, where);
  if (path.is_absolute()) {
    return path.lexically_normal().string();
  }
  const fs::path base = where.from_set ? fs::current_path() : fs::absolute(where.base_dir);
  return (base / path).lexically_normal().string();
}

template <typename T, typename Field, typename Reader>
KeySpec key(const char* name, const char* type, const char* default_value, const char* meaning, Field field,
            Reader reader) {
  return {{name, type, default_value, meaning},
          [field, reader, name](TrainConfig& config, const YAML::Node& node, const Where& where) {
            field(config) = T(reader(name, node, where));
          }};
}

#define DKIT_FIELD(member) [](TrainConfig& c) -> auto& { return c.member; }

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      key<std::string>("device", "string", "auto",
                       "`auto` (the first GPU, else the CPU), `cpu`, `cuda` or `cuda:N`; an absent device is an error",
                       DKIT_FIELD(device), read_string),
      key<int64_t>("seed", "int", "0", "seeds weight initialisation, dropout, the validation split and the sample order",
                   DKIT_FIELD(seed), read_int),
      key<int64_t>("threads", "int", "0", "LibTorch's CPU threads; 0 uses every CPU this process may run on",
                   DKIT_FIELD(threads), read_int),
      key<std::string>("data.source", "string", "csv",
                       "`csv` (numbers, no header), `mnist` (a folder of IDX files, MNIST or Fashion-MNIST) or "
                       "`synthetic` (seeded Gaussian blobs)",
                       DKIT_FIELD(data.source), read_string),
      key<std::string>("data.path", "path", "(required for csv, mnist)",
                       "the CSV file or IDX folder; relative to the config file's folder (to the current folder in "
                       "`--set`)",
                       DKIT_FIELD(data.path), read_path),
      key<int64_t>("data.label_column", "int", "-1", "CSV column holding the integer class label; negative counts from the end",
                   DKIT_FIELD(data.label_column), read_int),
      key<std::string>("data.scaling", "string", "standardize",
                       "feature scaling fitted on the training part and stored in checkpoints: `none`, `standardize` "
                       "(zero mean, unit variance) or `minmax` (to [0, 1])",
                       DKIT_FIELD(data.scaling), read_string),
      key<double>("data.val_fraction", "float", "0.2", "fraction of samples held out for validation, in [0, 1)",
                  DKIT_FIELD(data.val_fraction), read_double),
      key<int64_t>("data.samples", "int", "2000", "synthetic only: number of samples", DKIT_FIELD(data.samples),
                   read_int),
      key<int64_t>("data.features", "int", "32", "synthetic only: features per sample", DKIT_FIELD(data.features),
                   read_int),
      key<int64_t>("data.classes", "int", "4", "synthetic only: number of classes", DKIT_FIELD(data.classes),
                   read_int),
      key<std::vector<int64_t>>("model.hidden", "list of int", "[256, 256]", "width of each hidden layer; `[]` is a linear model",
                                DKIT_FIELD(model.hidden), read_int_list),
      key<std::string>("model.activation", "string", "relu", "`relu`, `gelu` or `tanh`", DKIT_FIELD(model.activation),
                       read_string),
      key<double>("model.dropout", "float", "0", "dropout after each hidden activation, in [0, 1)",
                  DKIT_FIELD(model.dropout), read_double),
      key<int64_t>("train.epochs", "int", "10", "passes over the training data", DKIT_FIELD(train.epochs), read_int),
      key<int64_t>("train.max_steps", "int", "0", "stop after this many steps in all; 0 means no limit",
                   DKIT_FIELD(train.max_steps), read_int),
      key<int64_t>("train.batch_size", "int", "64", "samples per step and per process", DKIT_FIELD(train.batch_size),
                   read_int),
      key<double>("train.lr", "float", "0.001", "learning rate", DKIT_FIELD(train.lr), read_double),
      key<std::string>("train.optimizer", "string", "adam", "`sgd`, `adam` or `adamw`", DKIT_FIELD(train.optimizer),
                       read_string),
      key<double>("train.momentum", "float", "0.9", "SGD momentum, in [0, 1); other optimizers ignore it",
                  DKIT_FIELD(train.momentum), read_double),
      key<double>("train.weight_decay", "float", "0", "L2 penalty (sgd, adam) or decoupled weight decay (adamw)",
                  DKIT_FIELD(train.weight_decay), read_double),
      key<int64_t>("train.log_every", "int", "50",
                   "steps between metric flushes: the only device-to-host transfers of the training loop",
                   DKIT_FIELD(train.log_every), read_int),
      key<int64_t>("train.checkpoint_every", "int", "500", "steps between checkpoints; 0 writes one at the end only",
                   DKIT_FIELD(train.checkpoint_every), read_int),
      key<int64_t>("train.keep_checkpoints", "int", "3", "step-numbered checkpoints kept beside `last.pt`",
                   DKIT_FIELD(train.keep_checkpoints), read_int),
      key<std::string>("loader.placement", "string", "auto",
                       "`device` (whole data set on the device), `pinned` (prefetched through reused pinned "
                       "buffers), `pageable`, or `auto` (pinned on a GPU, device on the CPU)",
                       DKIT_FIELD(loader.placement), read_string),
      key<int64_t>("loader.prefetch", "int", "2", "batches prepared ahead by the loader thread (pinned ring slots)",
                   DKIT_FIELD(loader.prefetch), read_int),
      key<bool>("loader.shuffle", "bool", "true", "a new sample order each epoch, from `seed` and the epoch",
                DKIT_FIELD(loader.shuffle), read_bool),
      key<bool>("loader.drop_last", "bool", "false", "skip the last batch of an epoch when it is short",
                DKIT_FIELD(loader.drop_last), read_bool),
      key<std::string>("dist.backend", "string", "auto", "c10d backend for multi-process runs: `auto` (NCCL on CUDA, "
                       "else Gloo), `gloo` or `nccl`",
                       DKIT_FIELD(dist.backend), read_string),
      key<int64_t>("dist.timeout_seconds", "int", "60",
                   "how long a collective waits for a lost process before the run fails",
                   DKIT_FIELD(dist.timeout_seconds), read_int),
      key<bool>("dist.data_parallel", "bool", "false",
                "one process on every visible GPU through LibTorch's DataParallel (CUDA builds; see `dkit devices`)",
                DKIT_FIELD(dist.data_parallel), read_bool),
  };
  return specs;
}

#undef DKIT_FIELD

const KeySpec* find_key(const std::string& name) {
  for (const auto& spec : key_specs()) {
    if (spec.doc.name == name) {
      return &spec;
    }
  }
  return nullptr;
}

bool is_section(const std::string& name) {
  for (const char* section : kSections) {
    if (name == section) {
      return true;
    }
  }
  return false;
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
    for (const char* s : kSections) {
      names += std::string(", ") + s;
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
      const KeySpec* spec = find_key(name);
      if (spec == nullptr) {
        throw Error(detail::concat("unknown config key '", name, "' (", at.text, "); known keys",
                                   section.empty() ? "" : " in '" + section + "'", ": ", keys_in(section)));
      }
      spec->read(config, entry.second, at);
      config.origins[name] = at.text;
    }
  }
};

void apply_override(YAML::Node& root, const std::string& assignment, std::map<std::string, std::string>& origins) {
  const auto eq = assignment.find('=');
  DKIT_CHECK(eq != std::string::npos && eq > 0, "--set expects KEY=VALUE, got '", assignment, "'");
  const std::string name = assignment.substr(0, eq);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw Error(detail::concat("--set ", assignment, ": the value is not valid YAML: ", e.msg));
  }
  std::vector<std::string> parts;
  std::stringstream stream(name);
  for (std::string part; std::getline(stream, part, '.');) {
    DKIT_CHECK(!part.empty(), "--set ", assignment, ": empty part in key '", name, "'");
    parts.push_back(part);
  }
  if (parts.size() == 1) {
    root[parts[0]] = value;
  } else {
    DKIT_CHECK(parts.size() == 2 && is_section(parts[0]), "unknown config key '", name, "' (--set ", assignment,
               "); known keys: ", keys_in(""));
    YAML::Node section = root[parts[0]];
    if (!section.IsMap()) {
      section = YAML::Node(YAML::NodeType::Map);
      root[parts[0]] = section;
    }
    section[parts[1]] = value;
  }
  origins[name] = "--set " + assignment;
}

const std::string& given(const TrainConfig& config, const std::string& name) {
  static const std::string kDefault = "default";
  const auto found = config.origins.find(name);
  return found == config.origins.end() ? kDefault : found->second;
}

template <typename T>
void check_range(const TrainConfig& config, const std::string& name, T value, bool ok, const char* requirement) {
  DKIT_CHECK(ok, "config key '", name, "' (", given(config, name), ") must be ", requirement, ", got ", value);
}

std::string check_choice(const TrainConfig& config, const std::string& name, const std::string& value,
                         std::initializer_list<const char*> choices) {
  std::string listing;
  for (const char* choice : choices) {
    if (value == choice) {
      return value;
    }
    listing += (listing.empty() ? "" : ", ") + std::string(choice);
  }
  throw Error(detail::concat("config key '", name, "' (", given(config, name), ") must be one of ", listing,
                             ", got '", value, "'"));
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

FullTrainConfig::FullTrainConfig(const TrainConfig& c) {
  device = c.device.value_or("auto");
  Device parsed = cpu();
  DKIT_CHECK(try_parse_device(device, parsed), "config key 'device' (", given(c, "device"),
             ") must be auto, cpu, cuda or cuda:N, got '", device, "'");
  seed = c.seed.value_or(0);
  threads = c.threads.value_or(0);
  check_range(c, "threads", threads, threads >= 0, "at least 0");

  const std::string source = check_choice(c, "data.source", c.data.source.value_or("csv"), {"csv", "mnist", "synthetic"});
  data_source = source == "csv" ? DataSource::kCsv : source == "mnist" ? DataSource::kMnist : DataSource::kSynthetic;
  data_path = c.data.path.value_or("");
  DKIT_CHECK(data_source == DataSource::kSynthetic || !data_path.empty(), "config key 'data.path' is required when "
             "data.source is ", source);
  if (data_source == DataSource::kSynthetic) {
    data_path.clear();
  }
  label_column = c.data.label_column.value_or(-1);
  scaling = check_choice(c, "data.scaling", c.data.scaling.value_or("standardize"), {"none", "standardize", "minmax"});
  val_fraction = c.data.val_fraction.value_or(0.2);
  check_range(c, "data.val_fraction", val_fraction, val_fraction >= 0.0 && val_fraction < 1.0, "in [0, 1)");
  synthetic_samples = c.data.samples.value_or(2000);
  check_range(c, "data.samples", synthetic_samples, synthetic_samples >= 2, "at least 2");
  synthetic_features = c.data.features.value_or(32);
  check_range(c, "data.features", synthetic_features, synthetic_features >= 1, "at least 1");
  synthetic_classes = c.data.classes.value_or(4);
  check_range(c, "data.classes", synthetic_classes, synthetic_classes >= 2, "at least 2");

  hidden = c.model.hidden.value_or(std::vector<int64_t>{256, 256});
  for (const int64_t width : hidden) {
    check_range(c, "model.hidden", width, width >= 1, "a list of positive widths");
  }
  activation = check_choice(c, "model.activation", c.model.activation.value_or("relu"), {"relu", "gelu", "tanh"});
  dropout = c.model.dropout.value_or(0.0);
  check_range(c, "model.dropout", dropout, dropout >= 0.0 && dropout < 1.0, "in [0, 1)");

  epochs = c.train.epochs.value_or(10);
  check_range(c, "train.epochs", epochs, epochs >= 1, "at least 1");
  max_steps = c.train.max_steps.value_or(0);
  check_range(c, "train.max_steps", max_steps, max_steps >= 0, "at least 0 (0: no limit)");
  batch_size = c.train.batch_size.value_or(64);
  check_range(c, "train.batch_size", batch_size, batch_size >= 1, "at least 1");
  lr = c.train.lr.value_or(0.001);
  check_range(c, "train.lr", lr, lr > 0.0 && std::isfinite(lr), "a positive number");
  const std::string opt = check_choice(c, "train.optimizer", c.train.optimizer.value_or("adam"), {"sgd", "adam", "adamw"});
  optimizer = opt == "sgd" ? OptimizerKind::kSgd : opt == "adam" ? OptimizerKind::kAdam : OptimizerKind::kAdamW;
  momentum = c.train.momentum.value_or(0.9);
  check_range(c, "train.momentum", momentum, momentum >= 0.0 && momentum < 1.0, "in [0, 1)");
  weight_decay = c.train.weight_decay.value_or(0.0);
  check_range(c, "train.weight_decay", weight_decay, weight_decay >= 0.0 && std::isfinite(weight_decay),
              "at least 0");
  log_every = c.train.log_every.value_or(50);
  check_range(c, "train.log_every", log_every, log_every >= 1, "at least 1");
  checkpoint_every = c.train.checkpoint_every.value_or(500);
  check_range(c, "train.checkpoint_every", checkpoint_every, checkpoint_every >= 0, "at least 0 (0: at the end only)");
  keep_checkpoints = c.train.keep_checkpoints.value_or(3);
  check_range(c, "train.keep_checkpoints", keep_checkpoints, keep_checkpoints >= 0, "at least 0");

  placement = check_choice(c, "loader.placement", c.loader.placement.value_or("auto"),
                           {"auto", "device", "pinned", "pageable"});
  prefetch = c.loader.prefetch.value_or(2);
  check_range(c, "loader.prefetch", prefetch, prefetch >= 1 && prefetch <= 64, "in [1, 64]");
  shuffle = c.loader.shuffle.value_or(true);
  drop_last = c.loader.drop_last.value_or(false);

  dist_backend = check_choice(c, "dist.backend", c.dist.backend.value_or("auto"), {"auto", "gloo", "nccl"});
  dist_timeout_seconds = c.dist.timeout_seconds.value_or(60);
  check_range(c, "dist.timeout_seconds", dist_timeout_seconds, dist_timeout_seconds >= 1, "at least 1");
  dist_data_parallel = c.dist.data_parallel.value_or(false);
}

std::string to_yaml(const FullTrainConfig& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "device" << YAML::Value << c.device;
  out << YAML::Key << "seed" << YAML::Value << c.seed;
  out << YAML::Key << "threads" << YAML::Value << c.threads;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "source" << YAML::Value << to_string(c.data_source);
  if (!c.data_path.empty()) {
    out << YAML::Key << "path" << YAML::Value << c.data_path;
  }
  out << YAML::Key << "label_column" << YAML::Value << c.label_column;
  out << YAML::Key << "scaling" << YAML::Value << c.scaling;
  out << YAML::Key << "val_fraction" << YAML::Value << format_number(c.val_fraction);
  out << YAML::Key << "samples" << YAML::Value << c.synthetic_samples;
  out << YAML::Key << "features" << YAML::Value << c.synthetic_features;
  out << YAML::Key << "classes" << YAML::Value << c.synthetic_classes;
  out << YAML::EndMap;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "hidden" << YAML::Value << YAML::Flow << c.hidden;
  out << YAML::Key << "activation" << YAML::Value << c.activation;
  out << YAML::Key << "dropout" << YAML::Value << format_number(c.dropout);
  out << YAML::EndMap;
  out << YAML::Key << "train" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "epochs" << YAML::Value << c.epochs;
  out << YAML::Key << "max_steps" << YAML::Value << c.max_steps;
  out << YAML::Key << "batch_size" << YAML::Value << c.batch_size;
  out << YAML::Key << "lr" << YAML::Value << format_number(c.lr);
  out << YAML::Key << "optimizer" << YAML::Value << to_string(c.optimizer);
  out << YAML::Key << "momentum" << YAML::Value << format_number(c.momentum);
  out << YAML::Key << "weight_decay" << YAML::Value << format_number(c.weight_decay);
  out << YAML::Key << "log_every" << YAML::Value << c.log_every;
  out << YAML::Key << "checkpoint_every" << YAML::Value << c.checkpoint_every;
  out << YAML::Key << "keep_checkpoints" << YAML::Value << c.keep_checkpoints;
  out << YAML::EndMap;
  out << YAML::Key << "loader" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "placement" << YAML::Value << c.placement;
  out << YAML::Key << "prefetch" << YAML::Value << c.prefetch;
  out << YAML::Key << "shuffle" << YAML::Value << c.shuffle;
  out << YAML::Key << "drop_last" << YAML::Value << c.drop_last;
  out << YAML::EndMap;
  out << YAML::Key << "dist" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "backend" << YAML::Value << c.dist_backend;
  out << YAML::Key << "timeout_seconds" << YAML::Value << c.dist_timeout_seconds;
  out << YAML::Key << "data_parallel" << YAML::Value << c.dist_data_parallel;
  out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

const char* to_string(DataSource source) {
  switch (source) {
    case DataSource::kCsv: return "csv";
    case DataSource::kMnist: return "mnist";
    case DataSource::kSynthetic: return "synthetic";
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled DataSource ", static_cast<int>(source));
}

} // namespace dkit
