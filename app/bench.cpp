#include "commands.h"
#include "usage.h"

#include <dkit/bench/suites.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/device/device.h>

#include <cxxopts.hpp>

#include <iostream>

namespace dkit::app {
namespace {

std::string suites_help() {
  std::string text = "\nSuites:\n";
  for (const auto& suite : bench::suites()) {
    text += "  " + suite.name + std::string(suite.name.size() < 11 ? 11 - suite.name.size() : 1, ' ') +
            suite.summary + "\n";
  }
  text += "  all        every suite this machine supports; the others are listed as skipped, with why\n";
  text += "\nA suite that needs hardware this machine lacks (a GPU, two GPUs) prints why, records it in the\n"
          "outputs and exits 0. With several suites, --csv FILE writes FILE's stem + -SUITE + its extension\n"
          "for each one. No result is a pass or a fail: they are measurements.\n";
  return text;
}

} // namespace

int run_bench(Args args) {
  cxxopts::Options options(args.program, "Measure devices the way the d2l GPU exercises should be measured: "
                                         "warm-up first, then repeats timed with a monotonic clock (CPU) or "
                                         "CUDA events (GPU), reported as median, min and max.");
  options.positional_help("SUITE").custom_help("[OPTIONS]");
  options.add_options()("suite", "the suite to run", cxxopts::value<std::string>());
  options.add_options()("device", "devices to measure, comma-separated (cpu, cuda, cuda:N); default: the CPU and "
                                  "every GPU",
                        cxxopts::value<std::vector<std::string>>(), "D");
  options.add_options()("repeat", "timed samples per case; 0: the suite's default",
                        cxxopts::value<int64_t>()->default_value("0"), "N");
  options.add_options()("sizes", "problem sizes, comma-separated: matrix sides (matmul, logging, multi-gpu), bytes "
                                 "(transfer) or batch sizes (train)",
                        cxxopts::value<std::vector<int64_t>>(), "N,...");
  options.add_options()("steps", "steps per timed run (logging, train); 0: the suite's default (logging: 1000, "
                                 "train: a quarter of a second's worth)",
                        cxxopts::value<int64_t>()->default_value("0"), "N");
  options.add_options()("threads", "LibTorch's CPU threads (dkit::set_cpu_threads) for the whole run; 0: leave "
                                   "LibTorch's default",
                        cxxopts::value<int64_t>()->default_value("0"), "N");
  options.add_options()("python", "Python interpreter with torch for the PyTorch side of train, optimizers and "
                                  "precision; 'none' to leave it out (default: /usr/bin/python3 when it exists, else "
                                  "python3)",
                        cxxopts::value<std::string>(), "PATH");
  options.add_options()("python-script", "the PyTorch side's script (default: mlp_train.py beside this program, "
                                         "else share/dkit/mlp_train.py of its install)",
                        cxxopts::value<std::string>(), "FILE");
  options.add_options()("quick", "smaller default sizes and fewer steps: seconds instead of minutes");
  options.add_options()("json", "also write every result to FILE as JSON", cxxopts::value<std::string>(), "FILE");
  options.add_options()("csv", "also write the table to FILE as CSV (for bench/plot)", cxxopts::value<std::string>(),
                        "FILE");
  options.add_options()("quiet", "no progress lines on stderr");
  options.add_options()("h,help", "show this help");
  options.parse_positional({"suite"});
  const auto result = parse_arguments(options, args);
  if (result.count("help") != 0) {
    std::cout << options.help() << suites_help();
    return 0;
  }
  DKIT_CHECK(result.count("suite") != 0, "which suite? Run '", args.program, " SUITE'; see --help for the suites");
  const std::string name = result["suite"].as<std::string>();
  if (name != "all" && bench::try_find_suite(name) == nullptr) {
    std::vector<std::string> names{"all"};
    for (const auto& suite : bench::suites()) {
      names.push_back(suite.name);
    }
    unknown_name("suite", name, names, args.program + " --help");
  }
  bench::SuiteOptions suite_options;
  if (result.count("device") != 0) {
    std::vector<Device> devices;
    for (const auto& text : result["device"].as<std::vector<std::string>>()) {
      devices.push_back(parse_device(text));
    }
    suite_options.devices(devices);
  }
  const auto repeat = result["repeat"].as<int64_t>();
  const auto steps = result["steps"].as<int64_t>();
  DKIT_CHECK(repeat >= 0, "--repeat must be 1 or more (0 for the suite's default), got ", repeat);
  DKIT_CHECK(steps >= 0, "--steps must be 1 or more (0 for the suite's default), got ", steps);
  suite_options.repeat(repeat).steps(steps);
  const auto threads = result["threads"].as<int64_t>();
  DKIT_CHECK(threads >= 0, "--threads must be 1 or more (0 for LibTorch's default), got ", threads);
  if (threads > 0) {
    set_cpu_threads(threads);
  }
  if (result.count("python") != 0) {
    suite_options.python(result["python"].as<std::string>());
  }
  if (result.count("python-script") != 0) {
    suite_options.python_script(result["python-script"].as<std::string>());
  }
  if (result.count("sizes") != 0) {
    suite_options.sizes(result["sizes"].as<std::vector<int64_t>>());
  }
  suite_options.quick(result.count("quick") != 0);
  if (result.count("quiet") == 0) {
    suite_options.progress([](const std::string& line) { std::cerr << line << std::endl; });
  }

  const std::vector<bench::SuiteResult> results = bench::run_suites(name, suite_options);
  for (size_t i = 0; i < results.size(); ++i) {
    std::cout << (i == 0 ? "" : "\n") << bench::format_result(results[i]);
  }
  std::vector<std::pair<std::string, std::string>> outputs;
  if (result.count("json") != 0) {
    outputs.emplace_back(result["json"].as<std::string>(), bench::results_to_json(results));
  }
  if (result.count("csv") != 0) {
    for (auto& output : bench::csv_outputs(result["csv"].as<std::string>(), results)) {
      outputs.push_back(std::move(output));
    }
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    bench::write_text_file(outputs[i].first, outputs[i].second);
    std::cout << (i == 0 ? "\n" : "") << "wrote " << printable(outputs[i].first) << "\n";
  }
  return 0;
}

} // namespace dkit::app
