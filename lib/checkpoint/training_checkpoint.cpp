#include <dkit/checkpoint/training_checkpoint.h>

#include <dkit/checkpoint/optimizer_kind.h>
#include <dkit/core/compat.h>
#include <dkit/core/error.h>
#include <dkit/device/device.h>

#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

namespace dkit {
namespace {

namespace fs = std::filesystem;
using torch::optim::Adam;
using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::SGD;
using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

OptimizerKind optimizer_kind(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const SGD*>(&optimizer) != nullptr) {
    return OptimizerKind::kSgd;
  }
  if (dynamic_cast<const Adam*>(&optimizer) != nullptr) {
    return OptimizerKind::kAdam;
  }
  if (dynamic_cast<const AdamW*>(&optimizer) != nullptr) {
    return OptimizerKind::kAdamW;
  }
  throw Error("optimizer state can be saved and restored for torch::optim::SGD, Adam and AdamW only");
}

template <typename Map>
typename Map::key_type state_key(const Map& /*map*/, const at::Tensor& param) {
  return compat::optimizer_state_key<typename Map::key_type>(param);
}

// Reads dict entries with errors that say which file and which entry.
class Fields {
 public:
  Fields(const PickleValue& dict, std::string where) : dict_(dict), where_(std::move(where)) {
    DKIT_CHECK(dict.is_dict(), where_, " is a ", dict.type_name(), ", expected a dict");
  }

  const PickleValue* find(const char* key) const {
    return dict_.find(key);
  }

  const PickleValue& get(const char* key) const {
    const PickleValue* value = dict_.find(key);
    DKIT_CHECK(value != nullptr, where_, " has no '", key, "'");
    return *value;
  }

  double number(const char* key) const {
    const PickleValue& value = get(key);
    DKIT_CHECK(value.is_int() || value.is_double(), where_, ": '", key, "' is a ", value.type_name(),
               ", expected a number");
    return value.to_double();
  }

  int64_t integer(const char* key) const {
    const PickleValue& value = get(key);
    DKIT_CHECK(value.is_int(), where_, ": '", key, "' is a ", value.type_name(), ", expected an int");
    return value.to_int();
  }

  bool flag(const char* key, bool fallback) const {
    const PickleValue* value = dict_.find(key);
    if (value == nullptr || value->is_none()) {
      return fallback;
    }
    DKIT_CHECK(value->is_bool(), where_, ": '", key, "' is a ", value->type_name(), ", expected a bool");
    return value->to_bool();
  }

  const std::string& text(const char* key) const {
    const PickleValue& value = get(key);
    DKIT_CHECK(value.is_string(), where_, ": '", key, "' is a ", value.type_name(), ", expected a str");
    return value.to_string();
  }

  // A tensor entry, or an undefined tensor when the entry is missing or None and `optional`.
  at::Tensor tensor(const char* key, bool optional = false) const {
    const PickleValue* value = dict_.find(key);
    if (optional && (value == nullptr || value->is_none())) {
      return {};
    }
    DKIT_CHECK(value != nullptr, where_, " has no '", key, "'");
    DKIT_CHECK(value->is_tensor(), where_, ": '", key, "' is a ", value->type_name(), ", expected a Tensor");
    return value->to_tensor();
  }

  const std::string& where() const {
    return where_;
  }

