#include <dkit/distributed/launch.h>

#include <dkit/core/error.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace dkit {
namespace {

constexpr const char* kAllVariables = "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT";

std::string required(const std::function<const char*(const char*)>& lookup, const char* name) {
  const char* value = lookup(name);
  DKIT_CHECK(value != nullptr, name, " is not set: a multi-process run needs ", kAllVariables,
             " (torchrun sets them all; set them by hand when starting each process yourself)");
  return value;
}

int64_t integer(const std::string& text, const char* name) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  const bool whole = !text.empty() && end == text.c_str() + text.size() && errno == 0;
  DKIT_CHECK(whole && text.find_first_of(" \t") == std::string::npos, name, "='", text, "' is not an integer");
  return value;
}

} // namespace

std::optional<LaunchEnvironment> parse_launch_environment(const std::function<const char*(const char*)>& lookup) {
  if (lookup("RANK") == nullptr && lookup("WORLD_SIZE") == nullptr) {
    return std::nullopt;
  }
  LaunchEnvironment env;
  env.world_size = integer(required(lookup, "WORLD_SIZE"), "WORLD_SIZE");
  DKIT_CHECK(env.world_size >= 1, "WORLD_SIZE=", env.world_size, " must be at least 1");
  env.rank = integer(required(lookup, "RANK"), "RANK");
  DKIT_CHECK(env.rank >= 0 && env.rank < env.world_size, "RANK=", env.rank, " must be in [0, WORLD_SIZE=",
             env.world_size, ")");
  env.local_rank = integer(required(lookup, "LOCAL_RANK"), "LOCAL_RANK");
  DKIT_CHECK(env.local_rank >= 0 && env.local_rank < env.world_size, "LOCAL_RANK=", env.local_rank,
             " must be in [0, WORLD_SIZE=", env.world_size, ")");
  env.local_world_size = env.world_size;
  if (const char* local_world_size = lookup("LOCAL_WORLD_SIZE")) {
    env.local_world_size = integer(local_world_size, "LOCAL_WORLD_SIZE");
    DKIT_CHECK(env.local_world_size > env.local_rank && env.local_world_size <= env.world_size,
               "LOCAL_WORLD_SIZE=", env.local_world_size, " must be in (LOCAL_RANK=", env.local_rank,
               ", WORLD_SIZE=", env.world_size, "]");
  }
  env.master_addr = required(lookup, "MASTER_ADDR");
  DKIT_CHECK(!env.master_addr.empty(), "MASTER_ADDR is empty: set it to the host name or address of rank 0's machine");
  const std::string port = required(lookup, "MASTER_PORT");
  env.master_port = integer(port, "MASTER_PORT");
  DKIT_CHECK(env.master_port >= 1 && env.master_port <= 65535, "MASTER_PORT=", port,
             " is not a TCP port: it must be in [1, 65535]");
  const char* agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE");
  env.agent_store = agent_store != nullptr && std::string(agent_store) == "True";
  if (env.agent_store) {
    const char* restarts = lookup("TORCHELASTIC_RESTART_COUNT");
    env.restart_count = restarts != nullptr ? integer(restarts, "TORCHELASTIC_RESTART_COUNT") : 0;
  }
  return env;
}

std::optional<LaunchEnvironment> launch_environment() {
  return parse_launch_environment([](const char* name) { return std::getenv(name); });
}

Device launch_device(std::string_view device, const LaunchEnvironment& launch) {
  const int64_t gpus = num_gpus();
  if (device == "cpu" || (device == "auto" && gpus == 0)) {
    return cpu();
  }
  if (device == "auto" || device == "cuda") {
    DKIT_CHECK(gpus > 0, "device '", device, "' is not available: ", available_devices(),
               " (this process sees no GPU)");
    DKIT_CHECK(launch.local_rank < gpus, "LOCAL_RANK=", launch.local_rank, " has no GPU: this process sees ", gpus,
               " (", available_devices(), "); start at most ", gpus,
               " processes on this node (torchrun --nproc-per-node), one per GPU");
    return gpu(launch.local_rank);
  }
  return parse_device(device);
}

std::string resolve_host(const std::string& host, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  DKIT_CHECK(rc == 0 && found != nullptr, what, "='", host, "' cannot be resolved: ",
             rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc));
  const addrinfo* chosen = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      chosen = a;
      break;
    }
  }
  char text[INET6_ADDRSTRLEN] = {};
  const void* address = chosen->ai_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(chosen->ai_addr)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(chosen->ai_addr)->sin6_addr);
  inet_ntop(chosen->ai_family, address, text, sizeof(text));
  freeaddrinfo(found);
  return text;
}

std::string local_address_towards(const std::string& ip, int64_t port) {
  const bool v6 = ip.find(':') != std::string::npos;
  sockaddr_storage remote{};
  socklen_t length = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&remote);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    DKIT_CHECK(inet_pton(AF_INET6, ip.c_str(), &a->sin6_addr) == 1, "'", ip, "' is not an IP address");
    length = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&remote);
    a->sin_family = AF_INET;
    a->sin_port = htons(static_cast<uint16_t>(port));
    DKIT_CHECK(inet_pton(AF_INET, ip.c_str(), &a->sin_addr) == 1, "'", ip, "' is not an IP address");
    length = sizeof(sockaddr_in);
  }
  const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
  DKIT_CHECK(fd >= 0, "cannot open a socket: ", std::strerror(errno));
  sockaddr_storage local{};
  socklen_t local_length = sizeof(local);
  const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&remote), length) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length) == 0;
  const int error = errno;
  close(fd);
  DKIT_CHECK(ok, "no route from this machine to ", ip, ": ", std::strerror(error));
  char text[INET6_ADDRSTRLEN] = {};
  const void* address = v6 ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr)
                           : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr);
  inet_ntop(v6 ? AF_INET6 : AF_INET, address, text, sizeof(text));
  return text;
}

} // namespace dkit
