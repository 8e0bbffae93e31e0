#pragma once

#include "support.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <poll.h>

#include <cerrno>

#include <chrono>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dkit::test {

/// Where a child's stderr goes.
enum class ErrTo {
  /// A file, `output_prefix` + `.err`.
  kFile,
  /// A pipe of one page (4 KiB), the smallest the kernel allows: once that much is unread the child blocks in its
  /// next write, so it never runs more than a page of output ahead of what the test has read with next_err_line().
  /// Tests decide when to signal a child from the lines it printed, never from sleeps.
  kPipe,
};

/// A child process running a program, its stdout sent to a file and its stderr to a file or a pipe.
class Process {
 public:
  /// Starts `argv[0]` with `argv`, writing its output to `output_prefix` + `.out` / `.err`. Its environment is this
  /// process's, with each `NAME=VALUE` of `environment` added or replacing the variable of that name.
  Process(const std::vector<std::string>& argv, const std::string& output_prefix,
          const std::vector<std::string>& environment = {}, ErrTo err_to = ErrTo::kFile)
      : out_path_(output_prefix + ".out"), err_path_(output_prefix + ".err") {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int pipe_ends[2] = {-1, -1};
    if (err_to == ErrTo::kPipe) {
      if (::pipe2(pipe_ends, O_CLOEXEC) != 0) {
        ADD_FAILURE() << "cannot make a pipe for " << argv[0] << "'s stderr";
        return;
      }
      ::fcntl(pipe_ends[0], F_SETPIPE_SZ, 4096);
      posix_spawn_file_actions_adddup2(&actions, pipe_ends[1], STDERR_FILENO);
      err_pipe_ = pipe_ends[0];
    } else {
      posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
    }
    std::vector<char*> args;
    for (const auto& arg : argv) {
      args.push_back(const_cast<char*>(arg.c_str()));
    }
    args.push_back(nullptr);
    std::vector<std::string> variables = environment;
    for (char** variable = environ; *variable != nullptr; ++variable) {
      const std::string entry = *variable;
      const std::string name = entry.substr(0, entry.find('=') + 1);
      bool replaced = false;
      for (const auto& given : environment) {
        replaced = replaced || given.compare(0, name.size(), name) == 0;
      }
      if (!replaced) {
        variables.push_back(entry);
      }
    }
    std::vector<char*> envp;
    for (auto& variable : variables) {
      envp.push_back(variable.data());
    }
    envp.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (pipe_ends[1] >= 0) {
      ::close(pipe_ends[1]);
    }
    if (rc != 0) {
      ADD_FAILURE() << "cannot start " << argv[0];
      pid_ = -1;
    }
  }

  ~Process() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
    if (err_pipe_ >= 0) {
      ::close(err_pipe_);
    }
  }

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  /// The process id.
  pid_t pid() const {
    return pid_;
  }

  /// Sends `signal`.
  void signal(int signal) {
    ::kill(pid_, signal);
  }

  /// Stops the process with SIGSTOP and returns once it has stopped.
  void stop() {
    ::kill(pid_, SIGSTOP);
    int raw = 0;
    ::waitpid(pid_, &raw, WUNTRACED);
  }

  /// Lets a stopped process go on.
  void resume() {
    ::kill(pid_, SIGCONT);
  }

  /// With ErrTo::kPipe: the next line the process writes to stderr (without its newline), waiting for it; nothing
  /// once the process has closed its stderr (it ended).
  std::optional<std::string> next_err_line() {
    for (;;) {
      const size_t end = err_text_.find('\n', err_read_);
      if (end != std::string::npos) {
        std::string line = err_text_.substr(err_read_, end - err_read_);
        err_read_ = end + 1;
        return line;
      }
      if (!read_err_pipe()) {
        return std::nullopt;
      }
    }
  }

  /// Waits for the process to end, at most `limit`, reading its stderr pipe meanwhile; whether it ended. Only a guard
  /// against a hang: give a limit far above any time the process should take, so that no verdict depends on the
  /// machine's speed or load.
  bool wait_for(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!finished()) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return false;
      }
      pollfd readable{err_pipe_, POLLIN, 0};
      if (err_pipe_ >= 0 && !err_closed_ && ::poll(&readable, 1, 20) > 0) {
        read_err_pipe();
      } else if (err_pipe_ < 0 || err_closed_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    wait();
    return true;
  }

  /// Waits for the process (reading what is left in its stderr pipe first); its exit status, or 128 + the signal
  /// that ended it.
  int wait() {
    if (done_) {
      return status_;
    }
    while (read_err_pipe()) {
    }
    int raw = 0;
    ::waitpid(pid_, &raw, 0);
    done_ = true;
    status_ = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    return status_;
  }

  /// Whether the process has ended, without waiting.
  bool finished() {
    if (done_) {
      return true;
    }
    int raw = 0;
    if (::waitpid(pid_, &raw, WNOHANG) == pid_) {
      done_ = true;
      status_ = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    }
    return done_;
  }

  /// What it wrote to stdout so far.
  std::string out() const {
    return read_file(out_path_);
  }

  /// What it wrote to stderr so far (with ErrTo::kPipe: what the test has read of it).
  std::string err() const {
    return err_pipe_ >= 0 ? err_text_ : read_file(err_path_);
  }

 private:
  // Reads what the stderr pipe holds, up to 256 bytes at a time, into err_text_; false at its end (or without one).
  bool read_err_pipe() {
    if (err_pipe_ < 0 || err_closed_) {
      return false;
    }
    char buffer[256];
    ssize_t n = 0;
    do {
      n = ::read(err_pipe_, buffer, sizeof(buffer));
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      err_closed_ = true;
      return false;
    }
    err_text_.append(buffer, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  bool done_ = false;
  int status_ = -1;
  std::string out_path_;
  std::string err_path_;
  int err_pipe_ = -1;
  bool err_closed_ = false;
  std::string err_text_;
  size_t err_read_ = 0;
};

/// The step and the total of a `dkit train` console line `step N/TOTAL ...`.
inline std::optional<std::pair<int64_t, int64_t>> logged_step(const std::string& line) {
  static const std::regex pattern("^step ([0-9]+)/([0-9]+) ");
  std::smatch match;
  if (!std::regex_search(line, match, pattern)) {
    return std::nullopt;
  }
  return std::make_pair(std::stoll(match[1].str()), std::stoll(match[2].str()));
}

/// Reads a `dkit train` process's stderr (ErrTo::kPipe) until it reports step `step` or more; whether it did before
/// it ended.
inline bool read_until_step(Process& process, int64_t step) {
  while (const auto line = process.next_err_line()) {
    if (const auto progress = logged_step(*line); progress && progress->first >= step) {
      return true;
    }
  }
  return false;
}

/// Runs a program to its end; its exit status.
inline int run_process(const std::vector<std::string>& argv, const std::string& output_prefix,
                       const std::vector<std::string>& environment = {}) {
  return Process(argv, output_prefix, environment).wait();
}

} // namespace dkit::test