 private:
  const PickleValue& dict_;
  std::string where_;
};

PickleValue float_list(std::initializer_list<double> values) {
  PickleValue::Items items;
  for (const double v : values) {
    items.emplace_back(v);
  }
  return PickleValue::tuple(std::move(items));
}

PickleValue group_options(OptimizerKind kind, const torch::optim::OptimizerOptions& options) {
  PickleValue group = PickleValue::dict();
  if (kind == OptimizerKind::kSgd) {
    const auto& o = static_cast<const SGDOptions&>(options);
    group.set("lr", o.lr());
    group.set("momentum", o.momentum());
    group.set("dampening", o.dampening());
    group.set("weight_decay", o.weight_decay());
    group.set("nesterov", o.nesterov());
    group.set("maximize", false);
    group.set("foreach", PickleValue());
    group.set("differentiable", false);
    return group;
  }
  const auto write_adam = [&](const auto& o) {
    group.set("lr", o.lr());
    group.set("betas", float_list({std::get<0>(o.betas()), std::get<1>(o.betas())}));
    group.set("eps", o.eps());
    group.set("weight_decay", o.weight_decay());
    group.set("amsgrad", o.amsgrad());
    group.set("maximize", false);
    group.set("foreach", PickleValue());
    group.set("capturable", false);
    group.set("differentiable", false);
  };
  if (kind == OptimizerKind::kAdam) {
    write_adam(static_cast<const AdamOptions&>(options));
    group.set("fused", false);
  } else {
    write_adam(static_cast<const AdamWOptions&>(options));
  }
  return group;
}

// Python keeps Adam's step as a float32 tensor; float32 holds every integer up to 2^24 exactly, float64 beyond.
at::Tensor step_tensor(int64_t step) {
  if (step <= (int64_t{1} << 24)) {
    return at::scalar_tensor(static_cast<double>(step), at::TensorOptions().dtype(at::kFloat));
  }
  return at::scalar_tensor(static_cast<double>(step), at::TensorOptions().dtype(at::kDouble));
}

PickleValue param_state(OptimizerKind kind, const torch::optim::OptimizerParamState& state) {
  PickleValue entry = PickleValue::dict();
  if (kind == OptimizerKind::kSgd) {
    entry.set("momentum_buffer", static_cast<const SGDParamState&>(state).momentum_buffer());
    return entry;
  }
  const auto write_adam = [&](const auto& s) {
    entry.set("step", step_tensor(s.step()));
    entry.set("exp_avg", s.exp_avg());
    entry.set("exp_avg_sq", s.exp_avg_sq());
    if (s.max_exp_avg_sq().defined()) {
      entry.set("max_exp_avg_sq", s.max_exp_avg_sq());
    }
  };
  if (kind == OptimizerKind::kAdam) {
    write_adam(static_cast<const AdamParamState&>(state));
  } else {
    write_adam(static_cast<const AdamWParamState&>(state));
  }
  return entry;
}

at::Tensor state_tensor(const Fields& fields, const char* key, const at::Tensor& param, bool optional) {
  at::Tensor value = fields.tensor(key, optional);
  if (!value.defined()) {
    return value;
  }
  DKIT_CHECK(value.sizes() == param.sizes(), fields.where(), ": '", key, "' has shape ", value.sizes(),
             " but its parameter has shape ", param.sizes());
  DKIT_CHECK(value.is_floating_point(), fields.where(), ": '", key, "' has dtype ", dtype_name(value.scalar_type()),
             ", expected a floating-point tensor");
  return value.to(param.device(), param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
}

int64_t adam_step(const Fields& fields) {
  const PickleValue& value = fields.get("step");
  double step = 0;
  if (value.is_tensor()) {
    DKIT_CHECK(value.to_tensor().numel() == 1, fields.where(), ": 'step' is a tensor of ", value.to_tensor().numel(),
               " values, expected one");
    step = value.to_tensor().to(at::kCPU, at::kDouble).item<double>();
  } else {
    step = fields.number("step");
  }
  DKIT_CHECK(step >= 0 && std::floor(step) == step && step < 9.2e18, fields.where(), ": 'step' is ", step,
             ", expected a whole number");
  return static_cast<int64_t>(step);
}

std::unique_ptr<torch::optim::OptimizerParamState> read_param_state(OptimizerKind kind, const Fields& fields,
                                                                    const at::Tensor& param) {
  if (kind == OptimizerKind::kSgd) {
    at::Tensor buffer = state_tensor(fields, "momentum_buffer", param, /*optional=*/true);
    if (!buffer.defined()) {
      return nullptr;
    }
    auto state = std::make_unique<SGDParamState>();
    state->momentum_buffer(buffer);
    return state;
  }
  const auto read_adam = [&](auto state) {
    state->step(adam_step(fields));
    state->exp_avg(state_tensor(fields, "exp_avg", param, false));
    state->exp_avg_sq(state_tensor(fields, "exp_avg_sq", param, false));
    state->max_exp_avg_sq(state_tensor(fields, "max_exp_avg_sq", param, true));
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(state));
  };
  if (kind == OptimizerKind::kAdam) {
    return read_adam(std::make_unique<AdamParamState>());
  }
  return read_adam(std::make_unique<AdamWParamState>());
}

std::unique_ptr<torch::optim::OptimizerOptions> read_group_options(OptimizerKind kind, const Fields& fields,
                                                                   const torch::optim::OptimizerOptions& current) {
  DKIT_CHECK(!fields.flag("maximize", false), fields.where(), ": maximize=True, which LibTorch's ",
             name_of(kOptimizerClassNames, kind), " does not support");
  if (kind == OptimizerKind::kSgd) {
    DKIT_CHECK(fields.find("momentum") != nullptr, fields.where(),
               " has no 'momentum': the optimizer state is not for SGD");
    auto options = std::make_unique<SGDOptions>(static_cast<const SGDOptions&>(current));
    options->lr(fields.number("lr"))
        .momentum(fields.number("momentum"))
        .dampening(fields.number("dampening"))
        .weight_decay(fields.number("weight_decay"))
        .nesterov(fields.flag("nesterov", false));
    return options;
  }
  DKIT_CHECK(fields.find("betas") != nullptr, fields.where(), " has no 'betas': the optimizer state is not for ",
             name_of(kOptimizerClassNames, kind));
  const PickleValue& betas = fields.get("betas");
  DKIT_CHECK((betas.is_tuple() || betas.is_list()) && betas.items().size() == 2 &&
                 (betas.items()[0].is_double() || betas.items()[0].is_int()) &&
                 (betas.items()[1].is_double() || betas.items()[1].is_int()),
             fields.where(), ": 'betas' is not a pair of numbers");
  const auto read_adam = [&](auto options) {
    options->lr(fields.number("lr"))
        .betas(std::make_tuple(betas.items()[0].to_double(), betas.items()[1].to_double()))
        .eps(fields.number("eps"))
        .weight_decay(fields.number("weight_decay"))
        .amsgrad(fields.flag("amsgrad", false));
    return std::unique_ptr<torch::optim::OptimizerOptions>(std::move(options));
  };
  if (kind == OptimizerKind::kAdam) {
    return read_adam(std::make_unique<AdamOptions>(static_cast<const AdamOptions&>(current)));
  }
  return read_adam(std::make_unique<AdamWOptions>(static_cast<const AdamWOptions&>(current)));
}

void check_activation(const std::string& name, const std::string& where) {
  DKIT_CHECK(try_parse(kActivationNames, name).has_value(), where, ": unknown activation '", name,
             "': expected ", list_names(kActivationNames));
}

int64_t step_of(const fs::path& file) {
  const std::string name = file.filename().string();
  if (name.size() < 9 || name.compare(0, 5, "step-") != 0 || name.compare(name.size() - 3, 3, ".pt") != 0) {
    return -1;
  }
  const std::string digits = name.substr(5, name.size() - 8);
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
    return -1;
  }
  return std::stoll(digits);
}

