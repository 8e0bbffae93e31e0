#include <dkit/checkpoint/training_checkpoint.h>

#include <dkit/checkpoint/optimizer_kind.h>
#include <dkit/checkpoint/detail/training_checkpoint_fields.h>
#include <dkit/core/compat.h>
#include <dkit/core/error.h>

#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <limits>
#include <map>

namespace dkit {
namespace {

using detail::Fields;
using torch::optim::Adam;
using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::Adagrad;
using torch::optim::AdagradOptions;
using torch::optim::AdagradParamState;
using torch::optim::RMSprop;
using torch::optim::RMSpropOptions;
using torch::optim::RMSpropParamState;
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
  if (dynamic_cast<const RMSprop*>(&optimizer) != nullptr) {
    return OptimizerKind::kRmsprop;
  }
  if (dynamic_cast<const Adagrad*>(&optimizer) != nullptr) {
    return OptimizerKind::kAdagrad;
  }
  throw Error("optimizer state can be saved and restored for torch::optim::SGD, Adam, AdamW, RMSprop and Adagrad "
              "only");
}

// The optimizer a saved parameter group is of, from the options only it has; std::nullopt when none says.
std::optional<OptimizerKind> saved_kind(const PickleValue& group) {
  if (!group.is_dict()) {
    return std::nullopt;
  }
  if (group.find("betas") != nullptr) {
    return OptimizerKind::kAdam;
  }
  if (group.find("alpha") != nullptr) {
    return OptimizerKind::kRmsprop;
  }
  if (group.find("lr_decay") != nullptr) {
    return OptimizerKind::kAdagrad;
  }
  if (group.find("dampening") != nullptr) {
    return OptimizerKind::kSgd;
  }
  return std::nullopt;
}

// Adam and AdamW keep the same options and state.
OptimizerKind family(OptimizerKind kind) {
  return kind == OptimizerKind::kAdamW ? OptimizerKind::kAdam : kind;
}

template <typename Map>
typename Map::key_type state_key(const Map& /*map*/, const at::Tensor& param) {
  return compat::optimizer_state_key<typename Map::key_type>(param);
}

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
  if (kind == OptimizerKind::kRmsprop) {
    const auto& o = static_cast<const RMSpropOptions&>(options);
    group.set("lr", o.lr());
    group.set("momentum", o.momentum());
    group.set("alpha", o.alpha());
    group.set("eps", o.eps());
    group.set("centered", o.centered());
    group.set("weight_decay", o.weight_decay());
    group.set("foreach", PickleValue());
    group.set("maximize", false);
    group.set("differentiable", false);
    return group;
  }
  if (kind == OptimizerKind::kAdagrad) {
    const auto& o = static_cast<const AdagradOptions&>(options);
    group.set("lr", o.lr());
    group.set("lr_decay", o.lr_decay());
    group.set("weight_decay", o.weight_decay());
    group.set("initial_accumulator_value", o.initial_accumulator_value());
    group.set("eps", o.eps());
    group.set("foreach", PickleValue());
    group.set("maximize", false);
    return group;
  }
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
  if (kind == OptimizerKind::kRmsprop) {
    const auto& s = static_cast<const RMSpropParamState&>(state);
    entry.set("step", s.step());
    entry.set("square_avg", s.square_avg());
    if (s.momentum_buffer().defined()) {
      entry.set("momentum_buffer", s.momentum_buffer());
    }
    if (s.grad_avg().defined()) {
      entry.set("grad_avg", s.grad_avg());
    }
    return entry;
  }
  if (kind == OptimizerKind::kAdagrad) {
    const auto& s = static_cast<const AdagradParamState&>(state);
    entry.set("step", step_tensor(s.step()));
    entry.set("sum", s.sum());
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

int64_t saved_step(const Fields& fields) {
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
  if (kind == OptimizerKind::kRmsprop) {
    auto state = std::make_unique<RMSpropParamState>();
    state->step(saved_step(fields));
    state->square_avg(state_tensor(fields, "square_avg", param, false));
    state->momentum_buffer(state_tensor(fields, "momentum_buffer", param, true));
    state->grad_avg(state_tensor(fields, "grad_avg", param, true));
    return state;
  }
  if (kind == OptimizerKind::kAdagrad) {
    auto state = std::make_unique<AdagradParamState>();
    state->step(saved_step(fields));
    state->sum(state_tensor(fields, "sum", param, false));
    return state;
  }
  const auto read_adam = [&](auto state) {
    state->step(saved_step(fields));
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
  if (kind == OptimizerKind::kRmsprop) {
    auto options = std::make_unique<RMSpropOptions>(static_cast<const RMSpropOptions&>(current));
    options->lr(fields.number("lr"))
        .momentum(fields.number("momentum"))
        .alpha(fields.number("alpha"))
        .eps(fields.number("eps"))
        .centered(fields.flag("centered", false))
        .weight_decay(fields.number("weight_decay"));
    return options;
  }
  if (kind == OptimizerKind::kAdagrad) {
    auto options = std::make_unique<AdagradOptions>(static_cast<const AdagradOptions&>(current));
    options->lr(fields.number("lr"))
        .lr_decay(fields.number("lr_decay"))
        .weight_decay(fields.number("weight_decay"))
        .initial_accumulator_value(fields.number("initial_accumulator_value"))
        .eps(fields.number("eps"));
    return options;
  }
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

} // namespace

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
  if (!saved_groups.items().empty()) {
    const std::optional<OptimizerKind> saved = saved_kind(saved_groups.items().front());
    DKIT_CHECK(!saved || family(*saved) == family(kind), source, ": it holds the state of a torch.optim.",
               *saved == OptimizerKind::kAdam ? "Adam or AdamW" : std::string(name_of(kOptimizerClassNames, *saved)),
               ", but the optimizer is a torch::optim::", name_of(kOptimizerClassNames, kind),
               "; resume with the optimizer it was saved with");
  }

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

namespace {

// LibTorch's schedulers keep their position in a protected member: reached through a pointer to it, formed in a
// class derived from LRScheduler, as C++ allows.
struct SchedulerPosition : torch::optim::LRScheduler {
  static unsigned& of(torch::optim::LRScheduler& scheduler) {
    return scheduler.*(&SchedulerPosition::step_count_);
  }
};

} // namespace

PickleValue scheduler_state_dict(const torch::optim::LRScheduler& scheduler) {
  auto& mutable_scheduler = const_cast<torch::optim::LRScheduler&>(scheduler);
  return PickleValue::dict({{"step_count", static_cast<int64_t>(SchedulerPosition::of(mutable_scheduler))}});
}

void load_scheduler_state_dict(torch::optim::LRScheduler& scheduler, const PickleValue& state,
                               const std::string& source) {
  const Fields fields(state, source + ": the scheduler state");
  const int64_t count = fields.integer("step_count");
  DKIT_CHECK(count >= 0 && count <= static_cast<int64_t>(std::numeric_limits<unsigned>::max()), fields.where(),
             ": 'step_count' is ", count, ", expected a count of steps");
  SchedulerPosition::of(scheduler) = static_cast<unsigned>(count);
}

} // namespace dkit
