#include <dkit/train/step.h>

#include <dkit/core/compat.h>
#include <dkit/core/error.h>
#include <dkit/distributed/gradient_reducer.h>
#include <dkit/train/detail/bernoulli.h>
#include <dkit/train/optim.h>

#include <torch/torch.h>

#include <array>
#include <cmath>
#include <cstring>
#include <optional>

#if DKIT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dkit {
namespace {

const auto kSumOptions = torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum);

// The gradient of `loss_sum / global_samples` with respect to `loss_sum`, as the division's backward computes
// it (a float32 division), without the division and its autograd node.
at::Tensor mean_gradient(const at::Tensor& loss_sum, int64_t global_samples) {
  return at::full({}, 1.0f / static_cast<float>(global_samples), loss_sum.options());
}

// `logits.argmax(1).eq(labels).sum()` in one pass for float32 CPU logits, with at::argmax's rule: the first
// largest entry of a row, a NaN counting as larger than any number.
at::Tensor correct_count(const at::Tensor& logits, const at::Tensor& labels) {
  if (!logits.device().is_cpu() || logits.scalar_type() != at::kFloat || !logits.is_contiguous() ||
      !labels.is_contiguous()) {
    return logits.argmax(1).eq(labels).sum();
  }
  const int64_t rows = logits.size(0);
  const int64_t classes = logits.size(1);
  const float* values = logits.data_ptr<float>();
  const int64_t* targets = labels.data_ptr<int64_t>();
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = values + r * classes;
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c) {
      if (!std::isnan(row[best]) && (std::isnan(row[c]) || row[c] > row[best])) {
        best = c;
      }
    }
    correct += best == targets[r] ? 1 : 0;
  }
  return at::scalar_tensor(correct, at::TensorOptions().dtype(at::kLong));
}

} // namespace

// The backward pass of an Mlp written out: each LibTorch call below is the one autograd's formula for the forward
// operation makes (torch/csrc/autograd/FunctionsManual.cpp, derivatives.yaml), on tensors of the same shapes and
// strides, so that the values are the same bit for bit; outputs go into buffers kept from step to step. In bfloat16
// it is the step autocast and autograd make: the weights, biases and features cast (autocast's casts), the layers
// and activations in bfloat16, the logits cast back to float32 for the loss, and on the way back the logits'
// gradient cast to bfloat16 and each parameter's gradient cast back to float32 (the casts' backward). Dropout on
// the CPU is at::dropout's own composition there (a noise tensor filled by bernoulli_ from the default generator,
// divided by the keep probability, multiplied in), and its backward is the product's: the gradient times the noise.
struct TrainStep::Direct {
  Activation activation;
  c10::ScalarType dtype;
  double dropout;
  std::vector<at::Tensor> weights;
  std::vector<at::Tensor> biases;
  std::vector<at::Tensor> weight_grads;
  std::vector<at::Tensor> bias_grads;
  // In bfloat16: the casts of the weights, biases and features, the gradients with respect to the casts, the
  // float32 logits and the logits' gradient cast down. Empty in float32.
  std::vector<at::Tensor> weight_casts;
  std::vector<at::Tensor> bias_casts;
  std::vector<at::Tensor> weight_cast_grads;
  std::vector<at::Tensor> bias_cast_grads;
  at::Tensor features_cast;
  at::Tensor logits;
  at::Tensor grad_logits_cast;
  // Per layer: the output of addmm, then of the activation (the same tensor when it is applied in place), and
  // the gradients with respect to both (always the same tensor: the activation's backward, element by element,
  // overwrites the gradient it reads).
  std::vector<at::Tensor> pre;
  std::vector<at::Tensor> post;
  std::vector<at::Tensor> grad_pre;
  std::vector<at::Tensor> grad_post;
  // With dropout, per hidden layer: the noise and the activation's output times it, the next layer's input.
  std::vector<at::Tensor> noise;
  std::vector<at::Tensor> dropped;
  bool dropping = false;
  at::Tensor log_probs;
  at::Tensor grad_log_probs;
  at::Tensor grad_logits;
  // nll_loss_backward's total_weight, which the sum reduction does not read.
  at::Tensor sum_total_weight;
  // The loss's buffers for all rows: views made once per batch shape, since making a view costs as much as a small
  // operation.
  struct LossRows {
    int64_t begin = 0;
    int64_t count = 0;
    at::Tensor logits;
    at::Tensor log_probs;
    at::Tensor grad_log_probs;
    at::Tensor grad_logits;
  };
  LossRows all_rows;
  int64_t rows = -1;
  at::Tensor seed_gradient;
  int64_t seed_samples = 0;
  // The reducer that sums the gradients over the ranks, and each layer's weight's and bias's positions in it.
  GradientReducer* reducer = nullptr;
  std::vector<int64_t> weight_slots;
  std::vector<int64_t> bias_slots;