// A layer's weight must hold its values itself: an expanded view (stride 0) of a few stored values could claim
// any shape, and building a model of that shape would allocate memory the file never held.
void check_stored(const at::Tensor& tensor, const std::string& name, const std::string& source) {
  const auto stored = static_cast<int64_t>(tensor.storage().nbytes() / tensor.element_size());
  DKIT_CHECK(tensor.numel() <= stored, source, ": '", name, "' has shape ", tensor.sizes(), " but its storage holds ",
             stored, " values: an expanded view cannot be a layer's weight");
}

// The network 'model' describes must be the one whose weights 'model_state_dict' holds, checked before anything
// builds it, so that a hostile 'model' entry cannot make dkit allocate more than the file's own tensors.
void check_model_entry(const TrainingCheckpoint& checkpoint, const std::string& source) {
  std::vector<int64_t> widths = {checkpoint.model.in_features()};
  widths.insert(widths.end(), checkpoint.model.hidden().begin(), checkpoint.model.hidden().end());
  widths.push_back(checkpoint.model.out_features());
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const std::string name = std::to_string(2 * i) + ".weight";
    const at::Tensor* weight = checkpoint.model_state_dict.find(name);
    const std::vector<int64_t> expected = {widths[i + 1], widths[i]};
    DKIT_CHECK(weight != nullptr, source, ": 'model' describes a layer ", name, " of shape ",
               c10::IntArrayRef(expected), " but 'model_state_dict' has no '", name, "'");
    DKIT_CHECK(weight->sizes() == c10::IntArrayRef(expected), source, ": 'model' describes ", name, " as ",
               c10::IntArrayRef(expected), " but 'model_state_dict' holds ", weight->sizes());
    check_stored(*weight, name, source);
  }
}

