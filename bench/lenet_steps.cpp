// Runs one of the `lenet` suite's loops for a number of steps and nothing else, so that callgrind can count the
// instructions of its steps (bench/lenet_callgrind.sh subtracts a run of N steps from one of 2N):
//
//   dkit_lenet_steps loop|trainer STEPS BATCH [DATA]
//
// DATA is a Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist) or `synthetic`.
#include <dkit/bench/lenet_common.h>
#include <dkit/core/error.h>
#include <dkit/device/device.h>

#include <filesystem>
#include <iostream>
#include <string>

int main(int argc, char** argv) try {
  DKIT_CHECK(argc == 4 || argc == 5, "usage: dkit_lenet_steps loop|trainer STEPS BATCH [DATA]");
  const std::string variant = argv[1];
  const int64_t steps = std::stoll(argv[2]);
  const int64_t batch = std::stoll(argv[3]);
  dkit::set_cpu_threads(1);
  torch::manual_seed(0);
  const dkit::Dataset data =
      dkit::bench::detail::lenet_data(argc == 5 ? argv[4] : dkit::bench::detail::kFashionMnist);
  if (variant == "loop") {
    dkit::bench::detail::LenetLoop loop(dkit::bench::detail::lenet(), data, batch);
    for (int64_t i = 0; i < steps; ++i) {
      loop.step();
    }
  } else {
    DKIT_CHECK(variant == "trainer", "dkit_lenet_steps: unknown variant '", variant, "': loop or trainer");
    const std::string folder = (std::filesystem::temp_directory_path() / "dkit-lenet-steps").string();
    dkit::bench::detail::trainer_seconds(dkit::bench::detail::lenet(), data, batch, steps, folder);
  }
  return 0;
} catch (const std::exception& e) {
  std::cerr << "dkit_lenet_steps: " << e.what() << "\n";
  return 1;
}
