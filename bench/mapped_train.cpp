// Trains an MLP for one epoch on a data set of .npy files, memory-mapped or read into memory, and prints its
// samples/s and the process's peak anonymous memory (RssAnon, sampled at every metrics flush): what
// bench/mapped_memory.sh measures inside a memory cgroup smaller than the file.
//
//   dkit_mapped_train mapped|memory X.npy Y.npy [BATCH] [SHUFFLE_BLOCK] [SECONDS]
//   dkit_mapped_train read|read-in-order X.npy Y.npy [BATCH] [SHUFFLE_BLOCK] [SECONDS]
//
// X.npy holds uint8 or uint16 inputs [N, F], Y.npy int64 labels [N] (scripts/make_npy_dataset.py writes both);
// `memory` holds uint16 inputs as int32, as the Loader widens them. `read` and
// `read-in-order` train nothing: they time a Loader's pass over the mapped file, shuffled (by blocks of
// SHUFFLE_BLOCK samples when above 0) or in file order, and print the rate they read inputs at, to set beside `dd`'s
// on the same file with a cold page cache. SHUFFLE_BLOCK also shuffles `mapped` training by blocks. SECONDS (0: no
// limit) ends a run early, for passes that random reads from a disk make too slow to finish.
#include <dkit/dkit.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

namespace {

// The RssAnon line of /proc/self/status, in bytes.
int64_t rss_anon() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssAnon:", 0) == 0) {
      return std::stoll(line.substr(8)) * 1024;
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) try {
  DKIT_CHECK(argc >= 4 && argc <= 7, "usage: dkit_mapped_train mapped|memory|read|read-in-order X.npy Y.npy [BATCH] "
             "[SHUFFLE_BLOCK] [SECONDS]");
  const std::string how = argv[1];
  DKIT_CHECK(how == "mapped" || how == "memory" || how == "read" || how == "read-in-order",
             "dkit_mapped_train: mapped, memory, read or read-in-order, got '", how, "'");
  const int64_t batch = argc >= 5 ? std::stoll(argv[4]) : 256;
  const int64_t shuffle_block = argc >= 6 ? std::stoll(argv[5]) : 0;
  const double limit = argc >= 7 ? std::stod(argv[6]) : 0.0;
  torch::manual_seed(0);
  int64_t peak = rss_anon();
  dkit::Dataset data = dkit::map_npy_dataset(argv[2], argv[3]);
  if (how == "read" || how == "read-in-order") {
    dkit::Loader loader(data, dkit::cpu(),
                        dkit::LoaderOptions(batch)
                            .shuffle(how == "read")
                            .shuffle_block(shuffle_block)
                            .placement(dkit::Placement::kPinned));
    const auto start = std::chrono::steady_clock::now();
    loader.start_epoch(0);
    int64_t bytes = 0;
    int64_t samples = 0;
    while (auto next = loader.next()) {
      bytes += next->features.numel() * next->features.element_size();
      samples += next->size();
      if (limit > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > limit) {
        break;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << how << (shuffle_block > 0 ? " by blocks of " + std::to_string(shuffle_block) : std::string())
              << ": " << bytes / (1024 * 1024) << " MiB of inputs in " << seconds << " s, "
              << static_cast<int64_t>(static_cast<double>(bytes) / seconds / (1024 * 1024)) << " MiB/s, "
              << static_cast<int64_t>(static_cast<double>(samples) / seconds) << " samples/s, peak RssAnon "
              << std::max(peak, rss_anon()) / (1024 * 1024) << " MiB\n";
    return 0;
  }
  if (how == "memory") {
    const auto in_memory = [](const torch::Tensor& array, bool uint16) {
      return uint16 ? dkit::widen_uint16(array, true) : array.clone();
    };
    data.features = in_memory(data.features, data.features_uint16);
    data.labels = in_memory(data.labels, data.labels_uint16);
    data.features_uint16 = false;
    data.labels_uint16 = false;
  }
  peak = std::max(peak, rss_anon());
  const int64_t features = data.features.numel() / std::max<int64_t>(data.size(), 1);
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(features, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, data.num_classes));
  dkit::ModuleTask task(net, dkit::ModuleTaskOptions().optimizer(
                                 dkit::make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.01))));
  const std::string out = (std::filesystem::temp_directory_path() / ("dkit-mapped-" + how)).string();
  std::filesystem::remove_all(out);
  dkit::TrainerOptions options(out);
  options.device("cpu")
      .epochs(1)
      .batch_size(batch)
      .shuffle_block(shuffle_block)
      .max_time(limit)
      .log_every(100)
      .checkpoint_every(0)
      .placement(dkit::Placement::kPinned)
      .features_dtype(torch::kFloat)
      .features_divisor(255)
      .data_checksum(how)
      .on_progress([&](const dkit::ProgressUpdate&) { peak = std::max(peak, rss_anon()); });
  const dkit::TrainSummary summary = dkit::Trainer(options).fit(task, data);
  peak = std::max(peak, rss_anon());
  std::cout << how << ": " << summary.samples << " samples in " << summary.train_seconds << " s, "
            << static_cast<int64_t>(summary.samples_per_second) << " samples/s, peak RssAnon "
            << peak / (1024 * 1024) << " MiB\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "dkit_mapped_train: " << e.what() << "\n";
  return 1;
}