void sync_folder(const std::string& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DKIT_CHECK(fd >= 0 && ::fsync(fd) == 0, "cannot sync folder ", folder, ": ", std::strerror(errno));
  ::close(fd);
}

// LibTorch checks the `left` and `next` counters of a CPU generator state (torch.get_rng_state()'s layout: uint64
// seed, int32 left, int32 seeded, uint64 next, then the Mersenne Twister's 624 words) each on its own; a state with
// both near 624 makes it read past the end of its array. Drawing reads words next .. next + left - 2.
void check_cpu_generator_state(const at::Tensor& saved) {
  const at::Tensor bytes = saved.to(at::kCPU).contiguous();
  if (bytes.scalar_type() != at::kByte || bytes.numel() < 24) {
    return;  // the size check in restore_rng_state() explains it
  }
  const auto* data = bytes.data_ptr<uint8_t>();
  int32_t left = 0;
  uint64_t next = 0;
  std::memcpy(&left, data + 8, sizeof(left));
  std::memcpy(&next, data + 16, sizeof(next));
  DKIT_CHECK(left >= 1 && left <= 624 && next <= 624 && next + static_cast<uint64_t>(left) <= 625,
             "cannot restore the CPU random generator: its saved state is inconsistent (left ", left, ", next ",
             next, ")");
}

} // namespace

RngState capture_rng_state() {
  RngState state;
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    state.cpu = generator.get_state();
  }
  const auto gpus = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < gpus; ++i) {
    auto generator = at::globalContext().defaultGenerator(gpu(i));
    std::lock_guard<std::mutex> lock(generator.mutex());
    state.cuda.push_back(generator.get_state());
  }
  return state;
}

void restore_rng_state(const RngState& state) {
  const auto restore = [](at::Generator generator, const at::Tensor& saved, const std::string& name) {
    std::lock_guard<std::mutex> lock(generator.mutex());
    const at::Tensor current = generator.get_state();
    DKIT_CHECK(saved.scalar_type() == at::kByte && saved.numel() == current.numel(), "cannot restore the ", name,
               " random generator: its saved state is ", saved.numel(), " ", dtype_name(saved.scalar_type()),
               " values, expected ", current.numel(), " uint8");
    generator.set_state(saved.to(at::kCPU).contiguous());
  };
  if (state.cpu.defined()) {
    check_cpu_generator_state(state.cpu);
    restore(at::detail::getDefaultCPUGenerator(), state.cpu, "CPU");
  }
  const auto gpus = std::min(state.cuda.size(), static_cast<size_t>(torch::cuda::device_count()));
  for (size_t i = 0; i < gpus; ++i) {
    const Device device = gpu(static_cast<int64_t>(i));
    restore(at::globalContext().defaultGenerator(device), state.cuda[i], device.str());
  }
}

