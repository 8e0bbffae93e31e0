#pragma once

#include <dkit/device/device.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace dkit {

/// Where this process stands in a multi-process run: the variables `torchrun` sets for each process it starts,
/// which can also be set by hand. `torchrun --no-python --nproc-per-node=2 dkit train ...` and
/// `RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 dkit train ...` both give one.
struct LaunchEnvironment {
  /// `RANK`: this process's index among all processes, in [0, world_size).
  int64_t rank = 0;
  /// `WORLD_SIZE`: the number of processes in the run, over all nodes.
  int64_t world_size = 1;
  /// `LOCAL_RANK`: this process's index on its node; a GPU run uses `cuda:LOCAL_RANK`.
  int64_t local_rank = 0;
  /// `LOCAL_WORLD_SIZE`: the processes on this node (torchrun's `--nproc-per-node`); `WORLD_SIZE` when unset,
  /// as when every process is started by hand on one machine. The CPU threads are shared among them.
  int64_t local_world_size = 1;
  /// `MASTER_ADDR`: the host name or address of the machine running rank 0, which hosts the rendezvous store.
  std::string master_addr;
  /// `MASTER_PORT`: the TCP port of the rendezvous store, in [1, 65535].
  int64_t master_port = 0;
  /// `TORCHELASTIC_USE_AGENT_STORE=True`: torchrun's agent on the first node already hosts the rendezvous store at
  /// `MASTER_ADDR:MASTER_PORT` (its static rendezvous), so every rank connects to it, rank 0 included; otherwise
  /// rank 0 hosts it, as when the processes are started by hand.
  bool agent_store = false;
  /// `TORCHELASTIC_RESTART_COUNT`: which attempt of a torchrun job this is; the keys of each attempt are kept apart
  /// in the agent's store (as PyTorch's `/worker/attempt_N` prefix).
  int64_t restart_count = 0;
};

/// Reads the launch variables through `lookup` (which returns null for an unset variable). Returns nothing when
/// neither `RANK` nor `WORLD_SIZE` is set: a single-process run. Otherwise `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `MASTER_ADDR` and `MASTER_PORT` must all be set and valid; a missing or bad one is a dkit::Error naming the
/// variable and its value.
std::optional<LaunchEnvironment> parse_launch_environment(const std::function<const char*(const char*)>& lookup);

/// parse_launch_environment() of this process's environment.
std::optional<LaunchEnvironment> launch_environment();

/// The device a process of a multi-process run trains on, from the `device` key: `auto` is `cuda:LOCAL_RANK` when
/// this process sees GPUs and the CPU otherwise, `cuda` is `cuda:LOCAL_RANK`, `cpu` and `cuda:N` are kept. A
/// LOCAL_RANK beyond the GPUs of the node is an error that says how many there are.
Device launch_device(std::string_view device, const LaunchEnvironment& launch);

/// The IP address `host` resolves to (IPv4 preferred), as text. An unresolvable host is a dkit::Error naming
/// `what` (e.g. `MASTER_ADDR`) and the resolver's reason.
std::string resolve_host(const std::string& host, const std::string& what);

/// The address of this machine's interface that packets to `ip` leave from (no packet is sent): the address other
/// processes of the run can reach this one at when they can reach `ip`. `127.0.0.1` for a loopback `ip`.
std::string local_address_towards(const std::string& ip, int64_t port);

} // namespace dkit