  Direct(const Mlp& model, c10::ScalarType compute_dtype)
      : activation(model->options.activation()), dtype(compute_dtype), dropout(model->options.dropout()) {
    for (const auto& layer : model->layers()) {
      weights.push_back(layer->weight);
      biases.push_back(layer->bias);
      weight_grads.push_back(at::empty_like(layer->weight, at::MemoryFormat::Contiguous));
      bias_grads.push_back(at::empty_like(layer->bias, at::MemoryFormat::Contiguous));
    }
    const size_t layers = weights.size();
    const auto float_options = weights.front().options();
    const auto options = float_options.dtype(dtype);
    if (cast()) {
      for (size_t i = 0; i < layers; ++i) {
        weight_casts.push_back(at::empty(weights[i].sizes(), options));
        bias_casts.push_back(at::empty(biases[i].sizes(), options));
        weight_cast_grads.push_back(at::empty(weights[i].sizes(), options));
        bias_cast_grads.push_back(at::empty(biases[i].sizes(), options));
      }
      features_cast = at::empty({0}, options);
      logits = at::empty({0}, float_options);
      grad_logits_cast = at::empty({0}, options);
    }
    for (size_t i = 0; i < layers; ++i) {
      pre.push_back(at::empty({0}, options));
      post.push_back(activation == Activation::kGELU ? at::empty({0}, options) : pre[i]);
      grad_post.push_back(at::empty({0}, options));
      grad_pre.push_back(grad_post[i]);
      if (dropout > 0.0 && i + 1 < layers) {
        noise.push_back(at::empty({0}, options));
        dropped.push_back(at::empty({0}, options));
      }
    }
    log_probs = at::empty({0}, float_options);
    grad_log_probs = at::empty({0}, float_options);
    grad_logits = at::empty({0}, float_options);
    sum_total_weight = at::zeros({}, float_options);
  }

  void reduce_with(GradientReducer* r) {
    reducer = r;
    for (size_t i = 0; i < weights.size(); ++i) {
      weight_slots.push_back(reducer->index_of(weights[i]));
      bias_slots.push_back(reducer->index_of(biases[i]));
    }
  }

  // Whether the step runs in a dtype other than its parameters' (bfloat16), through casts.
  bool cast() const {
    return dtype != weights.front().scalar_type();
  }

  // The logits the loss reads: float32, the last layer's output or its cast.
  const at::Tensor& loss_logits() const {
    return cast() ? logits : pre.back();
  }

  // The weight and bias layer `layer` computes with: the parameters, or their casts.
  const at::Tensor& layer_weight(size_t layer) const {
    return cast() ? weight_casts[layer] : weights[layer];
  }
  const at::Tensor& layer_bias(size_t layer) const {
    return cast() ? bias_casts[layer] : biases[layer];
  }