PickleValue optimizer_state_dict(const torch::optim::Optimizer& optimizer) {
  const OptimizerKind kind = optimizer_kind(optimizer);
  const auto& states = optimizer.state();
  PickleValue state = PickleValue::dict();
  PickleValue groups = PickleValue::list();
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    PickleValue entry = group_options(kind, group.options());
    PickleValue params = PickleValue::list();
    for (const auto& param : group.params()) {
      const auto found = states.find(state_key(states, param));
      if (found != states.end()) {
        state.set(index, param_state(kind, *found->second));
      }
      params.push_back(index++);
    }
    entry.set("params", std::move(params));
    groups.push_back(std::move(entry));
  }
  return PickleValue::dict({{"state", std::move(state)}, {"param_groups", std::move(groups)}});
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const PickleValue& state,
                               const std::string& source) {
  const OptimizerKind kind = optimizer_kind(optimizer);
  const Fields root(state, source);
  const PickleValue& saved_groups = root.get("param_groups");
  const PickleValue& saved_state = root.get("state");
  DKIT_CHECK(saved_groups.is_list(), source, ": 'param_groups' is a ", saved_groups.type_name(), ", expected a list");
  DKIT_CHECK(saved_state.is_dict(), source, ": 'state' is a ", saved_state.type_name(), ", expected a dict");
  auto& groups = optimizer.param_groups();
  DKIT_CHECK(saved_groups.items().size() == groups.size(), source, ": the saved optimizer state has ",
             saved_groups.items().size(), " parameter groups, the optimizer has ", groups.size());

  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  std::map<int64_t, at::Tensor> params_by_id;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Fields group(saved_groups.items()[g], detail::concat(source, ": parameter group ", g));
    const PickleValue& ids = group.get("params");
    DKIT_CHECK(ids.is_list() && ids.items().size() == groups[g].params().size(), group.where(), " has ",
               ids.is_list() ? ids.items().size() : 0, " parameters in the saved state, ", groups[g].params().size(),
               " in the optimizer");
    for (size_t p = 0; p < ids.items().size(); ++p) {
      DKIT_CHECK(ids.items()[p].is_int(), group.where(), ": parameter ids must be ints");
      DKIT_CHECK(params_by_id.emplace(ids.items()[p].to_int(), groups[g].params()[p]).second, group.where(),
                 ": parameter id ", ids.items()[p].to_int(), " appears twice");
    }
    options.push_back(read_group_options(kind, group, groups[g].options()));
  }
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> param_states;
  for (const auto& [key, value] : saved_state.entries()) {
    DKIT_CHECK(key.is_int(), source, ": 'state' keys must be parameter ids (ints), got a ", key.type_name());
    const auto param = params_by_id.find(key.to_int());
    DKIT_CHECK(param != params_by_id.end(), source, ": 'state' has an entry for parameter ", key.to_int(),
               ", which no parameter group lists");
    const Fields fields(value, detail::concat(source, ": state of parameter ", key.to_int()));
    auto param_state = read_param_state(kind, fields, param->second);
    if (param_state != nullptr) {
      param_states.emplace_back(param->second, std::move(param_state));
    }
  }

  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].set_options(std::move(options[g]));
  }
  auto& states = optimizer.state();
  states.clear();
  for (auto& [param, param_state] : param_states) {
    states[state_key(states, param)] = std::move(param_state);
  }
}

