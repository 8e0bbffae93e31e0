#pragma once

#include <dkit/core/enum_names.h>

#include <string>

namespace dkit {

/// The optimizers dkit trains with (`train.optimizer`) and whose state its checkpoints save and restore.
enum class OptimizerKind {
  /// `torch::optim::SGD` with `train.momentum` and `train.weight_decay`.
  kSgd,
  /// `torch::optim::Adam` with `train.weight_decay` as L2 penalty.
  kAdam,
  /// `torch::optim::AdamW` with decoupled `train.weight_decay`.
  kAdamW,
  /// `torch::optim::RMSprop` with `train.momentum` and `train.weight_decay`.
  kRmsprop,
  /// `torch::optim::Adagrad` with `train.weight_decay`.
  kAdagrad,
};

/// The name of each OptimizerKind, as `train.optimizer` spells it.
inline constexpr EnumNames<OptimizerKind, 5> kOptimizerNames = {{
    {OptimizerKind::kSgd, "sgd"},
    {OptimizerKind::kAdam, "adam"},
    {OptimizerKind::kAdamW, "adamw"},
    {OptimizerKind::kRmsprop, "rmsprop"},
    {OptimizerKind::kAdagrad, "adagrad"},
}};

/// The LibTorch class of each OptimizerKind (`torch::optim::SGD`, ...), as checkpoint errors name it.
inline constexpr EnumNames<OptimizerKind, 5> kOptimizerClassNames = {{
    {OptimizerKind::kSgd, "SGD"},
    {OptimizerKind::kAdam, "Adam"},
    {OptimizerKind::kAdamW, "AdamW"},
    {OptimizerKind::kRmsprop, "RMSprop"},
    {OptimizerKind::kAdagrad, "Adagrad"},
}};

/// The name kOptimizerNames gives `kind`.
inline std::string to_string(OptimizerKind kind) {
  return std::string(name_of(kOptimizerNames, kind));
}

} // namespace dkit
