#include <dkit/distributed/process_group.h>

#include <dkit/config.h>
#include <dkit/core/compat.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/device/host_sync.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if DKIT_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if DKIT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <thread>

// NCCL: the only part of this file that needs nccl.h, kept apart. Unverified on the machine this was written on,
// which has neither NCCL's headers nor a GPU.
#if DKIT_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace dkit {
namespace {

c10::intrusive_ptr<compat::C10dBackend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  const Device& device, std::chrono::milliseconds timeout) {
  c10::cuda::set_device(device.index());
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

} // namespace
} // namespace dkit
#endif

namespace dkit {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& text) {
  return {text.begin(), text.end()};
}

std::string text(const std::vector<uint8_t>& data) {
  return {data.begin(), data.end()};
}

std::string message_of(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string message = c10_error != nullptr ? c10_error->what_without_backtrace() : e.what();
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.pop_back();
  }
  return message;
}

std::string seconds(std::chrono::milliseconds duration) {
  std::ostringstream out;
  out << duration.count() / 1000.0 << " s";
  return out.str();
}

std::string rank_list(const std::vector<int64_t>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) {
    out << (i == 0 ? "" : ", ") << ranks[i];
  }
  return out.str();
}

std::string this_host() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("?");
}

std::string key(const char* kind, int64_t rank) {
  return std::string("dkit/") + kind + "/" + std::to_string(rank);
}

/// What within() throws for a call that has not returned in time.
struct NoAnswer : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Runs `call` on a thread of its own and returns what it returns (or throws what it throws), or throws NoAnswer
/// when it has not returned within `limit`. c10d's TCPStore waits for some answers without any limit (add, set,
/// check and the read of a get in every version; connecting, its ping and a wait's cancelling in 2.x), which a store
/// behind a cut link or in a stopped process never sends: such a thread is left to end with the process, holding
/// only what `call` captured (by value, never the caller's state).
template <typename Call>
auto within(std::chrono::milliseconds limit, Call call) -> decltype(call()) {
  using Result = decltype(call());
  auto task = std::make_shared<std::packaged_task<Result()>>(std::move(call));
  auto result = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (result.wait_for(limit) != std::future_status::ready) {
    throw NoAnswer("no answer within " + seconds(limit));
  }
  return result.get();
}

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

} // namespace

bool backend_available(std::string_view backend) {
  const std::optional<Backend> parsed = try_parse(kBackendNames, backend);
  if (!parsed) {
    return false;
  }
  switch (*parsed) {
    case Backend::kGloo: return DKIT_WITH_GLOO == 1;
    case Backend::kNccl: return DKIT_WITH_NCCL == 1;
    case Backend::kAuto: return DKIT_WITH_GLOO == 1 || DKIT_WITH_NCCL == 1;
  }
  return false;
}

Backend resolve_backend(Backend backend, const Device& device) {
  const std::string build = std::string("this dkit was built against LibTorch ") + TORCH_VERSION +
                            (DKIT_WITH_CUDA ? " with CUDA" : " without CUDA") + ", which has " +
                            (DKIT_WITH_GLOO && DKIT_WITH_NCCL ? "Gloo and NCCL"
                             : DKIT_WITH_GLOO                 ? "Gloo only"
                             : DKIT_WITH_NCCL                 ? "NCCL only"
                                                              : "no c10d backend");
  Backend chosen = backend;
  if (backend == Backend::kAuto) {
    chosen = device.is_cuda() && DKIT_WITH_NCCL ? Backend::kNccl : Backend::kGloo;
  }
  if (chosen == Backend::kNccl) {
    DKIT_CHECK(DKIT_WITH_NCCL, "dist.backend 'nccl' is not available: ", build,
               " (see `dkit devices`); use dist.backend: gloo or auto");
    DKIT_CHECK(device.is_cuda(), "dist.backend 'nccl' needs a GPU, but this rank trains on ", device.str(),
               "; use dist.backend: gloo or auto on the CPU");
  }
  DKIT_CHECK(chosen != Backend::kGloo || DKIT_WITH_GLOO, "dist.backend '", name_of(kBackendNames, backend),
             "' needs c10d's Gloo backend, which is not available: ", build, " (see `dkit devices`)");
  return chosen;
}

