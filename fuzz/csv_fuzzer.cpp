// Fuzzes the CSV reader behind read_csv(). The first byte picks the options (labels or not, a header row or not,
// which label column), the rest is the file. What it returns must be consistent: at least one sample, finite
// features, one label per sample, labels in [0, num_classes). Seeds: tests/fixtures/*.csv and the head of
// data/digits.csv.
#include "fuzz.h"

#include <dkit/data/dataset.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dkit::fuzz::run_one(data, size, [](std::string_view bytes) {
    if (bytes.empty()) {
      return;
    }
    const auto pick = static_cast<unsigned char>(bytes[0]);
    const auto options = dkit::CsvOptions()
                             .has_labels((pick & 0x80) == 0)
                             .header((pick & 0x40) != 0)
                             .label_column((pick & 0x07) - 4);
    const dkit::Dataset set = dkit::parse_csv(bytes.substr(1), "fuzz.csv", options);
    const bool consistent =
        set.features.dim() == 2 && set.size() > 0 && set.features.size(1) >= 1 &&
        torch::isfinite(set.features).all().item<bool>() &&
        (!set.has_labels() || (set.labels.dim() == 1 && set.labels.size(0) == set.features.size(0) &&
                               set.labels.min().item<int64_t>() >= 0 &&
                               set.labels.max().item<int64_t>() < set.num_classes));
    if (!consistent) {
      std::fprintf(stderr, "parse_csv() returned an inconsistent data set: %s\n", set.description.c_str());
      std::abort();
    }
  });
}
