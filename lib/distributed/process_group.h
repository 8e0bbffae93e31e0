#pragma once

#include <dkit/core/enum_names.h>
#include <dkit/distributed/launch.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
} // namespace torch::nn

namespace dkit {

/// The c10d backend a multi-process run communicates through (`dist.backend`).
enum class Backend {
  /// kNccl on a GPU when this build has NCCL, kGloo otherwise (see resolve_backend()).
  kAuto,
  /// `c10d::ProcessGroupGloo`: CPU tensors (and CUDA tensors through host copies).
  kGloo,
  /// `c10d::ProcessGroupNCCL`: CUDA tensors.
  kNccl,
};

/// The name of each Backend, as `dist.backend` spells it.
inline constexpr EnumNames<Backend, 3> kBackendNames = {{
    {Backend::kAuto, "auto"},
    {Backend::kGloo, "gloo"},
    {Backend::kNccl, "nccl"},
}};

/// Whether this dkit can use a c10d backend: `gloo` (CPU), `nccl` (CUDA) or `auto`; false for any other name.
bool backend_available(std::string_view backend);

/// The backend `dist.backend` means on `device`: kAuto is kNccl on a GPU when this build has NCCL, kGloo
/// otherwise. A backend this build lacks, or NCCL on the CPU, is a dkit::Error saying what to use instead.
Backend resolve_backend(Backend backend, const Device& device);

/// resolve_backend() of a backend's name, returning the name of the backend chosen; a name not in kBackendNames
/// is a dkit::Error listing them.
std::string resolve_backend(std::string_view backend, const Device& device);

/// How a ProcessGroupContext is set up.
struct ProcessGroupOptions {
  /// The backend to use (see resolve_backend()).
  TORCH_ARG(Backend, backend) = Backend::kAuto;
  /// How long a rank waits for another (`dist.timeout`), the error that says why included: each store call of
  /// the rendezvous (connecting, every rank joining) and each collective ends within it. A collective waits this
  /// less six heartbeat periods for the other ranks (the backend's own timeout), the rest is for telling why and
  /// leaving.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
  /// How often each rank proves it is alive through the rendezvous store, and reads every rank's count, on a
  /// thread and a store connection of its own; at most timeout / 20. When a collective fails, a rank whose count
  /// has not moved for three periods is reported as gone, and a store that answered no round for as long as
  /// unreachable.
  TORCH_ARG(std::chrono::milliseconds, heartbeat) = std::chrono::milliseconds(500);
};

/// A collective started by ProcessGroupContext::allreduce_sum_async(); ProcessGroupContext::wait() finishes it.
class PendingCollective {
 public:
  PendingCollective();
  ~PendingCollective();
  /// Moves the collective: the moved-to object is the one to wait for.
  PendingCollective(PendingCollective&&) noexcept;
  /// Moves the collective: the moved-to object is the one to wait for.
  PendingCollective& operator=(PendingCollective&&) noexcept;

  /// Whether it holds a collective not yet waited for.
  bool pending() const;

 private:
  friend class ProcessGroupContext;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// This process's membership of a multi-process run, as `torch.distributed.init_process_group("env://")` makes
/// it: a `c10d::TCPStore` rendezvous hosted by rank 0 at `MASTER_ADDR:MASTER_PORT`, then a `ProcessGroupGloo`
/// (CPU tensors) or `ProcessGroupNCCL` (CUDA tensors) over all ranks. Each rank also counts a heartbeat in the
/// store, so that when a collective fails (Gloo notices a closed connection at once and a silent peer after the
/// timeout) the error names the rank that is gone rather than only an address. Collectives must be called in the
/// same order on every rank, from one thread at a time.
class ProcessGroupContext {
 public:
  /// Joins the run: connects to (rank 0: hosts) the rendezvous store, waits until every rank has joined, then
  /// creates the backend. Errors name the variable or address at fault: an unresolvable `MASTER_ADDR`, a
  /// `MASTER_PORT` rank 0 cannot listen on, a store no rank could reach within the timeout, a store that stopped
  /// answering (with the phase of joining), ranks that never joined, two processes with the same `RANK`,
  /// processes that disagree on `WORLD_SIZE`.
  ProcessGroupContext(const LaunchEnvironment& launch, const Device& device, ProcessGroupOptions options = {});
  /// Stops the heartbeat and leaves the group. After a failed collective it does not wait for what a lost peer
  /// may hold up: a heartbeat thread stuck in a store call is left to end with the process, and so is the backend.
  ~ProcessGroupContext();
  ProcessGroupContext(const ProcessGroupContext&) = delete;
  ProcessGroupContext& operator=(const ProcessGroupContext&) = delete;

  /// `RANK`.
  int64_t rank() const;
  /// `WORLD_SIZE`.
  int64_t world_size() const;
  /// The launch variables this group was made from.
  const LaunchEnvironment& launch() const;
  /// Whether this is rank 0, the one that logs and writes checkpoints.
  bool is_main() const {
    return rank() == 0;
  }
  /// The device this rank computes on; collectives take tensors on it.
  const Device& device() const;
  /// `gloo` or `nccl`.
  const std::string& backend() const;
  /// The collective and rendezvous timeout.
  std::chrono::milliseconds timeout() const;

  /// Copies rank 0's values of `tensors` into every rank's, in place. `what` names the step in errors.
  void broadcast(const std::vector<at::Tensor>& tensors, const std::string& what);
  /// broadcast(), but the tensors are packed into one per dtype first: one collective per dtype rather than one per
  /// tensor.
  void broadcast_coalesced(const std::vector<at::Tensor>& tensors, const std::string& what);
  /// Sums `tensor` over the ranks, in place, and waits for the result.
  void allreduce_sum(const at::Tensor& tensor, const std::string& what);
  /// Sums host numbers over the ranks (through a float64 tensor on device()); one collective.
  std::vector<double> allreduce_sum(const std::vector<double>& values, const std::string& what);
  /// Returns once every rank has reached it.
  void barrier(const std::string& what);
  /// Starts summing `tensor` over the ranks, in place; the tensor must not be touched until wait() returns. With
  /// Gloo the work runs on the backend's own threads.
  PendingCollective allreduce_sum_async(const at::Tensor& tensor, std::string what);
  /// Waits for a collective started by allreduce_sum_async(); a failure is a dkit::Error that names the lost rank.
  void wait(PendingCollective& pending);

  /// Leaves `message` in the store for the other ranks, whose errors then quote it: what a rank calls when it
  /// fails for a reason of its own. Never throws, and does nothing when the store has stopped answering.
  void publish_failure(const std::string& message) noexcept;

  /// Why a collective named `what` failed with `error`, from what the heartbeat thread sees (no store call of its
  /// own, which a dead link could hold up; at most four heartbeat periods): the failure a rank published, or that
  /// the store is gone or unreachable, or which ranks stopped beating. Used by every collective's error; public for
  /// tests.
  std::string explain_failure(const std::string& what, const std::string& error);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Makes every rank's parameters and buffers of `module` rank 0's (broadcast_coalesced()): how the ranks of a
/// multi-process run start from the same weights, as DistributedDataParallel makes them when it wraps a module.
void broadcast_module(ProcessGroupContext& group, torch::nn::Module& module);

} // namespace dkit