std::string resolve_backend(std::string_view backend, const Device& device) {
  const std::optional<Backend> parsed = try_parse(kBackendNames, backend);
  DKIT_CHECK(parsed.has_value(), "dist.backend '", backend, "' is not one of ", list_names(kBackendNames, ", "));
  return std::string(name_of(kBackendNames, resolve_backend(*parsed, device)));
}

struct PendingCollective::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  std::string what;
};

PendingCollective::PendingCollective() = default;
PendingCollective::~PendingCollective() = default;
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;

bool PendingCollective::pending() const {
  return impl_ != nullptr && impl_->work;
}

struct ProcessGroupContext::Impl {
  /// What the heartbeat thread has seen, shared with the group under `mutex`.
  struct Watch {
    std::mutex mutex;
    std::condition_variable wake;
    bool stopping = false;
    bool ended = false;
    /// Set by explain_failure(): the next round also reads the failures the other ranks published.
    bool read_failures = false;
    bool failures_read = false;
    /// Completed rounds, and when the last one completed.
    int64_t rounds = 0;
    Clock::time_point last_answer;
    /// The error of the store call that ended the thread, if one did.
    std::string store_error;
    /// Each rank's heartbeat count, and when it last changed.
    std::vector<int64_t> counts;
    std::vector<Clock::time_point> changed;
    /// Each rank's published failure, or "".
    std::vector<std::string> failures;
  };

  LaunchEnvironment launch;
  Device device;
  ProcessGroupOptions options;
  std::string backend;
  std::string master_ip;
  std::string rendezvous;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::C10dBackend> group;
  std::vector<std::string> members;

  std::shared_ptr<Watch> watch = std::make_shared<Watch>();
  std::thread heartbeat_thread;
  bool failed = false;

  Impl(const LaunchEnvironment& l, const Device& d, ProcessGroupOptions o)
      : launch(l), device(d), options(std::move(o)) {}

  ~Impl() {
    if (heartbeat_thread.joinable()) {
      std::unique_lock<std::mutex> lock(watch->mutex);
      watch->stopping = true;
      watch->wake.notify_all();
      // A healthy heartbeat thread ends at once; one in a store call that a lost peer holds up is left behind
      // (after half of the period left for leaving: the other half is the process's exit).
      const auto patience = failed ? heartbeat() / 2 : 2 * heartbeat();
      const bool ended = watch->wake.wait_for(lock, patience, [this] { return watch->ended; });
      lock.unlock();
      if (ended) {
        heartbeat_thread.join();
      } else {
        heartbeat_thread.detach();
      }
    }
    if (failed) {
      // After a lost peer, c10d's Gloo threads may sit in reads on a dead link for a whole timeout each, and its
      // destructor waits for every queued collective: the run is over, so the backend is left to the process's end.
      (void)group.release();
    }
  }

  std::string where() const {
    return "MASTER_ADDR=" + launch.master_addr + " MASTER_PORT=" + std::to_string(launch.master_port);
  }

  std::string member(int64_t rank) const {
    const std::string about = rank < static_cast<int64_t>(members.size()) ? members[rank] : "";
    return "rank " + std::to_string(rank) + " of " + std::to_string(launch.world_size) +
           (about.empty() ? "" : " (" + about + ")");
  }

  std::string host_of_store() const {
    return launch.agent_store ? "torchrun's agent" : "rank 0";
  }

  /// The heartbeat period: ProcessGroupOptions::heartbeat, or dist.timeout / 20 when that is shorter, so that
  /// telling why a collective failed (at most four periods) fits in dist.timeout.
  std::chrono::milliseconds heartbeat() const {
    return std::min(options.heartbeat(), options.timeout() / 20);
  }

  /// How long a rank waits for another, in a collective (the backend's own timeout) or in the rendezvous:
  /// dist.timeout less six heartbeat periods, which are for this rank's own wait to notice (one), telling why
  /// (four) and leaving (one).
  std::chrono::milliseconds wait_limit() const {
    return options.timeout() - 6 * heartbeat();
  }

