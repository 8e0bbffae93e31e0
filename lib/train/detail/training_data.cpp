#include <dkit/train/detail/training_data.h>

#include <dkit/checkpoint/safetensors.h>
#include <dkit/core/error.h>
#include <dkit/data/mapped.h>

#include <c10/util/Exception.h>
#include <sys/stat.h>

#include <filesystem>
#include <iomanip>
#include <sstream>

namespace dkit::detail {
namespace {

Dataset map_npy_files(const FullTrainConfig& c) {
  if (std::filesystem::is_directory(c.data_path)) {
    DKIT_CHECK(c.data_targets.empty(), "config key 'data.targets' (", c.data_targets, ") cannot be used when "
               "data.path is a folder (", c.data_path, "): the folder's y.npy holds the labels");
    return map_npy_dataset((std::filesystem::path(c.data_path) / "x.npy").string(),
                           (std::filesystem::path(c.data_path) / "y.npy").string());
  }
  DKIT_CHECK(std::filesystem::exists(c.data_path), "config key 'data.path' names ", c.data_path,
             ", which does not exist: give the .npy file of inputs or a folder of x.npy and y.npy");
  DKIT_CHECK(!c.data_targets.empty(), "config key 'data.targets' is required when data.path is a .npy file (",
             c.data_path, "): name the .npy file of labels, or make data.path a folder of x.npy and y.npy");
  return map_npy_dataset(c.data_path, c.data_targets);
}

Dataset map_safetensors_file(const std::string& path) {
  SafetensorsFile file = map_safetensors(path);
  const auto tensor = [&](const char* name, const char* what) {
    const at::Tensor* found = file.tensors.find(name);
    if (found == nullptr) {
      std::string names;
      for (const auto& key : file.tensors.keys()) {
        names += (names.empty() ? "'" : ", '") + key + "'";
      }
      throw Error(concat(path, " has no tensor '", name, "' (the ", what, "); it holds ",
                         names.empty() ? "none" : names));
    }
    return *found;
  };
  at::Tensor features = tensor("x", "inputs");
  at::Tensor labels = tensor("y", "labels");
  struct stat info {};
  DKIT_CHECK(::stat(path.c_str(), &info) == 0, "cannot read ", path);
  return mapped_dataset(std::move(features), std::move(labels), path + ": tensor 'x'", path + ": tensor 'y'",
                        mapped_size_check(path, static_cast<int64_t>(info.st_size)));
}

// The data as the MLP reads it: inputs [N, F] (a view of images [N, ...]) and one class index per sample.
Dataset for_mlp(Dataset data, const std::string& path) {
  DKIT_CHECK(!data.labels.defined() || data.labels.dim() == 1 ||
                 (data.labels.dim() == 2 && data.labels.size(1) == 1),
             path, ": the labels have shape ", data.labels.sizes(), "; dkit train needs one class index per sample");
  if (data.labels.defined() && data.labels.dim() == 2) {
    data.labels = data.labels.view({-1});
  }
  if (data.features.dim() != 2) {
    data.features = data.features.reshape({data.features.size(0), -1});
  }
  return data;
}

Dataset load_data(const FullTrainConfig& c) {
  switch (c.data_source) {
    case DataSource::kNpy: return for_mlp(map_npy_files(c), c.data_path);
    case DataSource::kSafetensors: return for_mlp(map_safetensors_file(c.data_path), c.data_path);
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
    scale_batches = all.mapped;
    parts = split(std::move(all), config.val_fraction, static_cast<uint64_t>(config.seed));
  }
  normalization = fit_normalization(parts.train, config.scaling);
  if (!scale_batches) {
    normalization.apply_(parts.train.features);
    if (parts.val.size() > 0) {
      normalization.apply_(parts.val.features);
    }
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