void save_training_checkpoint(const std::string& path, const TrainingCheckpoint& checkpoint) {
  DKIT_CHECK(checkpoint.input_mean.defined() == checkpoint.input_std.defined(),
             "cannot save ", path, ": input_mean and input_std must be set together");
  PickleValue state_dict = PickleValue::ordered_dict();
  for (const auto& item : checkpoint.model_state_dict) {
    state_dict.set(item.key(), item.value());
  }
  PickleValue hidden = PickleValue::list();
  for (const int64_t width : checkpoint.model.hidden()) {
    hidden.push_back(width);
  }
  PickleValue model = PickleValue::dict({{"in_features", checkpoint.model.in_features()},
                                         {"hidden", std::move(hidden)},
                                         {"out_features", checkpoint.model.out_features()},
                                         {"activation", to_string(checkpoint.model.activation())},
                                         {"dropout", checkpoint.model.dropout()}});
  PickleValue cuda = PickleValue::list();
  for (const auto& generator : checkpoint.rng.cuda) {
    cuda.push_back(generator);
  }
  PickleValue root = PickleValue::dict();
  root.set("dkit_checkpoint", kTrainingCheckpointVersion);
  root.set("model_state_dict", std::move(state_dict));
  root.set("model", std::move(model));
  if (checkpoint.input_mean.defined()) {
    root.set("input_mean", checkpoint.input_mean);
    root.set("input_std", checkpoint.input_std);
  }
  root.set("optimizer_state_dict", checkpoint.optimizer_state_dict);
  root.set("step", checkpoint.step);
  root.set("epoch", checkpoint.epoch);
  root.set("epoch_step", checkpoint.epoch_step);
  root.set("rng", PickleValue::dict({{"cpu", checkpoint.rng.cpu.defined() ? PickleValue(checkpoint.rng.cpu)
                                                                          : PickleValue()},
                                     {"cuda", std::move(cuda)}}));
  root.set("config", checkpoint.config);
  root.set("data_checksum", checkpoint.data_checksum);
  root.set("world_size", checkpoint.world_size);
  write_torch_file(path, root);
}

bool is_training_checkpoint(const PickleValue& root) {
  return root.find("dkit_checkpoint") != nullptr;
}

TrainingCheckpoint training_checkpoint_from(const PickleValue& root, const std::string& source) {
  DKIT_CHECK(is_training_checkpoint(root), source,
             ": not a dkit training checkpoint (it has no 'dkit_checkpoint' entry)");
  const Fields fields(root, source);
  const int64_t version = fields.integer("dkit_checkpoint");
  DKIT_CHECK(version == kTrainingCheckpointVersion, source, ": checkpoint format ", version,
             ", this dkit reads format ", kTrainingCheckpointVersion, " (written by another dkit version?)");
  TrainingCheckpoint checkpoint;
  const PickleValue& state_dict = fields.get("model_state_dict");
  DKIT_CHECK(is_state_dict(state_dict), source, ": 'model_state_dict' is not a dict of tensors");
  for (const auto& [key, value] : state_dict.entries()) {
    checkpoint.model_state_dict.insert(key.to_string(), value.to_tensor());
  }
  const Fields model(fields.get("model"), source + ": 'model'");
  std::vector<int64_t> hidden;
  const PickleValue& widths = model.get("hidden");
  DKIT_CHECK(widths.is_list() || widths.is_tuple(), model.where(), ": 'hidden' is not a list");
  for (const auto& width : widths.items()) {
    DKIT_CHECK(width.is_int(), model.where(), ": 'hidden' holds a ", width.type_name(), ", expected ints");
    hidden.push_back(width.to_int());
  }
  check_activation(model.text("activation"), model.where());
  checkpoint.model = MlpOptions(model.integer("in_features"), std::move(hidden), model.integer("out_features"))
                         .activation(parse_activation(model.text("activation")))
                         .dropout(model.number("dropout"))
                         .bias(checkpoint.model_state_dict.contains("0.bias"));
  check_model_entry(checkpoint, source);
  checkpoint.input_mean = fields.tensor("input_mean", /*optional=*/true);
  checkpoint.input_std = fields.tensor("input_std", /*optional=*/true);
  DKIT_CHECK(checkpoint.input_mean.defined() == checkpoint.input_std.defined(), source,
             ": has only one of 'input_mean' and 'input_std'");
  checkpoint.optimizer_state_dict = fields.get("optimizer_state_dict");
  checkpoint.step = fields.integer("step");
  checkpoint.epoch = fields.integer("epoch");
  checkpoint.epoch_step = fields.integer("epoch_step");
  const Fields rng(fields.get("rng"), source + ": 'rng'");
  const at::Tensor cpu = rng.tensor("cpu", /*optional=*/true);
  checkpoint.rng.cpu = cpu.defined() ? cpu.to(at::kCPU) : cpu;
  const PickleValue& cuda = rng.get("cuda");
  DKIT_CHECK(cuda.is_list(), rng.where(), ": 'cuda' is a ", cuda.type_name(), ", expected a list");
  for (const auto& state : cuda.items()) {
    DKIT_CHECK(state.is_tensor(), rng.where(), ": 'cuda' holds a ", state.type_name(), ", expected tensors");
    checkpoint.rng.cuda.push_back(state.to_tensor().to(at::kCPU));
  }
  checkpoint.config = fields.text("config");
  checkpoint.data_checksum = fields.text("data_checksum");
  if (fields.find("world_size") != nullptr) {
    checkpoint.world_size = fields.integer("world_size");
    DKIT_CHECK(checkpoint.world_size >= 1, source, ": 'world_size' is ", checkpoint.world_size,
               ", expected at least 1");
  }
  return checkpoint;
}