  // Gives every buffer its shape for batches of `n` rows, so that the `_out` calls neither reallocate nor warn.
  void shape_for(int64_t n) {
    if (n == rows) {
      return;
    }
    rows = n;
    for (size_t i = 0; i < weights.size(); ++i) {
      const int64_t width = weights[i].size(0);
      for (at::Tensor* buffer : {&pre[i], &post[i], &grad_pre[i], &grad_post[i]}) {
        buffer->resize_({n, width});
      }
      if (i < noise.size()) {
        noise[i].resize_({n, width});
        dropped[i].resize_({n, width});
      }
    }
    for (at::Tensor* buffer : {&log_probs, &grad_log_probs, &grad_logits}) {
      buffer->resize_({n, weights.back().size(0)});
    }
    if (cast()) {
      features_cast.resize_({n, weights.front().size(1)});
      logits.resize_({n, weights.back().size(0)});
      grad_logits_cast.resize_({n, weights.back().size(0)});
    }
    const auto loss_rows = [&](int64_t begin, int64_t count) {
      const auto part = [&](const at::Tensor& tensor) { return tensor.narrow(0, begin, count); };
      return LossRows{begin, count, part(loss_logits()), part(log_probs), part(grad_log_probs), part(grad_logits)};
    };
    all_rows = loss_rows(0, n);
  }

  // The gradient with respect to layer `layer`'s output (before its activation).
  const at::Tensor& output_grad(size_t layer) const {
    if (layer + 1 == weights.size()) {
      return cast() ? grad_logits_cast : grad_logits;
    }
    return grad_pre[layer];
  }

  // The input of layer `layer` + 1: the activation's output, or that times the dropout noise.
  const at::Tensor& hidden_output(size_t layer) const {
    return dropping ? dropped[layer] : post[layer];
  }

  // The models the hand-written backward implements, and nothing else: every field of MlpOptions at a value it
  // knows (dropout on the CPU only, where at::dropout is the composition above; elsewhere it is a fused kernel),
  // and a module made of the Linear layers alone, each with its weight and bias.
  static bool supports(const Mlp& model) {
    const MlpOptions& options = model->options;
    if (!options.bias() || (options.dropout() != 0.0 && !model->layers().front()->weight.device().is_cpu())) {
      return false;
    }
    const auto& layers = model->layers();
    if (layers.size() != options.hidden().size() + 1 || model->children().size() != layers.size() ||
        model->parameters().size() != 2 * layers.size() || !model->buffers().empty()) {
      return false;
    }
    for (const auto& layer : layers) {
      if (!layer->bias.defined() || layer->named_parameters(/*recurse=*/true).size() != 2) {
        return false;
      }
    }
    return true;
  }

  bool accepts(const at::Tensor& features, const at::Tensor& labels) const {
    const at::Tensor& first = weights.front();
    return !features.requires_grad() && features.dim() == 2 && features.scalar_type() == first.scalar_type() &&
           features.device() == first.device() && labels.dim() == 1 && labels.scalar_type() == at::kLong &&
           labels.device() == first.device() && features.size(0) == labels.size(0) && features.size(0) > 0 &&
           features.size(1) == first.size(1);
  }

  // pre[layer] = input · weightᵀ + bias, as addmm computes it: addmm copies the bias into each row of its output,
  // then adds the product to it; for float32 CPU buffers the rows are copied here, faster than addmm's broadcast copy.
  void linear(size_t layer, const at::Tensor& input) {
    at::Tensor& out = pre[layer];
    const at::Tensor& bias = layer_bias(layer);
    if (!out.device().is_cpu() || out.scalar_type() != at::kFloat || !out.is_contiguous() ||
        bias.scalar_type() != at::kFloat || !bias.is_contiguous()) {
      at::addmm_out(out, bias, input, layer_weight(layer).t());
      return;
    }
    const int64_t width = out.size(1);
    const auto row_bytes = static_cast<size_t>(width) * sizeof(float);
    const float* from = bias.data_ptr<float>();
    float* to = out.data_ptr<float>();
    for (int64_t r = 0; r < out.size(0); ++r) {
      std::memcpy(to + r * width, from, row_bytes);
    }
    out.addmm_(input, layer_weight(layer).t());
  }

  void activate(size_t layer) {
    switch (activation) {
      case Activation::kReLU: at::relu_(pre[layer]); break;
      case Activation::kTanh: at::tanh_(pre[layer]); break;
      case Activation::kGELU: at::gelu_out(post[layer], pre[layer]); break;
    }
  }

