#pragma once

#include <dkit/config.h>
#include <dkit/distributed/process_group.h>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

/// Skips the current test when this build of dkit has no c10d backend for the CPU: Gloo's headers were not found
/// when it was configured (some LibTorch wheels, or a build without libgloo-dev), so multi-process training was left
/// out of it. tests/CMakeLists.txt reports the test as skipped.
#define DKIT_SKIP_WITHOUT_GLOO()                                                                                   \
  if (!DKIT_WITH_GLOO)                                                                                             \
  GTEST_SKIP() << "needs c10d's Gloo backend, which this build of dkit lacks (see `dkit devices`)"

namespace dkit::test {

/// A TCP port on 127.0.0.1 that was free a moment ago: the kernel's pick for a socket bound to port 0.
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw std::runtime_error("free_port: cannot bind a socket on 127.0.0.1");
  }
  close(fd);
  return ntohs(address.sin_port);
}

/// Whether something accepts TCP connections on 127.0.0.1:`port` now (a connection is made and closed at once).
inline bool accepts_connections(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool accepted = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  if (fd >= 0) {
    close(fd);
  }
  return accepted;
}

/// A socket listening on 127.0.0.1 on a port of the kernel's choice, closed at scope exit: a port that is busy.
class ListeningSocket {
 public:
  ListeningSocket() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t length = sizeof(address);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || listen(fd_, 1) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      throw std::runtime_error("ListeningSocket: cannot listen on a port");
    }
    port_ = ntohs(address.sin_port);
  }
  ~ListeningSocket() {
    close(fd_);
  }
  ListeningSocket(const ListeningSocket&) = delete;
  ListeningSocket& operator=(const ListeningSocket&) = delete;

  /// The port it listens on.
  int port() const {
    return port_;
  }

 private:
  int fd_;
  int port_ = 0;
};

/// The launch variables of rank `rank` of `world_size` processes on this machine, rendezvous on 127.0.0.1:`port`.
inline LaunchEnvironment loopback_launch(int64_t rank, int64_t world_size, int port) {
  LaunchEnvironment launch;
  launch.rank = rank;
  launch.world_size = world_size;
  launch.local_rank = rank;
  launch.local_world_size = world_size;
  launch.master_addr = "127.0.0.1";
  launch.master_port = port;
  return launch;
}

/// Runs `body(rank, group)` for each launch on its own thread with its own ProcessGroupContext on the CPU: a small
/// multi-process run inside one test. Returns, per launch, the message of what it threw, or "".
inline std::vector<std::string> run_ranks(const std::vector<LaunchEnvironment>& launches,
                                          const std::function<void(int64_t, ProcessGroupContext&)>& body,
                                          const ProcessGroupOptions& options) {
  std::vector<std::string> errors(launches.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < launches.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        ProcessGroupContext group(launches[i], cpu(), options);
        body(launches[i].rank, group);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  return errors;
}

} // namespace dkit::test