  /// Connects to the rendezvous store (rank 0: hosts it, unless torchrun's agent does) and adds `value` to `name`
  /// there, the first exchange that proves a store answers, all within dist.timeout. The keys of a torchrun
  /// attempt live under `/worker/attempt_N`, as PyTorch's own processes use them. c10d's own limits are set well
  /// past dist.timeout (1.13 gives up connecting up to a second before its limit), so that within()'s is the one
  /// that applies, the same in every LibTorch.
  std::pair<c10::intrusive_ptr<c10d::Store>, int64_t> connect(bool may_host, const std::string& name,
                                                               int64_t value) const {
    const bool server = may_host && launch.rank == 0 && !launch.agent_store;
    const auto store_options = compat::tcp_store_options<c10d::TCPStoreOptions>(
        static_cast<uint16_t>(launch.master_port), server, 2 * options.timeout() + std::chrono::seconds(2));
    const std::string prefix = launch.agent_store ? "/worker/attempt_" + std::to_string(launch.restart_count) : "";
    return within(options.timeout(), [ip = master_ip, store_options, prefix, name, value] {
      c10::intrusive_ptr<c10d::Store> client = c10::make_intrusive<c10d::TCPStore>(ip, store_options);
      if (!prefix.empty()) {
        client = c10::make_intrusive<c10d::PrefixStore>(prefix, client);
      }
      const int64_t count = client->add(name, value);
      return std::make_pair(client, count);
    });
  }

  /// The error for a store call made while `phase` that failed with `e` (NoAnswer: did not return in time).
  Error lost_store(const std::string& phase, const std::exception& e) const {
    const bool silent = dynamic_cast<const NoAnswer*>(&e) != nullptr;
    return Error("rank " + std::to_string(launch.rank) + " lost the rendezvous store at " + where() + " (" +
                 rendezvous + ") while " + phase + ": " +
                 (silent ? "it did not answer within " + seconds(options.timeout()) + " (dist.timeout): is " +
                               host_of_store() + " stopped, or the network to it cut?"
                         : message_of(e)));
  }

  /// Makes `call` on the store, made while `phase`, within dist.timeout; a failure is lost_store().
  template <typename Call>
  auto store_call(const std::string& phase, Call call) const -> decltype(call(store)) {
    try {
      return within(options.timeout(), [store = store, call] { return call(store); });
    } catch (const std::exception& e) {
      throw lost_store(phase, e);
    }
  }