  // at::dropout on the CPU: the noise drawn and scaled in place, then the product.
  void drop(size_t layer) {
    if (!detail::fill_bernoulli(noise[layer], 1 - dropout)) {
      noise[layer].bernoulli_(1 - dropout);
    }
    noise[layer].div_(1 - dropout);
    at::mul_out(dropped[layer], post[layer], noise[layer]);
  }

  // The backward pass of dropout (when it ran) and of the activation: grad_post[layer] holds the gradient with
  // respect to the layer's output after both, and grad_pre[layer] (the same tensor) gets the one before both.
  void activation_backward(size_t layer) {
    if (dropping) {
      at::mul_out(grad_post[layer], grad_post[layer], noise[layer]);
    }
    switch (activation) {
      case Activation::kReLU: at::threshold_backward_out(grad_pre[layer], grad_post[layer], post[layer], 0); break;
      case Activation::kTanh: at::tanh_backward_out(grad_pre[layer], grad_post[layer], post[layer]); break;
      case Activation::kGELU: at::gelu_backward_out(grad_pre[layer], grad_post[layer], pre[layer]); break;
    }
  }

  StepOutput run(const at::Tensor& features, const at::Tensor& labels, int64_t global_samples,
                 std::vector<at::Tensor>& parameters, torch::optim::Optimizer& optimizer, bool training) {
    const at::NoGradGuard no_grad;
    const size_t layers = weights.size();
    TORCH_INTERNAL_ASSERT(parameters.size() == 2 * layers, "an Mlp has a weight and a bias per layer");
    shape_for(features.size(0));
    dropping = training && dropout > 0.0;
    const at::Tensor* input = &features;
    if (cast()) {
      for (size_t i = 0; i < layers; ++i) {
        weight_casts[i].copy_(weights[i]);
        bias_casts[i].copy_(biases[i]);
      }
      features_cast.copy_(features);
      input = &features_cast;
    }
    for (size_t i = 0; i < layers; ++i) {
      linear(i, *input);
      if (i + 1 < layers) {
        activate(i);
        if (dropping) {
          drop(i);
        }
        input = &hidden_output(i);
      }
    }
    if (cast()) {
      logits.copy_(pre.back());
    }
    if (seed_samples != global_samples) {
      seed_gradient = mean_gradient(loss_logits(), global_samples);
      seed_samples = global_samples;
    }
    for (size_t i = 0; i < layers; ++i) {
      weights[i].mutable_grad() = weight_grads[i];
      biases[i].mutable_grad() = bias_grads[i];
    }
    loss_gradient(all_rows, labels);
    if (cast()) {
      grad_logits_cast.copy_(grad_logits);
    }
    backward(cast() ? features_cast : features);
    if (reducer != nullptr) {
      reducer->synchronize();
    }
    optimizer.step();
    return {loss_sum(labels), correct_count(loss_logits(), labels)};
  }

  // The batch's summed cross-entropy, from the log-probabilities.
  at::Tensor loss_sum(const at::Tensor& labels) const {
    return std::get<0>(
        at::nll_loss_forward(log_probs, labels, /*weight=*/{}, at::Reduction::Sum, /*ignore_index=*/-100));
  }

  // log_softmax of the logits, then the gradient of the loss with respect to them (nll_loss's backward, then
  // log_softmax's), for the rows of `part`: each of the three works row by row.
  void loss_gradient(LossRows& part, const at::Tensor& labels) {
    if (part.count == 0) {
      return;
    }
    at::_log_softmax_out(part.log_probs, part.logits, 1, /*half_to_float=*/false);
    at::nll_loss_backward_out(part.grad_log_probs, seed_gradient, part.log_probs,
                              part.count == rows ? labels : labels.narrow(0, part.begin, part.count), /*weight=*/{},
                              at::Reduction::Sum, /*ignore_index=*/-100, sum_total_weight);
    at::_log_softmax_backward_data_out(part.grad_logits, part.grad_log_probs, part.log_probs, 1,
                                       log_probs.scalar_type());
  }

