#pragma once

#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dkit::test {

/// A child process running a program, its stdout and stderr sent to files.
class Process {
 public:
  /// Starts `argv[0]` with `argv`, writing its output to `output_prefix` + `.out` / `.err`. Its environment is this
  /// process's, with each `NAME=VALUE` of `environment` added or replacing the variable of that name.
  Process(const std::vector<std::string>& argv, const std::string& output_prefix,
          const std::vector<std::string>& environment = {})
      : out_path_(output_prefix + ".out"), err_path_(output_prefix + ".err") {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
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

  /// Waits for the process; its exit status, or 128 + the signal that ended it.
  int wait() {
    if (done_) {
      return status_;
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
    return read(out_path_);
  }

  /// What it wrote to stderr so far.
  std::string err() const {
    return read(err_path_);
  }

 private:
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  pid_t pid_ = -1;
  bool done_ = false;
  int status_ = -1;
  std::string out_path_;
  std::string err_path_;
};

/// Runs a program to its end; its exit status.
inline int run_process(const std::vector<std::string>& argv, const std::string& output_prefix,
                       const std::vector<std::string>& environment = {}) {
  return Process(argv, output_prefix, environment).wait();
}

} // namespace dkit::test
