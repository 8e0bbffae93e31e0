#pragma once

#include <dkit/checkpoint/pickle.h>
#include <dkit/checkpoint/state_dict.h>
#include <dkit/checkpoint/torch_file.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torch::optim {
class LRScheduler;
class Optimizer;
} // namespace torch::optim

namespace dkit {

/// The version of the training checkpoint format this dkit writes (the file's `dkit_checkpoint` entry).
constexpr int64_t kTrainingCheckpointVersion = 1;

/// The states of the random generators: what `torch.get_rng_state()` and `torch.cuda.get_rng_state_all()` return.
struct RngState {
  /// The default CPU generator's state, a uint8 tensor.
  at::Tensor cpu;
  /// Each GPU's default generator state, in device order; empty on a build or machine without CUDA.
  std::vector<at::Tensor> cuda;
};

/// The current state of the default CPU generator and of every visible GPU's default generator.
RngState capture_rng_state();

/// Puts the generators back in `state`. CUDA states are restored for the GPUs that exist both in `state` and
/// here, so a checkpoint saved with GPUs resumes on the CPU and the reverse.
void restore_rng_state(const RngState& state);

/// The optimizer's state in the layout of Python's `optimizer.state_dict()`: `{'state': {index: {...}},
/// 'param_groups': [{'lr': ..., ..., 'params': [indices]}]}`, parameters numbered across the groups in order.
/// Supports `torch::optim::SGD`, `Adam`, `AdamW`, `RMSprop` and `Adagrad` (dkit's fused optimizers are these); the
/// entries are those PyTorch writes for the same optimizer (SGD: `momentum_buffer`; Adam, AdamW: `step` as a float32
/// tensor, `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq` with amsgrad; RMSprop: `step` as an int, `square_avg`,
/// `momentum_buffer` with momentum, `grad_avg` when centered; Adagrad: `step` as a float32 tensor, `sum`). The tensors are the optimizer's own, not copies.
PickleValue optimizer_state_dict(const torch::optim::Optimizer& optimizer);

/// Restores state written by optimizer_state_dict() or by Python's `optimizer.state_dict()` into `optimizer`:
/// the options of each parameter group (lr, momentum, betas, ...) and each parameter's state, moved to the
/// parameter's device and dtype. The optimizer must be of the kind that saved it (an error names both) and have been
/// built over the same parameters in the same order; group and parameter counts and state shapes are checked.
/// Restoring bitwise what was saved, continuing training gives bitwise the same result as not stopping. `source`
/// names the file in errors.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const PickleValue& state,
                               const std::string& source = "optimizer state");

/// The position of a LibTorch learning-rate scheduler (`torch::optim::StepLR`, any `torch::optim::LRScheduler`):
/// `{'step_count': n}`, the number of its step() calls, which is all a LibTorch scheduler keeps besides the
/// optimizer's learning rates (saved with the optimizer's state).
PickleValue scheduler_state_dict(const torch::optim::LRScheduler& scheduler);

/// Puts `scheduler` back where scheduler_state_dict() found it; `source` names the file in errors.
void load_scheduler_state_dict(torch::optim::LRScheduler& scheduler, const PickleValue& state,
                               const std::string& source = "scheduler state");

/// Everything needed to continue training exactly where it stopped. Saved as a torch.save-compatible file
/// whose root dict holds `dkit_checkpoint` (the format version), `model_state_dict` (an OrderedDict of the
/// module's parameters and buffers, named as LibTorch registers them), `model` (when set), `input_mean`/`input_std`
/// (when set), `optimizer_state_dict`, `step`, `epoch`, `epoch_step`, `rng` (the generator states: a tensor for
/// the CPU, a list of tensors for the GPUs), `config`, `data_checksum`, `world_size` (absent from files written
/// before it, read as 1) and, when set, `scaler`, `scheduler_state_dict`, `task_state` and `trainer_state`.
struct TrainingCheckpoint {
  /// The model's parameters and buffers (see module_state_dict()).
  StateDict model_state_dict{"state dict key"};
  /// What a reader needs to rebuild the module besides its weights, saved as `model` when it is not None: dkit's
  /// MLP writes its shape here (see mlp_description()); None for other modules.
  PickleValue model;
  /// Per-feature mean subtracted from the inputs; undefined when training did not normalise inputs.
  at::Tensor input_mean;
  /// Per-feature standard deviation the inputs are divided by; undefined when input_mean is.
  at::Tensor input_std;
  /// The optimizer's state (see optimizer_state_dict()).
  PickleValue optimizer_state_dict;
  /// Optimizer steps taken since the start of training.
  int64_t step = 0;
  /// The epoch in progress (0-based).
  int64_t epoch = 0;
  /// Batches already done in `epoch`: where the data order resumes.
  int64_t epoch_step = 0;
  /// The random generators' states.
  RngState rng;
  /// The resolved configuration (YAML) the run was started with.
  std::string config;
  /// Checksum of the training data, to notice a resume on different data.
  std::string data_checksum;
  /// The number of processes that trained (`WORLD_SIZE`; 1 for a single process, and for files written before
  /// this entry existed). With `train.batch_size` from `config` it gives the global batch that `epoch_step`
  /// counts in, so that a run can resume with another number of processes.
  int64_t world_size = 1;
  /// The loss scaler's state in the layout of Python's `GradScaler.state_dict()`, saved as `scaler` (the name
  /// PyTorch's AMP examples save it under) when it is not None: an fp16 run's; None for the other precisions.
  PickleValue scaler_state_dict;
  /// The learning-rate scheduler's state, saved as `scheduler_state_dict` when it is not None.
  PickleValue scheduler_state_dict;
  /// The training task's own state (Task::state_dict()), saved as `task_state` when it is not None.
  PickleValue task_state;
  /// The trainer's own state (the best checkpoints kept, early stopping's count), saved as `trainer_state` when it
  /// is not None.
  PickleValue trainer_state;
};

