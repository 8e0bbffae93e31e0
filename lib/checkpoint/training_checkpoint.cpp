#include <dkit/checkpoint/training_checkpoint.h>

#include <dkit/checkpoint/detail/training_checkpoint_fields.h>
#include <dkit/core/error.h>

#include <torch/torch.h>

namespace dkit {
namespace {

using detail::Fields;

} // namespace

void save_training_checkpoint(const std::string& path, const TrainingCheckpoint& checkpoint) {
  DKIT_CHECK(checkpoint.input_mean.defined() == checkpoint.input_std.defined(),
             "cannot save ", path, ": input_mean and input_std must be set together");
  PickleValue state_dict = PickleValue::ordered_dict();
  for (const auto& item : checkpoint.model_state_dict) {
    state_dict.set(item.key(), item.value());
  }
  PickleValue cuda = PickleValue::list();
  for (const auto& generator : checkpoint.rng.cuda) {
    cuda.push_back(generator);
  }
  PickleValue root = PickleValue::dict();
  root.set("dkit_checkpoint", kTrainingCheckpointVersion);
  root.set("model_state_dict", std::move(state_dict));
  if (!checkpoint.model.is_none()) {
    root.set("model", checkpoint.model);
  }
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
  if (!checkpoint.scaler_state_dict.is_none()) {
    root.set("scaler", checkpoint.scaler_state_dict);
  }
  if (!checkpoint.scheduler_state_dict.is_none()) {
    root.set("scheduler_state_dict", checkpoint.scheduler_state_dict);
  }
  if (!checkpoint.task_state.is_none()) {
    root.set("task_state", checkpoint.task_state);
  }
  if (!checkpoint.trainer_state.is_none()) {
    root.set("trainer_state", checkpoint.trainer_state);
  }
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
  if (const PickleValue* model = fields.find("model")) {
    checkpoint.model = *model;
  }
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
  if (const PickleValue* scaler = fields.find("scaler")) {
    DKIT_CHECK(scaler->is_dict(), source, ": 'scaler' is a ", scaler->type_name(), ", expected a dict");
    checkpoint.scaler_state_dict = *scaler;
  }
  if (const PickleValue* scheduler = fields.find("scheduler_state_dict")) {
    checkpoint.scheduler_state_dict = *scheduler;
  }
  if (const PickleValue* task = fields.find("task_state")) {
    checkpoint.task_state = *task;
  }
  if (const PickleValue* trainer = fields.find("trainer_state")) {
    checkpoint.trainer_state = *trainer;
  }
  return checkpoint;
}

TrainingCheckpoint load_training_checkpoint(const std::string& path, const ReadOptions& options) {
  return training_checkpoint_from(read_torch_file(path, options).root, path);
}

TrainingCheckpoint load_training_checkpoint(const std::string& path, const c10::Device& map_location) {
  return load_training_checkpoint(path, ReadOptions().map_location(map_location));
}

bool try_load_training_checkpoint(const std::string& path, const c10::Device& map_location, TrainingCheckpoint& out,
                                  std::string& error) {
  return try_load_training_checkpoint(path, ReadOptions().map_location(map_location), out, error);
}

bool try_load_training_checkpoint(const std::string& path, const ReadOptions& options, TrainingCheckpoint& out,
                                  std::string& error) {
  try {
    out = load_training_checkpoint(path, options);
    return true;
  } catch (const Error& e) {
    error = e.what();
  } catch (const c10::Error& e) {
    error = path + ": " + e.what_without_backtrace();
  }
  return false;
}

} // namespace dkit
