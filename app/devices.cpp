#include "commands.h"
#include "usage.h"

#include <dkit/device/report.h>
#include <dkit/train/optim.h>

#include <cxxopts.hpp>

#include <iostream>

namespace dkit::app {

int run_devices(Args args) {
  cxxopts::Options options(args.program, "Report the devices this process can use: GPUs with their memory, the "
                                         "LibTorch, CUDA and cuDNN versions, CPU threads, the BLAS in use, the "
                                         "kernels of dkit's fused optimizers, and why CUDA is not available when "
                                         "it is not.");
  options.add_options()("json", "print the report as JSON")("h,help", "show this help");
  const auto result = parse_arguments(options, args);
  if (result.count("help") != 0) {
    std::cout << options.help();
    return 0;
  }
  DeviceReport report = device_report();
  add_to_report(fused_kernel_report(), report);
  std::cout << (result["json"].as<bool>() ? report_to_json(report) : format_report(report));
  return 0;
}

} // namespace dkit::app