  // Layer by layer from the last: the gradient of the layer's input (the critical path), then its weight's and
  // bias's.
  void backward(const at::Tensor& features) {
    const at::Tensor* grad = &output_grad(weights.size() - 1);
    for (size_t i = weights.size(); i-- > 0;) {
      at::Tensor& weight_grad = cast() ? weight_cast_grads[i] : weight_grads[i];
      at::Tensor& bias_grad = cast() ? bias_cast_grads[i] : bias_grads[i];
      at::mm_out(weight_grad, grad->t(), i == 0 ? features : hidden_output(i - 1));
      at::sum_out(bias_grad, *grad, {0});
      if (cast()) {
        weight_grads[i].copy_(weight_grad);
        bias_grads[i].copy_(bias_grad);
      }
      if (reducer != nullptr) {
        reducer->mark_ready(weight_slots[i], weight_grads[i]);
        reducer->mark_ready(bias_slots[i], bias_grads[i]);
      }
      if (i == 0) {
        break;
      }
      at::mm_out(grad_post[i - 1], *grad, layer_weight(i));
      activation_backward(i - 1);
      grad = &grad_pre[i - 1];
    }
  }

};

// MlpOptions as Direct::supports knows it. A field added to MlpOptions changes its size and stops the build here
// until Direct::supports decides about it (and the field is added below): the hand-written backward must refuse
// what it does not know rather than silently train a different model.
struct KnownMlpOptions {
  int64_t in_features;
  std::vector<int64_t> hidden;
  int64_t out_features;
  Activation activation;
  double dropout;
  bool bias;
};
static_assert(sizeof(MlpOptions) == sizeof(KnownMlpOptions),
              "MlpOptions has a field TrainStep's hand-written backward does not know: teach Direct::supports "
              "about it, then add it to KnownMlpOptions");

TrainStep::TrainStep(Mlp model, torch::optim::Optimizer& optimizer, TrainStepOptions options)
    : model_(std::move(model)),
      optimizer_(&optimizer),
      options_(std::move(options)),
      parameters_(model_->parameters()) {
  TORCH_INTERNAL_ASSERT(!parameters_.empty(), "an Mlp has parameters");
  if (options_.precision() != Precision::kFloat32) {
    check_autocast(parameters_.front().device().type(), autocast_dtype_of(options_.precision()));
  }
  if (options_.reducer() != nullptr) {
    for (size_t i = 0; i < parameters_.size(); ++i) {
      DKIT_CHECK(options_.reducer()->index_of(parameters_[i]) >= 0,
                 "TrainStepOptions::reducer is over other parameters than the model's (it lacks the model's parameter ",
                 i, ")");
    }
  }
  const at::Tensor& first = parameters_.front();
  const bool written_precision =
      options_.precision() == Precision::kFloat32 ||
      (options_.precision() == Precision::kBFloat16 && first.device().is_cpu() && first.scalar_type() == at::kFloat);
  if (written_precision && options_.scaler() == nullptr && !options_.before_update() && Direct::supports(model_)) {
    direct_ = std::make_unique<Direct>(
        model_, options_.precision() == Precision::kFloat32 ? first.scalar_type() : at::kBFloat16);
    if (options_.reducer() != nullptr) {
      direct_->reduce_with(options_.reducer());
    }
  }
}

TrainStep::~TrainStep() = default;
TrainStep::TrainStep(TrainStep&&) noexcept = default;
TrainStep& TrainStep::operator=(TrainStep&&) noexcept = default;

bool TrainStep::direct() const {
  return direct_ != nullptr;
}

void TrainStep::prepare(int64_t rows) {
  TORCH_CHECK(rows >= 0, "TrainStep::prepare needs a row count of 0 or more, got ", rows);
  if (direct_ && direct_->dropout > 0.0) {
    detail::bernoulli_matches();
  }
}

StepOutput TrainStep::run(const at::Tensor& features, const at::Tensor& labels, int64_t global_samples) {
  TORCH_CHECK(global_samples > 0, "TrainStep::run needs a positive global_samples, got ", global_samples);
  if (direct_ && direct_->accepts(features, labels)) {
    return direct_->run(features, labels, global_samples, parameters_, *optimizer_, model_->is_training());
  }
  return run_autograd(features, labels, global_samples);
}

