#include <dkit/train/detail/training_data.h>

#include <c10/util/Exception.h>

#include <iomanip>
#include <sstream>

namespace dkit::detail {
namespace {

Dataset load_data(const FullTrainConfig& c) {
  switch (c.data_source) {
    case DataSource::kCsv: return read_csv(c.data_path, CsvOptions().label_column(c.label_column).header(c.csv_header));
    case DataSource::kMnist: return read_mnist(c.data_path, /*train=*/true);
    case DataSource::kSynthetic:
      return make_synthetic(SyntheticOptions(c.synthetic_samples, c.synthetic_features, c.synthetic_classes)
                                .seed(static_cast<uint64_t>(c.seed)));
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled DataSource ", static_cast<int>(c.data_source));
}

} // namespace

TrainingData::TrainingData(const FullTrainConfig& config) {
  DatasetSplit parts;
  {
    Dataset all = load_data(config);
    description = all.description;
    checksum = data_checksum(all);
    num_classes = all.num_classes;
    parts = split(std::move(all), config.val_fraction, static_cast<uint64_t>(config.seed));
  }
  normalization = fit_normalization(parts.train.features, config.scaling);
  normalization.apply_(parts.train.features);
  if (parts.val.size() > 0) {
    normalization.apply_(parts.val.features);
  }
  in_features = parts.train.num_features();
  train = std::move(parts.train);
  val = std::move(parts.val);
}

std::string data_checksum(const Dataset& data) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  auto mix = [&hash](const at::Tensor& tensor) {
    const at::Tensor bytes = tensor.contiguous();
    const auto* p = static_cast<const unsigned char*>(bytes.data_ptr());
    const size_t n = bytes.numel() * bytes.element_size();
    for (size_t i = 0; i < n; ++i) {
      hash = (hash ^ p[i]) * 0x100000001b3ULL;
    }
  };
  mix(data.features);
  mix(data.labels);
  std::ostringstream out;
  out << "fnv1a64:" << std::hex << std::setw(16) << std::setfill('0') << hash;
  return out.str();
}

} // namespace dkit::detail
