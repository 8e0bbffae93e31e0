#include <dkit/train/task.h>

#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/error.h>

#include <torch/torch.h>

#include <sstream>

namespace dkit {
namespace {

// `LeNetImpl` -> `LeNet`, `torch::nn::SequentialImpl` -> `Sequential`.
std::string class_name(const torch::nn::Module& module) {
  std::string name = module.name();
  const auto colon = name.rfind("::");
  if (colon != std::string::npos) {
    name = name.substr(colon + 2);
  }
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) {
    name.resize(name.size() - 4);
  }
  return name;
}

} // namespace

std::vector<std::string> Task::metric_names() const {
  return {};
}

StepResult Task::validation_step(const Batch& batch) {
  return training_step(batch);
}

std::unique_ptr<torch::optim::Optimizer> Task::configure_optimizer() {
  return std::make_unique<torch::optim::Adam>(module().parameters(), torch::optim::AdamOptions(1e-3));
}

Scheduler Task::configure_scheduler(torch::optim::Optimizer& /*optimizer*/, const TrainingPlan& /*plan*/) {
  return {};
}

void Task::on_train_start(const StepContext& /*context*/) {}

std::optional<StepResult> Task::take_step(const Batch& /*batch*/, const StepContext& /*context*/) {
  return std::nullopt;
}

PickleValue Task::state_dict() const {
  return {};
}

void Task::load_state_dict(const PickleValue& /*state*/, const std::string& /*source*/) {}

void Task::describe(TrainingCheckpoint& /*checkpoint*/) const {}

std::string Task::description() const {
  auto& module = const_cast<Task*>(this)->module();
  int64_t parameters = 0;
  for (const auto& parameter : module.parameters()) {
    parameters += parameter.numel();
  }
  std::ostringstream out;
  out << class_name(module) << " (" << parameters << " parameters)";
  return out.str();
}

LossFunction cross_entropy_loss() {
  return [](const at::Tensor& output, const at::Tensor& labels) {
    return torch::nn::functional::cross_entropy(output, labels);
  };
}

Metric accuracy_metric() {
  return {"accuracy", [](const at::Tensor& output, const at::Tensor& labels) {
            return output.argmax(1).eq(labels).to(at::kFloat).mean();
          }};
}

ModuleTask::ModuleTask(std::shared_ptr<torch::nn::Module> module, std::function<at::Tensor(const at::Tensor&)> forward,
                       ModuleTaskOptions options)
    : module_(std::move(module)), forward_(std::move(forward)), options_(std::move(options)) {
  DKIT_CHECK(module_ != nullptr, "ModuleTask needs a module, got an empty pointer");
  DKIT_CHECK(forward_ != nullptr, "ModuleTask needs a forward function");
  DKIT_CHECK(options_.loss() != nullptr, "ModuleTaskOptions::loss is empty: a ModuleTask needs a loss function");
  for (const auto& metric : options_.metrics()) {
    DKIT_CHECK(!metric.name.empty() && metric.compute != nullptr,
               "ModuleTaskOptions::metrics: every metric needs a name and a function");
  }
}

torch::nn::Module& ModuleTask::module() {
  return *module_;
}

std::vector<std::string> ModuleTask::metric_names() const {
  std::vector<std::string> names;
  for (const auto& metric : options_.metrics()) {
    names.push_back(metric.name);
  }
  return names;
}

at::Tensor ModuleTask::forward(const at::Tensor& features) {
  return forward_(features);
}

StepResult ModuleTask::training_step(const Batch& batch) {
  const at::Tensor output = forward_(batch.features);
  StepResult result;
  result.loss = options_.loss()(output, batch.labels);
  if (!options_.metrics().empty()) {
    const at::NoGradGuard no_grad;
    const at::Tensor detached = output.detach();
    for (const auto& metric : options_.metrics()) {
      result.metrics.push_back(metric.compute(detached, batch.labels));
    }
  }
  return result;
}

std::unique_ptr<torch::optim::Optimizer> ModuleTask::configure_optimizer() {
  if (options_.optimizer()) {
    return options_.optimizer()(module_->parameters());
  }
  return Task::configure_optimizer();
}

Scheduler ModuleTask::configure_scheduler(torch::optim::Optimizer& optimizer, const TrainingPlan& plan) {
  Scheduler scheduler;
  if (options_.scheduler()) {
    scheduler.scheduler = options_.scheduler()(optimizer, plan);
    scheduler.interval = options_.scheduler_interval();
  }
  return scheduler;
}

SchedulerFactory warmup_scheduler(WarmupScheduleOptions options) {
  return [options](torch::optim::Optimizer& optimizer,
                   const TrainingPlan& plan) -> std::unique_ptr<torch::optim::LRScheduler> {
    WarmupScheduleOptions resolved = options;
    if (resolved.total_steps() == 0) {
      resolved.total_steps(plan.total_steps);
    }
    return std::make_unique<WarmupLR>(optimizer, resolved);
  };
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const auto& parameter : parameters) {
    if (parameter.grad().defined()) {
      grads.push_back(parameter.grad().detach());
    }
  }
  if (grads.empty()) {
    return torch::zeros({});
  }
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& grad : grads) {
    norms.push_back(grad.norm(2));
  }
  const at::Tensor total = torch::stack(norms).norm(2);
  const at::Tensor coefficient = ((total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
  for (auto& grad : grads) {
    grad.mul_(coefficient.to(grad.device()));
  }
  return total;
}

} // namespace dkit
