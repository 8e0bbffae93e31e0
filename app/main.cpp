#include "commands.h"
#include "usage.h"

#include <dkit/config.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>

#include <torch/version.h>

#include <c10/util/Exception.h>
#include <cxxopts.hpp>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

struct Verb {
  const char* name;
  const char* summary;
  int (*run)(dkit::app::Args);
};

const Verb kVerbs[] = {
    {"devices", "report the devices this process can use, and why CUDA is not available", dkit::app::run_devices},
    {"train", "train an MLP from a YAML config, or continue a run from its newest checkpoint", dkit::app::run_train},
    {"inspect", "list the tensors in a PyTorch or dkit checkpoint, with the device each was saved on",
     dkit::app::run_inspect},
    {"export", "write a model as a plain state dict that Python's torch.load reads", dkit::app::run_export},
    {"predict", "print a model's logits for each row of a CSV file", dkit::app::run_predict},
    {"bench", "measure matmuls, logging, transfers and GPUs: median/min/max after warm-up", dkit::app::run_bench},
};

void print_usage(std::ostream& out) {
  out << "usage: dkit [--version] [--help] VERB [OPTIONS]\n\nverbs:\n";
  for (const auto& verb : kVerbs) {
    out << "  " << verb.name << std::string(10 - std::strlen(verb.name), ' ') << verb.summary << "\n";
  }
  out << "\nRun 'dkit VERB --help' for a verb's options.\n";
}

int dispatch(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::cout << "dkit " << DKIT_VERSION << " (LibTorch " << TORCH_VERSION << ", "
              << (DKIT_WITH_CUDA ? "CUDA" : "CPU only") << ")\n";
    return 0;
  }
  for (const auto& verb : kVerbs) {
    if (std::strcmp(argv[1], verb.name) == 0) {
      dkit::app::Args args;
      args.program = std::string("dkit ") + verb.name;
      args.argv.push_back(args.program.data());
      for (int i = 2; i < argc; ++i) {
        args.argv.push_back(argv[i]);
      }
      return verb.run(std::move(args));
    }
  }
  std::vector<std::string> names;
  for (const auto& verb : kVerbs) {
    names.emplace_back(verb.name);
  }
  dkit::app::unknown_name("verb", argv[1], names, "dkit --help");
}

} // namespace

int main(int argc, char** argv) {
  using dkit::printable;
  try {
    return dispatch(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    std::cerr << "dkit: " << printable(e.what()) << " (see --help)\n";
    return 2;
  } catch (const dkit::app::UsageError& e) {
    std::cerr << "dkit: " << printable(e.what()) << "\n";
    return 2;
  } catch (const dkit::Error& e) {
    std::cerr << "dkit: error: " << printable(e.what()) << "\n";
  } catch (const c10::Error& e) {
    std::cerr << "dkit: error: " << printable(e.what_without_backtrace()) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "dkit: error: " << printable(e.what()) << "\n";
  }
  return 1;
}
