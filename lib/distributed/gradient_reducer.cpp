#include <dkit/distributed/gradient_reducer.h>

#include <dkit/distributed/process_group.h>

#include <torch/torch.h>

#include <mutex>

namespace dkit {

struct GradientReducer::Impl {
  struct Slot {
    int64_t bucket = 0;
    int64_t offset = 0;
    bool ready = false;
  };
  struct Bucket {
    std::vector<int64_t> parameters;
    at::Tensor buffer;
    int64_t waiting = 0;
    PendingCollective collective;
  };

  std::vector<at::Tensor> parameters;
  std::shared_ptr<ProcessGroupContext> group;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::vector<unsigned> hooks;
  std::mutex mutex;
  size_t next_to_start = 0;
  int64_t started_in_backward = 0;
  bool enabled = true;

  at::Tensor view(int64_t index) {
    const Slot& slot = slots[index];
    const auto& param = parameters[index];
    return buckets[slot.bucket].buffer.narrow(0, slot.offset, param.numel()).view(param.sizes());
  }

  void reset() {
    for (auto& slot : slots) {
      slot.ready = false;
    }
    for (auto& bucket : buckets) {
      bucket.waiting = static_cast<int64_t>(bucket.parameters.size());
    }
    next_to_start = 0;
  }

  void start_ready_buckets() {
    while (next_to_start < buckets.size() && buckets[next_to_start].waiting == 0) {
      Bucket& bucket = buckets[next_to_start];
      bucket.collective = group->allreduce_sum_async(
          bucket.buffer, "the gradient allreduce (bucket " + std::to_string(next_to_start + 1) + " of " +
                             std::to_string(buckets.size()) + ")");
      ++next_to_start;
    }
  }

  void on_gradient(int64_t index, const at::Tensor& grad) {
    std::lock_guard<std::mutex> lock(mutex);
    Slot& slot = slots[index];
    if (slot.ready) {
      view(index).add_(grad);
      return;
    }
    view(index).copy_(grad);
    slot.ready = true;
    --buckets[slot.bucket].waiting;
    start_ready_buckets();
  }
};

GradientReducer::GradientReducer(std::vector<at::Tensor> parameters, std::shared_ptr<ProcessGroupContext> group,
                                 GradientReducerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.parameters = std::move(parameters);
  s.group = std::move(group);
  s.slots.resize(s.parameters.size());
  int64_t bucket_bytes = 0;
  for (int64_t i = static_cast<int64_t>(s.parameters.size()) - 1; i >= 0; --i) {
    const auto& param = s.parameters[i];
    TORCH_INTERNAL_ASSERT(param.device() == s.group->device(), "parameter ", i, " is on ", param.device().str(),
                          ", the process group on ", s.group->device().str());
    const int64_t bytes = param.numel() * static_cast<int64_t>(param.element_size());
    bool new_bucket = s.buckets.empty();
    if (!new_bucket) {
      const int64_t cap = s.buckets.size() == 1 ? options.first_bucket_cap_bytes() : options.bucket_cap_bytes();
      const auto& first = s.parameters[s.buckets.back().parameters.front()];
      new_bucket = first.scalar_type() != param.scalar_type() || bucket_bytes + bytes > cap;
    }
    if (new_bucket) {
      s.buckets.emplace_back();
      bucket_bytes = 0;
    }
    s.slots[i].bucket = static_cast<int64_t>(s.buckets.size()) - 1;
    s.slots[i].offset = bucket_bytes / static_cast<int64_t>(param.element_size());
    s.buckets.back().parameters.push_back(i);
    bucket_bytes += bytes;
  }
  for (auto& bucket : s.buckets) {
    int64_t numel = 0;
    for (const int64_t i : bucket.parameters) {
      numel += s.parameters[i].numel();
    }
    const auto& first = s.parameters[bucket.parameters.front()];
    bucket.buffer = torch::zeros({numel}, first.options().requires_grad(false));
  }
  s.reset();
  for (int64_t i = 0; i < static_cast<int64_t>(s.parameters.size()); ++i) {
    Impl* impl = impl_.get();
    s.hooks.push_back(s.parameters[i].register_hook([impl, i](const at::Tensor& grad) {
      if (!impl->enabled) {
        return;
      }
      const at::Tensor& held = impl->parameters[i].grad();
      impl->on_gradient(i, held.defined() ? grad + held : grad);
    }));
  }
}

GradientReducer::~GradientReducer() {
  for (size_t i = 0; i < impl_->hooks.size(); ++i) {
    impl_->parameters[i].remove_hook(impl_->hooks[i]);
  }
}

void GradientReducer::synchronize() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.started_in_backward = static_cast<int64_t>(s.next_to_start);
    for (size_t b = s.next_to_start; b < s.buckets.size(); ++b) {
      for (const int64_t i : s.buckets[b].parameters) {
        if (!s.slots[i].ready) {
          const at::Tensor& held = s.parameters[i].grad();
          if (held.defined()) {
            s.view(i).copy_(held.reshape_as(s.view(i)));
          } else {
            s.view(i).zero_();
          }
          s.slots[i].ready = true;
          --s.buckets[b].waiting;
        }
      }
    }
    s.start_ready_buckets();
  }
  for (auto& bucket : s.buckets) {
    s.group->wait(bucket.collective);
  }
  for (int64_t i = 0; i < static_cast<int64_t>(s.parameters.size()); ++i) {
    s.parameters[i].mutable_grad() = s.view(i);
  }
  s.reset();
}

void GradientReducer::set_enabled(bool enabled) {
  impl_->enabled = enabled;
}

bool GradientReducer::enabled() const {
  return impl_->enabled;
}

int64_t GradientReducer::index_of(const at::Tensor& parameter) const {
  const auto& parameters = impl_->parameters;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (parameters[i].is_same(parameter)) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

void GradientReducer::mark_ready(int64_t index, const at::Tensor& gradient) {
  Impl& s = *impl_;
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(s.parameters.size()),
              "GradientReducer::mark_ready: no parameter ", index, " (there are ", s.parameters.size(), ")");
  TORCH_CHECK(gradient.sizes() == s.parameters[index].sizes(), "GradientReducer::mark_ready: parameter ", index,
              " has shape ", s.parameters[index].sizes(), ", its gradient ", gradient.sizes());
  s.on_gradient(index, gradient);
}

std::vector<std::vector<int64_t>> GradientReducer::buckets() const {
  std::vector<std::vector<int64_t>> result;
  for (const auto& bucket : impl_->buckets) {
    result.push_back(bucket.parameters);
  }
  return result;
}

int64_t GradientReducer::buckets_started_in_backward() const {
  return impl_->started_in_backward;
}

} // namespace dkit
