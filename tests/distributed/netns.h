#pragma once

#include "../support.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace dkit::test {

/// Two hosts made on this machine: network namespaces `a` and `b` joined by a veth pair, host A at
/// 10.213.N.1/24 and host B at 10.213.N.2/24 (addresses that exist only inside these namespaces; the machine's own
/// interfaces and routes are never touched), each with its loopback up and its own host name (`dkit-a-ID`,
/// `dkit-b-ID`) that resolves in both through the namespace's /etc/hosts. Names are unique per test process and
/// object, so tests can run in parallel. The destructor kills whatever still runs inside and removes both
/// namespaces, whatever happened in the test.
class TwoHosts {
 public:
  /// Makes the hosts; when that is impossible (not root, no `ip netns`), skip_reason() says why.
  TwoHosts() {
    static std::atomic<int> count{0};
    const int n = count++;
    id_ = std::to_string(getpid()) + "x" + std::to_string(n);
    subnet_ = "10.213." + std::to_string(n % 250) + ".";
    if (geteuid() != 0) {
      skip_reason_ = "needs root to make network namespaces (ip netns add), and runs as uid " +
                     std::to_string(geteuid());
      return;
    }
    if (std::string said; !run("ip netns list", &said)) {
      skip_reason_ = "`ip netns` is not available here (iproute2's ip with network namespace support): " + said;
      return;
    }
    remove_orphans();
    made_ = true;
    const std::string script =
        "set -e; ip netns add " + ns('a') + "; ip netns add " + ns('b') + "; ip link add " + dev('a') +
        " netns " + ns('a') + " type veth peer name " + dev('b') + " netns " + ns('b') + "; " + inside('a') +
        " ip addr add " + address('a') + "/24 dev " + dev('a') + "; " + inside('b') + " ip addr add " +
        address('b') + "/24 dev " + dev('b') + "; " + inside('a') + " ip link set lo up; " + inside('b') +
        " ip link set lo up; " + inside('a') + " ip link set " + dev('a') + " up; " + inside('b') +
        " ip link set " + dev('b') + " up";
    for (const char host : {'a', 'b'}) {
      std::filesystem::create_directories("/etc/netns/" + ns(host));
      std::ofstream("/etc/netns/" + ns(host) + "/hosts")
          << "127.0.0.1 localhost\n" << address('a') << " " << name('a') << "\n" << address('b') << " " << name('b')
          << "\n";
    }
    if (std::string said; !run(script, &said)) {
      skip_reason_ = "cannot make two network namespaces joined by a veth pair: " + said;
      if (said.find("--make-rslave") != std::string::npos) {
        skip_reason_ += " (`ip netns exec` remounts /, which a chroot whose / is not a mount point cannot: enter "
                        "such a root in a mount namespace of its own with / bind-mounted on itself, as "
                        "scripts/debian_root.sh --run does)";
      }
    }
  }

  ~TwoHosts() {
    if (!made_) {
      return;
    }
    const std::vector<pid_t> left = processes();
    for (const pid_t pid : left) {
      ::kill(pid, SIGKILL);
    }
    run("ip netns del " + ns('a') + "; ip netns del " + ns('b'));
    for (const char host : {'a', 'b'}) {
      remove_tree("/etc/netns/" + ns(host));
    }
  }

  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  /// Why the hosts could not be made; empty when they were.
  const std::string& skip_reason() const {
    return skip_reason_;
  }

  /// The namespace of host `host` ('a' or 'b').
  std::string ns(char host) const {
    return "dkit-" + id_ + "-" + host;
  }

  /// The host name of host `host`.
  std::string name(char host) const {
    return "dkit-" + std::string(1, host) + "-" + id_;
  }

  /// The address of host `host`.
  std::string address(char host) const {
    return subnet_ + (host == 'a' ? "1" : "2");
  }

