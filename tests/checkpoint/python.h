#pragma once

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <sys/wait.h>

namespace dkit::test {

/// Debian's Python, the one with PyTorch (the `python3` first in PATH may not have it).
constexpr const char* kPython = "/usr/bin/python3";

/// Whether kPython can import torch; the interop tests skip when it cannot.
inline bool python_has_torch() {
  static const bool has = std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  return has;
}

/// Whether kPython can import Python's safetensors with its PyTorch support (Debian 13 and later package it as
/// python3-safetensors; Debian 12 does not); the safetensors interop tests skip when it cannot.
inline bool python_has_safetensors() {
  static const bool has =
      std::system((std::string(kPython) + " -c 'import safetensors.torch' >/dev/null 2>&1").c_str()) == 0;
  return has;
}

/// The result of run_python().
struct PythonResult {
  /// The exit status (0 on success).
  int status = -1;
  /// stdout and stderr together.
  std::string output;
};

/// Runs `script` with kPython, passing `args` (already shell-safe paths), and captures its output.
inline PythonResult run_python(const std::string& script_path, const std::string& script, const std::string& args) {
  {
    std::ofstream out(script_path);
    out << script;
  }
  PythonResult result;
  const std::string command = std::string(kPython) + " " + script_path + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    return result;
  }
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.output.append(buffer, n);
  }
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

} // namespace dkit::test

/// Skips the test, saying why, when Debian's Python has no PyTorch.
#define DKIT_SKIP_WITHOUT_PYTHON_TORCH()                                                                  \
  do {                                                                                                    \
    if (!::dkit::test::python_has_torch()) {                                                              \
      GTEST_SKIP() << ::dkit::test::kPython << " cannot import torch (install python3-torch): the test "  \
                      "checks that Python's PyTorch reads dkit's files";                                  \
    }                                                                                                     \
  } while (false)

/// Skips the test, saying why, when Debian's Python cannot import safetensors.
#define DKIT_SKIP_WITHOUT_PYTHON_SAFETENSORS()                                                                  \
  do {                                                                                                          \
    if (!::dkit::test::python_has_safetensors()) {                                                              \
      GTEST_SKIP() << ::dkit::test::kPython << " cannot import safetensors.torch (python3-safetensors, which "  \
                      "Debian 13 and later have and scripts/setup.sh installs there; Debian 12 has none): the " \
                      "test checks that Python's safetensors reads dkit's files";                               \
    }                                                                                                           \
  } while (false)