TrainingCheckpoint load_training_checkpoint(const std::string& path, const c10::Device& map_location) {
  return training_checkpoint_from(read_torch_file(path, ReadOptions().map_location(map_location)).root, path);
}

bool try_load_training_checkpoint(const std::string& path, const c10::Device& map_location, TrainingCheckpoint& out,
                                  std::string& error) {
  try {
    out = load_training_checkpoint(path, map_location);
    return true;
  } catch (const Error& e) {
    error = e.what();
  } catch (const c10::Error& e) {
    error = path + ": " + e.what_without_backtrace();
  }
  return false;
}

CheckpointFolder::CheckpointFolder(const std::string& run_dir, CheckpointFolderOptions options)
    : path_((fs::path(run_dir) / "checkpoints").string()), options_(options) {
  DKIT_CHECK(options_.keep() >= 0, "CheckpointFolder keep must be 0 (keep all) or more, got ", options_.keep());
}

std::string CheckpointFolder::save(const TrainingCheckpoint& checkpoint) {
  std::error_code error;
  fs::create_directories(path_, error);
  DKIT_CHECK(!error, "cannot create the checkpoint folder ", path_, ": ", error.message());
  for (fs::directory_iterator it(path_, error), end; !error && it != end; it.increment(error)) {
    if (it->path().filename().string().find(".pt.tmp") != std::string::npos) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
  char name[40];
  std::snprintf(name, sizeof(name), "step-%06lld.pt", static_cast<long long>(checkpoint.step));
  const std::string step_path = (fs::path(path_) / name).string();
  const std::string last_path = (fs::path(path_) / "last.pt").string();
  save_training_checkpoint(last_path, checkpoint);
  const std::string link_path = step_path + ".tmp.link";
  ::unlink(link_path.c_str());
  if (::link(last_path.c_str(), link_path.c_str()) == 0) {
    DKIT_CHECK(::rename(link_path.c_str(), step_path.c_str()) == 0, "cannot write ", step_path, ": ",
               std::strerror(errno));
    sync_folder(path_);
  } else {
    save_training_checkpoint(step_path, checkpoint);
  }
  if (options_.keep() > 0) {
    const auto files = step_files();
    for (size_t i = static_cast<size_t>(options_.keep()); i < files.size(); ++i) {
      fs::remove(files[i], error);
    }
  }
  return step_path;
}

std::vector<std::string> CheckpointFolder::step_files() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (fs::directory_iterator it(path_, error), end; !error && it != end; it.increment(error)) {
    const int64_t step = step_of(it->path());
    if (step >= 0 && it->is_regular_file()) {
      found.emplace_back(step, it->path().string());
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> files;
  for (auto& item : found) {
    files.push_back(std::move(item.second));
  }
  return files;
}

std::optional<FoundCheckpoint> CheckpointFolder::load_newest(const c10::Device& map_location) const {
  const std::string last_path = (fs::path(path_) / "last.pt").string();
  const auto files = step_files();
  const bool have_last = fs::exists(last_path);
  if (!have_last && files.empty()) {
    return std::nullopt;
  }
  FoundCheckpoint found;
  std::string error;
  TrainingCheckpoint last;
  const bool last_ok = have_last && try_load_training_checkpoint(last_path, map_location, last, error);
  if (have_last && !last_ok) {
    found.skipped.push_back(error);
  }
  for (const auto& file : files) {
    if (last_ok && step_of(file) <= last.step) {
      break;
    }
    if (try_load_training_checkpoint(file, map_location, found.checkpoint, error)) {
      found.path = file;
      return found;
    }
    found.skipped.push_back(error);
  }
  if (last_ok) {
    found.checkpoint = std::move(last);
    found.path = last_path;
    return found;
  }
  std::string reasons;
  for (const auto& reason : found.skipped) {
    reasons += (reasons.empty() ? "" : "; ") + reason;
  }
  throw Error(detail::concat("no readable checkpoint in ", path_, ": ", reasons));
}

at::Tensor LoadedMlp::predict(const at::Tensor& inputs) const {
  const auto& weight = net->layers().front()->weight;
  at::Tensor x = inputs.to(weight.device(), weight.scalar_type());
  if (input_mean.defined()) {
    x = (x - input_mean) / input_std;
  }
  torch::NoGradGuard no_grad;
  return net.ptr()->forward(x);
}

LoadedMlp load_mlp(const std::string& path, const LoadMlpOptions& options) {
  return mlp_from(read_torch_file(path, ReadOptions().limits(options.limits())).root, path, options);
}

LoadedMlp mlp_from(const PickleValue& root, const std::string& source, const LoadMlpOptions& options) {
  LoadedMlp loaded;
  if (is_training_checkpoint(root)) {
    TrainingCheckpoint checkpoint = training_checkpoint_from(root, source);
    loaded.net = Mlp(checkpoint.model);
    load_state_dict(*loaded.net, checkpoint.model_state_dict, LoadStateDictOptions().source(source));
    loaded.input_mean = checkpoint.input_mean;
    loaded.input_std = checkpoint.input_std;
  } else {
    StateDict state_dict = state_dict_from(root, source, options.state_dict());
    const at::Tensor* mean = state_dict.find("input_mean");
    const at::Tensor* std = state_dict.find("input_std");
    DKIT_CHECK((mean == nullptr) == (std == nullptr), source, ": has only one of 'input_mean' and 'input_std'");
    if (mean != nullptr) {
      loaded.input_mean = *mean;
      loaded.input_std = *std;
      state_dict.erase("input_mean");
      state_dict.erase("input_std");
    }
    loaded.net =
        mlp_from_state_dict(state_dict, MlpFromStateDictOptions().activation(options.activation()).source(source));
  }
  const int64_t in_features = loaded.net->options.in_features();
  if (loaded.input_mean.defined()) {
    DKIT_CHECK(loaded.input_mean.sizes() == at::IntArrayRef{in_features} &&
                   loaded.input_std.sizes() == at::IntArrayRef{in_features},
               source, ": input_mean and input_std have shapes ", loaded.input_mean.sizes(), " and ",
               loaded.input_std.sizes(), ", expected [", in_features, "] for the model's ", in_features, " inputs");
    loaded.input_mean = loaded.input_mean.to(options.device(), at::kFloat);
    loaded.input_std = loaded.input_std.to(options.device(), at::kFloat);
  }
  place_module(loaded.net, options.device());
  loaded.net->eval();
  return loaded;
}

void export_mlp(const std::string& path, const LoadedMlp& model) {
  PickleValue root = PickleValue::dict();
  for (const auto& item : model.net->named_parameters()) {
    root.set(item.key(), item.value().detach());
  }
  if (model.input_mean.defined()) {
    root.set("input_mean", model.input_mean);
    root.set("input_std", model.input_std);
  }
  write_torch_file(path, root);
}

} // namespace dkit