  /// The veth end inside host `host` (at most 15 characters, as the kernel wants).
  std::string dev(char host) const {
    return "dk" + id_.substr(0, 11) + host;
  }

  /// `argv` run on host `host`: inside its network namespace, under its own host name. The program replaces each
  /// wrapper (ip netns exec, unshare, sh all exec), so the pid of the Process started with it is the program's.
  std::vector<std::string> on(char host, const std::vector<std::string>& argv) const {
    std::vector<std::string> wrapped{"/usr/sbin/ip", "netns", "exec", ns(host), "/usr/bin/unshare", "--uts", "--",
                                     "/bin/sh", "-c", "echo " + name(host) + " > /proc/sys/kernel/hostname && exec \"$@\"",
                                     "sh"};
    wrapped.insert(wrapped.end(), argv.begin(), argv.end());
    return wrapped;
  }

  /// Cuts the link between the hosts: host A's end of the veth pair goes down, and with it the pair.
  void cut() const {
    EXPECT_TRUE(run(inside('a') + " ip link set " + dev('a') + " down")) << "cannot cut the link";
  }

  /// The processes still running inside either namespace.
  std::vector<pid_t> processes() const {
    std::vector<pid_t> pids;
    for (const char host : {'a', 'b'}) {
      FILE* out = ::popen(("ip netns pids " + ns(host) + " 2>/dev/null").c_str(), "r");
      if (out == nullptr) {
        continue;
      }
      for (int pid = 0; std::fscanf(out, "%d", &pid) == 1;) {
        pids.push_back(pid);
      }
      ::pclose(out);
    }
    return pids;
  }

 private:
  std::string inside(char host) const {
    return "ip netns exec " + ns(host);
  }

  /// Removes the hosts that a test process killed before its destructor ran left behind (namespaces named
  /// `dkit-PIDxN-a`/`-b` whose PID no longer runs), with whatever still runs in them.
  static void remove_orphans() {
    FILE* out = ::popen("ip netns list 2>/dev/null", "r");
    if (out == nullptr) {
      return;
    }
    std::vector<std::string> orphans;
    char line[256];
    while (std::fgets(line, sizeof(line), out) != nullptr) {
      int pid = 0;
      int n = 0;
      char host = 0;
      char name[64] = {};
      if (std::sscanf(line, "%63s", name) == 1 && std::sscanf(name, "dkit-%dx%d-%c", &pid, &n, &host) == 3 &&
          pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
        orphans.emplace_back(name);
      }
    }
    ::pclose(out);
    for (const auto& ns : orphans) {
      run("ip netns pids " + ns + " | xargs -r kill -9; ip netns del " + ns);
      remove_tree("/etc/netns/" + ns);
    }
  }

  /// Runs `script` with sh; whether it succeeded. When `said` is given, it receives the last line the script
  /// wrote (stdout and stderr), or its exit status when it wrote none.
  static bool run(const std::string& script, std::string* said = nullptr) {
    FILE* out = ::popen(("(" + script + ") 2>&1").c_str(), "r");
    if (out == nullptr) {
      if (said != nullptr) {
        *said = "cannot start sh";
      }
      return false;
    }
    std::string last;
    char line[512];
    while (std::fgets(line, sizeof(line), out) != nullptr) {
      std::string text(line);
      while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) {
        text.pop_back();
      }
      if (!text.empty()) {
        last = text;
      }
    }
    const int status = ::pclose(out);
    const bool ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && said != nullptr) {
      *said = !last.empty() ? last : "exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    return ok;
  }

  std::string id_;
  std::string subnet_;
  bool made_ = false;
  std::string skip_reason_;
};

/// Makes `hosts` and skips the current test with the reason when they cannot be made.
#define DKIT_SKIP_WITHOUT_HOSTS(hosts)                                                                             \
  if (!(hosts).skip_reason().empty())                                                                              \
  GTEST_SKIP() << "needs two network namespaces: " << (hosts).skip_reason()

} // namespace dkit::test