StepOutput TrainStep::run_autograd(const at::Tensor& features, const at::Tensor& labels, int64_t global_samples) {
  for (auto& param : parameters_) {
    param.mutable_grad() = at::Tensor();
  }
  at::Tensor logits;
  if (options_.precision() == Precision::kFloat32) {
    logits = model_->forward(features);
  } else {
    {
      const AutocastGuard autocast(features.device().type(), autocast_dtype_of(options_.precision()));
      logits = model_->forward(features);
    }
    logits = logits.to(at::kFloat);
  }
  const at::Tensor loss_sum = torch::nn::functional::cross_entropy(logits, labels, kSumOptions);
  GradScaler* scaler = options_.scaler();
  if (scaler != nullptr) {
    scaler->scale(loss_sum / static_cast<double>(global_samples)).backward();
  } else {
    loss_sum.backward(mean_gradient(loss_sum, global_samples));
  }
  if (options_.reducer() != nullptr) {
    options_.reducer()->synchronize();
  }
  if (options_.before_update()) {
    options_.before_update()();
  }
  if (scaler != nullptr) {
    scaler->step(*optimizer_);
    scaler->update();
  } else {
    optimizer_->step();
  }
  const at::NoGradGuard no_grad;
  return {loss_sum.detach(), logits.detach().argmax(1).eq(labels).sum()};
}

#if DKIT_WITH_CUDA
struct CudaGraphStep::Impl {
  Mlp model;
  torch::optim::Adam* optimizer;
  std::vector<at::Tensor> parameters;
  std::vector<torch::optim::AdamParamState*> states;
  int64_t batch_size;
  int64_t warmup_steps;
  int64_t steps_done = 0;
  c10::cuda::CUDAStream side;
  at::Tensor static_features;
  at::Tensor static_labels;
  at::Tensor neg_step_size;
  at::Tensor bias_correction2_sqrt;
  StepOutput static_output;
  std::unique_ptr<at::cuda::CUDAGraph> graph;