/// Writes `checkpoint` to `path` atomically (see write_torch_file()). Python's `torch.load(path)` reads it.
void save_training_checkpoint(const std::string& path, const TrainingCheckpoint& checkpoint);

/// Whether a file's root value is a dkit training checkpoint (has a `dkit_checkpoint` entry).
bool is_training_checkpoint(const PickleValue& root);

/// The training checkpoint in a file's root value; `source` names the file in errors. Its RNG states are on the
/// CPU whatever the tensors' device.
TrainingCheckpoint training_checkpoint_from(const PickleValue& root, const std::string& source);

/// Reads a checkpoint written by save_training_checkpoint(), tensors on `options.map_location()`, within
/// `options.limits()`.
TrainingCheckpoint load_training_checkpoint(const std::string& path, const ReadOptions& options = {});

/// load_training_checkpoint() with the default limits, tensors on `map_location`.
TrainingCheckpoint load_training_checkpoint(const std::string& path, const c10::Device& map_location);

/// Like load_training_checkpoint(), but returns false with the error's message in `error` instead of throwing
/// when the file is missing or unreadable.
bool try_load_training_checkpoint(const std::string& path, const ReadOptions& options, TrainingCheckpoint& out,
                                  std::string& error);

/// try_load_training_checkpoint() with the default limits, tensors on `map_location`.
bool try_load_training_checkpoint(const std::string& path, const c10::Device& map_location, TrainingCheckpoint& out,
                                  std::string& error);

/// How a CheckpointFolder keeps its files.
struct CheckpointFolderOptions {
  /// How many step-numbered checkpoints to keep, newest first; older ones are deleted after each save. 0 keeps
  /// all of them.
  TORCH_ARG(int64_t, keep) = 3;
};

/// The checkpoint that CheckpointFolder::load_newest() found, and what it had to skip to find it.
struct FoundCheckpoint {
  /// The checkpoint.
  TrainingCheckpoint checkpoint;
  /// The file it was read from.
  std::string path;
  /// One line per newer file that could not be read, `PATH: reason`; empty when the newest file was good.
  std::vector<std::string> skipped;
};

/// A run's checkpoints: `RUN_DIR/checkpoints/step-000123.pt` for each save, the newest `keep` of them kept, and
/// `RUN_DIR/checkpoints/last.pt`, the latest save. Every file is written atomically, so a process killed at any
/// moment leaves each of them either whole or as it was.
class CheckpointFolder {
 public:
  /// The checkpoints of the run in `run_dir`; the folder is created by the first save().
  explicit CheckpointFolder(const std::string& run_dir, CheckpointFolderOptions options = {});

  /// `RUN_DIR/checkpoints`.
  const std::string& path() const {
    return path_;
  }

  /// Writes `checkpoint` as `last.pt`, then makes the step file for `checkpoint.step` the same file (a hard link,
  /// or a second write where links are not supported), then deletes step files beyond the retention count. So
  /// `last.pt` is always the newest complete checkpoint: a process killed during save() leaves the previous one
  /// in place, or the new one, never a step file newer than `last.pt`. Temporary files left by a process killed
  /// while saving are removed first. Returns the step file's path.
  std::string save(const TrainingCheckpoint& checkpoint);

  /// Makes `RUN_DIR/checkpoints/NAME` the same file as `path`, a file save() wrote, atomically (a hard link, or a
  /// copy where links are not supported); save() never deletes it. Returns its path.
  std::string keep_as(const std::string& path, const std::string& name) const;

  /// The step-numbered files present, newest (highest step) first.
  std::vector<std::string> step_files() const;

  /// The newest checkpoint that reads correctly: `last.pt`, or a step file with a higher step than it, or when
  /// those are corrupt the next older step file, and so on. The files skipped are listed in the result so that
  /// the caller can say it fell back. Every file is read with `options` (map_location and limits), so a file
  /// beyond the limits is skipped unread. std::nullopt when there is no checkpoint file at all (or no folder); a
  /// dkit::Error listing each file's reason when there are files and none of them reads.
  std::optional<FoundCheckpoint> load_newest(const ReadOptions& options = {}) const;

  /// load_newest() with the default limits, tensors on `map_location`.
  std::optional<FoundCheckpoint> load_newest(const c10::Device& map_location) const;

 private:
  std::string path_;
  CheckpointFolderOptions options_;
};

} // namespace dkit