  /// Waits, while `phase`, until each of `ranks` has set its key of `keys`, within dist.timeout: the store's wait
  /// gets wait_limit(), and the rest is for asking which ranks are missing.
  void await_ranks(const std::string& phase, const std::vector<std::string>& keys,
                   const std::vector<int64_t>& ranks) const {
    const auto deadline = Clock::now() + options.timeout();
    try {
      within(options.timeout(), [store = store, keys, limit = wait_limit()] { store->wait(keys, limit); });
      return;
    } catch (const NoAnswer& e) {
      throw lost_store(phase, e);
    } catch (const std::exception&) {
      // The store's own timeout, or an error that the question below meets again.
    }
    std::vector<int64_t> missing;
    try {
      missing = within(left_until(deadline), [store = store, keys, ranks] {
        std::vector<int64_t> absent;
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!store->check({keys[i]})) {
            absent.push_back(ranks[i]);
          }
        }
        return absent;
      });
    } catch (const std::exception& e) {
      throw lost_store(phase, e);
    }
    if (missing.empty()) {
      return;
    }
    const bool many = missing.size() > 1;
    throw Error(rank_list(missing) + " of " + std::to_string(launch.world_size) + (many ? " have" : " has") +
                " not joined the rendezvous at " + where() + " within " + seconds(options.timeout()) +
                " (dist.timeout): start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE");
  }

  void join() {
    int64_t claims = 0;
    try {
      std::tie(store, claims) = connect(/*may_host=*/true, key("claims", launch.rank), 1);
    } catch (const std::exception& e) {
      const bool server = launch.rank == 0 && !launch.agent_store;
      const bool silent = dynamic_cast<const NoAnswer*>(&e) != nullptr;
      DKIT_CHECK(!server || silent, "rank 0 cannot host the rendezvous store on MASTER_PORT=", launch.master_port,
                 ": ", message_of(e));
      throw Error("rank " + std::to_string(launch.rank) + " could not reach the rendezvous store at " + where() +
                  " (" + rendezvous + ") within " + seconds(options.timeout()) + " (dist.timeout): is " +
                  host_of_store() + " running there? " + (silent ? "Nothing answered there" : message_of(e)));
    }
    DKIT_CHECK(claims == 1, "RANK=", launch.rank, " was given to ", claims,
               " processes: each process of the run needs its own RANK");
    if (launch.rank == 0) {
      store_call("joining", [world = bytes(std::to_string(launch.world_size))](auto client) {
        client->set("dkit/world_size", world);
      });
    }
    await_ranks("joining", {"dkit/world_size"}, {0});
    const std::string world =
        text(store_call("joining", [](auto client) { return client->get("dkit/world_size"); }));
    DKIT_CHECK(world == std::to_string(launch.world_size), "WORLD_SIZE=", launch.world_size,
               " for this process (rank ", launch.rank, ") but WORLD_SIZE=", world,
               " for rank 0: every process of the run needs the same WORLD_SIZE");
    store_call("joining", [name = key("member", launch.rank),
                           about = bytes("host " + this_host() + " (" +
                                         local_address_towards(master_ip, launch.master_port) + "), pid " +
                                         std::to_string(getpid()))](auto client) { client->set(name, about); });
    std::vector<std::string> keys;
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < launch.world_size; ++r) {
      keys.push_back(key("member", r));
      ranks.push_back(r);
    }
    await_ranks("waiting for the other ranks", keys, ranks);
    members = store_call("reading who joined", [keys](auto client) {
      std::vector<std::string> found;
      for (const auto& name : keys) {
        found.push_back(text(client->get(name)));
      }
      return found;
    });
  }

  void start_heartbeat() {
    c10::intrusive_ptr<c10d::Store> heartbeat_store;
    try {
      heartbeat_store = connect(/*may_host=*/false, key("heartbeat", launch.rank), 1).first;
    } catch (const std::exception& e) {
      throw lost_store("starting its heartbeat", e);
    }
    const auto now = Clock::now();
    watch->last_answer = now;
    watch->counts.assign(static_cast<size_t>(launch.world_size), 0);
    watch->changed.assign(static_cast<size_t>(launch.world_size), now);
    watch->failures.assign(static_cast<size_t>(launch.world_size), "");
    heartbeat_thread = std::thread(beat, watch, heartbeat_store, launch.rank, launch.world_size, heartbeat());
  }

  /// The heartbeat thread: every `period` it counts this rank's beat and reads every rank's count (and, when
  /// asked, the failures they published) through its own connection to the store. It shares only `watch` and
  /// `store` with the group, so that it can be left behind when a store call never returns.
  static void beat(std::shared_ptr<Watch> watch, c10::intrusive_ptr<c10d::Store> store, int64_t me, int64_t size,
                   std::chrono::milliseconds period) {
    std::unique_lock<std::mutex> lock(watch->mutex);
    while (!watch->stopping) {
      const bool read_failures = watch->read_failures;
      lock.unlock();
      std::vector<int64_t> counts(static_cast<size_t>(size));
      std::vector<std::string> failures(static_cast<size_t>(size));
      std::string error;
      try {
        for (int64_t r = 0; r < size; ++r) {
          counts[r] = store->add(key("heartbeat", r), r == me ? 1 : 0);
          if (read_failures && r != me && store->check({key("failed", r)})) {
            failures[r] = text(store->get(key("failed", r)));
          }
        }
      } catch (const std::exception& e) {
        error = message_of(e);
      }
      lock.lock();
      const auto now = Clock::now();
      if (!error.empty()) {
        watch->store_error = error;
        break;
      }
      watch->last_answer = now;
      for (int64_t r = 0; r < size; ++r) {
        if (counts[r] != watch->counts[r]) {
          watch->counts[r] = counts[r];
          watch->changed[r] = now;
        }
        if (!failures[r].empty()) {
          watch->failures[r] = failures[r];
        }
      }
      watch->failures_read = watch->failures_read || read_failures;
      ++watch->rounds;
      watch->wake.notify_all();
      watch->wake.wait_for(lock, period, [&] { return watch->stopping || (watch->read_failures && !watch->failures_read); });
    }
    watch->ended = true;
    watch->wake.notify_all();
  }