  Impl(Mlp m, torch::optim::Adam& adam, int64_t batch, int64_t num_features, int64_t warmup)
      : model(std::move(m)),
        optimizer(&adam),
        parameters(model->parameters()),
        batch_size(batch),
        warmup_steps(warmup),
        side(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, parameters.front().device().index())) {
    const at::Device device = parameters.front().device();
    DKIT_CHECK(device.is_cuda(), "a CUDA graph step needs the model on a GPU, it is on ", device.str());
    DKIT_CHECK(batch_size > 0, "a CUDA graph step needs a positive batch size, got ", batch_size);
    DKIT_CHECK(warmup_steps >= 1, "a CUDA graph step needs at least 1 warm-up step, got ", warmup_steps);
    DKIT_CHECK(optimizer->param_groups().size() == 1, "a CUDA graph step needs an Adam with one parameter group");
    const auto& options = static_cast<const torch::optim::AdamOptions&>(optimizer->param_groups()[0].options());
    DKIT_CHECK(!options.amsgrad(), "a CUDA graph step does not support Adam's amsgrad");
    using Key = std::decay_t<decltype(optimizer->state())>::key_type;
    for (const auto& param : parameters) {
      auto& entry = optimizer->state()[compat::optimizer_state_key<Key>(param)];
      if (!entry) {
        auto fresh = std::make_unique<torch::optim::AdamParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(param, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(param, at::MemoryFormat::Preserve));
        entry = std::move(fresh);
      }
      states.push_back(static_cast<torch::optim::AdamParamState*>(entry.get()));
    }
    const auto on_device = at::TensorOptions().device(device);
    static_features = at::zeros({batch_size, num_features}, on_device.dtype(at::kFloat));
    static_labels = at::zeros({batch_size}, on_device.dtype(at::kLong));
    neg_step_size = at::zeros({}, on_device.dtype(at::kFloat));
    bias_correction2_sqrt = at::ones({}, on_device.dtype(at::kFloat));
  }

  const torch::optim::AdamOptions& options() const {
    return static_cast<const torch::optim::AdamOptions&>(optimizer->param_groups()[0].options());
  }

  // Host side of an Adam step, outside the graph: the step counts and the bias corrections they imply.
  void prepare_update() {
    const int64_t step = states.front()->step() + 1;
    for (auto* state : states) {
      TORCH_INTERNAL_ASSERT(state->step() + 1 == step, "Adam parameters at different steps in a CUDA graph step");
      state->step(step);
    }
    const double beta1 = std::get<0>(options().betas());
    const double beta2 = std::get<1>(options().betas());
    const double bias_correction1 = 1 - std::pow(beta1, step);
    const double bias_correction2 = 1 - std::pow(beta2, step);
    neg_step_size.fill_(-(options().lr() / bias_correction1));
    bias_correction2_sqrt.fill_(std::sqrt(bias_correction2));
  }

  // Device side of the Adam step, captured: torch::optim::Adam's operations with the bias corrections read from
  // the device.
  void apply_update() {
    const at::NoGradGuard no_grad;
    const double beta1 = std::get<0>(options().betas());
    const double beta2 = std::get<1>(options().betas());
    for (size_t i = 0; i < parameters.size(); ++i) {
      at::Tensor& param = parameters[i];
      at::Tensor grad = param.grad();
      if (options().weight_decay() != 0) {
        grad = grad.add(param, options().weight_decay());
      }
      at::Tensor& exp_avg = states[i]->exp_avg();
      at::Tensor& exp_avg_sq = states[i]->exp_avg_sq();
      exp_avg.mul_(beta1).add_(grad, 1 - beta1);
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      const at::Tensor denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options().eps());
      param.addcdiv_(exp_avg * neg_step_size, denom);
    }
  }

  StepOutput forward_backward() {
    const at::Tensor logits = model->forward(static_features);
    const at::Tensor loss_sum = torch::nn::functional::cross_entropy(logits, static_labels, kSumOptions);
    loss_sum.backward(mean_gradient(loss_sum, batch_size));
    const at::NoGradGuard no_grad;
    return {loss_sum.detach(), logits.detach().argmax(1).eq(static_labels).sum()};
  }

  void clear_grads() {
    for (auto& param : parameters) {
      param.mutable_grad() = at::Tensor();
    }
  }

  StepOutput run(const at::Tensor& features, const at::Tensor& labels) {
    DKIT_CHECK(features.dim() == 2 && features.size(0) == batch_size && labels.dim() == 1 &&
                   labels.size(0) == batch_size,
               "a CUDA graph step was made for batches of ", batch_size, " rows, got features ", features.sizes(),
               " and labels ", labels.sizes());
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(side.device_index());
    static_features.copy_(features, /*non_blocking=*/true);
    static_labels.copy_(labels, /*non_blocking=*/true);
    prepare_update();
    if (graph) {
      graph->replay();
      ++steps_done;
      return static_output;
    }
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(side);
    {
      const c10::cuda::CUDAStreamGuard on_side(side);
      clear_grads();
      if (steps_done < warmup_steps) {
        static_output = forward_backward();
        apply_update();
      } else {
        graph = std::make_unique<at::cuda::CUDAGraph>();
        graph->capture_begin();
        static_output = forward_backward();
        apply_update();
        graph->capture_end();
      }
    }
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
    if (graph) {
      graph->replay();
    }
    ++steps_done;
    return static_output;
  }
};

CudaGraphStep::CudaGraphStep(Mlp model, torch::optim::Adam& optimizer, int64_t batch_size, int64_t num_features,
                             int64_t warmup_steps)
    : impl_(std::make_unique<Impl>(std::move(model), optimizer, batch_size, num_features, warmup_steps)) {}

CudaGraphStep::~CudaGraphStep() = default;

StepOutput CudaGraphStep::run(const at::Tensor& features, const at::Tensor& labels) {
  return impl_->run(features, labels);
}

bool CudaGraphStep::captured() const {
  return impl_->graph != nullptr;
}
#endif

} // namespace dkit