#if DKIT_WITH_GLOO
  std::shared_ptr<::gloo::transport::Device> gloo_device() const {
    if (const char* names = std::getenv("GLOO_SOCKET_IFNAME")) {
      const std::string name = std::string(names).substr(0, std::string(names).find(','));
      try {
        return c10d::ProcessGroupGloo::createDeviceForInterface(name);
      } catch (const std::exception& e) {
        throw Error("GLOO_SOCKET_IFNAME='" + std::string(names) + "': cannot use interface '" + name +
                    "': " + message_of(e));
      }
    }
    return c10d::ProcessGroupGloo::createDeviceForHostname(local_address_towards(master_ip, launch.master_port));
  }
#endif

  void create_backend() {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dkit/" + backend, store);
    const int rank = static_cast<int>(launch.rank);
    const int size = static_cast<int>(launch.world_size);
    if (backend == "gloo") {
#if DKIT_WITH_GLOO
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(wait_limit());
      gloo_options->devices.push_back(gloo_device());
      gloo_options->threads = 2;
      // Gloo's rendezvous reads the other ranks' addresses from the store, which may not answer.
      group = within(wait_limit() + heartbeat(), [prefixed, rank, size, gloo_options] {
        return c10::intrusive_ptr<compat::C10dBackend>(
            c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, gloo_options));
      });
#endif
    } else {
#if DKIT_WITH_NCCL
      group = make_nccl(prefixed, rank, size, device, wait_limit());
#endif
    }
    TORCH_INTERNAL_ASSERT(group, "no c10d backend was created for '", backend, "'");
  }

  void wait(c10d::Work& work, const std::string& what, ProcessGroupContext& self) {
    try {
      work.wait(wait_limit() + heartbeat());
    } catch (const std::exception& e) {
      throw Error(self.explain_failure(what, message_of(e)));
    }
  }

  /// Whether the heartbeat thread's store calls have been answered lately.
  bool store_answers() {
    std::lock_guard<std::mutex> lock(watch->mutex);
    return watch->store_error.empty() && Clock::now() - watch->last_answer < 3 * heartbeat();
  }
};

ProcessGroupContext::ProcessGroupContext(const LaunchEnvironment& launch, const Device& device,
                                         ProcessGroupOptions options)
    : impl_(std::make_unique<Impl>(launch, device, std::move(options))) {
  Impl& s = *impl_;
  s.backend = name_of(kBackendNames, resolve_backend(s.options.backend(), device));
  s.master_ip = resolve_host(launch.master_addr, "MASTER_ADDR");
  s.rendezvous = s.master_ip + ":" + std::to_string(launch.master_port);
  s.join();
  s.start_heartbeat();
  try {
    s.create_backend();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(explain_failure("connecting the " + s.backend + " backend", message_of(e)));
  }
}

ProcessGroupContext::~ProcessGroupContext() = default;

int64_t ProcessGroupContext::rank() const {
  return impl_->launch.rank;
}

int64_t ProcessGroupContext::world_size() const {
  return impl_->launch.world_size;
}

const LaunchEnvironment& ProcessGroupContext::launch() const {
  return impl_->launch;
}

const Device& ProcessGroupContext::device() const {
  return impl_->device;
}

const std::string& ProcessGroupContext::backend() const {
  return impl_->backend;
}

std::chrono::milliseconds ProcessGroupContext::timeout() const {
  return impl_->options.timeout();
}

void ProcessGroupContext::broadcast(const std::vector<at::Tensor>& tensors, const std::string& what) {
  for (const auto& tensor : tensors) {
    TORCH_INTERNAL_ASSERT(tensor.is_contiguous() && tensor.device() == impl_->device,
                          "broadcast needs contiguous tensors on ", impl_->device.str());
    std::vector<at::Tensor> one{tensor};
    c10d::BroadcastOptions broadcast_options;
    broadcast_options.rootRank = 0;
    auto work = impl_->group->broadcast(one, broadcast_options);
    impl_->wait(*work, what, *this);
  }
}

void ProcessGroupContext::broadcast_coalesced(const std::vector<at::Tensor>& tensors, const std::string& what) {
  std::vector<std::vector<at::Tensor>> by_dtype;
  for (const auto& tensor : tensors) {
    auto same = std::find_if(by_dtype.begin(), by_dtype.end(), [&](const std::vector<at::Tensor>& group) {
      return group.front().scalar_type() == tensor.scalar_type();
    });
    if (same == by_dtype.end()) {
      by_dtype.push_back({tensor});
    } else {
      same->push_back(tensor);
    }
  }
  const at::NoGradGuard no_grad;
  for (const auto& same : by_dtype) {
    std::vector<at::Tensor> flat;
    for (const auto& tensor : same) {
      flat.push_back(tensor.reshape({-1}));
    }
    const at::Tensor packed = at::cat(flat);
    broadcast({packed}, what);
    int64_t offset = 0;
    for (const auto& tensor : same) {
      at::Tensor target = tensor;
      target.copy_(packed.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
      offset += tensor.numel();
    }
  }
}

void broadcast_module(ProcessGroupContext& group, torch::nn::Module& module) {
  std::vector<at::Tensor> state;
  for (const auto& parameter : module.parameters()) {
    state.push_back(parameter.detach());
  }
  for (const auto& buffer : module.buffers()) {
    state.push_back(buffer);
  }
  group.broadcast_coalesced(state, "the broadcast of rank 0's weights");
}

void ProcessGroupContext::allreduce_sum(const at::Tensor& tensor, const std::string& what) {
  PendingCollective pending = allreduce_sum_async(tensor, what);
  wait(pending);
}

std::vector<double> ProcessGroupContext::allreduce_sum(const std::vector<double>& values, const std::string& what) {
  auto tensor = torch::tensor(values, torch::kFloat64).to(impl_->device);
  allreduce_sum(tensor, what);
  const auto host = tensor.to(torch::kCPU);
  note_host_sync();
  const double* data = host.data_ptr<double>();
  return {data, data + host.numel()};
}

void ProcessGroupContext::barrier(const std::string& what) {
  allreduce_sum(std::vector<double>{1.0}, what);
}

PendingCollective ProcessGroupContext::allreduce_sum_async(const at::Tensor& tensor, std::string what) {
  TORCH_INTERNAL_ASSERT(tensor.is_contiguous() && tensor.device() == impl_->device,
                        "allreduce needs a contiguous tensor on ", impl_->device.str());
  std::vector<at::Tensor> one{tensor};
  c10d::AllreduceOptions allreduce_options;
  allreduce_options.reduceOp = c10d::ReduceOp::SUM;
  PendingCollective pending;
  pending.impl_ = std::make_unique<PendingCollective::Impl>();
  pending.impl_->what = std::move(what);
  try {
    pending.impl_->work = impl_->group->allreduce(one, allreduce_options);
  } catch (const std::exception& e) {
    throw Error(explain_failure(pending.impl_->what, message_of(e)));
  }
  return pending;
}

void ProcessGroupContext::wait(PendingCollective& pending) {
  TORCH_INTERNAL_ASSERT(pending.pending(), "wait() on a collective that was not started or was already waited for");
  auto work = std::move(pending.impl_->work);
  impl_->wait(*work, pending.impl_->what, *this);
}

void ProcessGroupContext::publish_failure(const std::string& message) noexcept {
  // A store that stopped answering would leave this call waiting; the other ranks then find that out themselves.
  if (!impl_->store_answers()) {
    return;
  }
  try {
    impl_->store->set(key("failed", impl_->launch.rank), bytes(message));
  } catch (...) {
    // The store may be gone with rank 0: the other ranks then say that.
  }
}

std::string ProcessGroupContext::explain_failure(const std::string& what, const std::string& error) {
  Impl& s = *impl_;
  s.failed = true;
  Impl::Watch& watch = *s.watch;
  const int64_t me = s.launch.rank;
  const auto period = s.heartbeat() * 3;
  std::unique_lock<std::mutex> lock(watch.mutex);
  watch.read_failures = true;
  watch.failures_read = false;
  watch.wake.notify_all();
  // What the heartbeat thread sees tells why, with no store call here that a dead link could hold up. A round it
  // starts from now on (counts seen before may be old: this process may itself have been stopped) reads the
  // published failures and every rank's heartbeat; a rank whose count has not moved for three periods is gone. A
  // store that answers no round within four periods (or within one, when it had not answered for three before) is
  // unreachable.
  const auto silent = [&](Clock::time_point now) {
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < s.launch.world_size; ++r) {
      if (r != me && now - watch.changed[r] >= period) {
        ranks.push_back(r);
      }
    }
    return ranks;
  };
  const auto published = [&] {
    for (int64_t r = 0; r < s.launch.world_size; ++r) {
      if (!watch.failures[r].empty()) {
        return r;
      }
    }
    return int64_t{-1};
  };
  const auto asked = Clock::now();
  const auto told = [&](Clock::time_point now) {
    const bool store_silent = !watch.failures_read && now - asked >= s.heartbeat() &&
                              now - watch.last_answer >= period;
    return published() >= 0 || !watch.store_error.empty() || store_silent ||
           (watch.failures_read && !silent(now).empty());
  };
  const auto deadline = asked + period + s.heartbeat();
  for (auto now = asked; !told(now) && now < deadline; now = Clock::now()) {
    watch.wake.wait_for(lock, std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - now));
  }
  const auto now = Clock::now();
  const auto since = [&](Clock::time_point then) {
    return format_fixed(std::chrono::duration<double>(now - then).count(), 1) + " s";
  };
  std::string cause;
  if (const int64_t r = published(); r >= 0) {
    cause = s.member(r) + " failed: " + watch.failures[r];
  } else if (!watch.store_error.empty() || !watch.failures_read) {
    const std::string why = watch.store_error.empty() ? "has not answered for " + since(watch.last_answer)
                                                      : "no longer answers (" + watch.store_error + ")";
    if (s.launch.agent_store) {
      cause = "the rendezvous store of torchrun's agent at " + s.rendezvous + " " + why +
              ": is torchrun gone, or the network to it cut?";
    } else if (me == 0) {
      cause = "the rendezvous store this rank hosts " + why;
    } else if (watch.store_error.empty()) {
      cause = s.member(0) + " is unreachable: the rendezvous store it hosts at " + s.rendezvous + " " + why +
              " (rank 0 stopped, or the network to it was cut)";
    } else {
      cause = s.member(0) + " is gone: the rendezvous store it hosted at " + s.rendezvous + " " + why;
    }
  } else if (const auto ranks = silent(now); ranks.size() == 1) {
    cause = s.member(ranks[0]) + " is gone: its heartbeat stopped (none for " + since(watch.changed[ranks[0]]) + ")";
  } else if (!ranks.empty()) {
    cause = rank_list(ranks) + " of " + std::to_string(s.launch.world_size) +
            " are gone: their heartbeats stopped (none for " + since(watch.changed[ranks[0]]) + " or more)";
  } else {
    cause = "every rank's heartbeat is still beating, so no process died: a rank is stuck or the network failed";
  }
  const std::string backend_name = s.backend == "nccl" ? "NCCL" : "Gloo";
  return cause + "; rank " + std::to_string(me) + " stops: " + what + " failed. " + backend_name + " said: " + error;
}

} // namespace dkit
