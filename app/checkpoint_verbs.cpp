#include "commands.h"
#include "console.h"
#include "usage.h"

#include <dkit/checkpoint/safetensors.h>
#include <dkit/checkpoint/state_dict.h>
#include <dkit/checkpoint/torch_file.h>
#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/data/dataset.h>
#include <dkit/device/device.h>
#include <dkit/model/mlp_file.h>

#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>

namespace dkit::app {
namespace {

struct TensorRow {
  std::string name;
  std::string shape;
  std::vector<int64_t> sizes;
  std::string dtype;
  std::string device;
};

std::string format_of(const PickleValue& root, std::string& state_dict_key) {
  if (is_training_checkpoint(root)) {
    state_dict_key = "model_state_dict";
    return "dkit_checkpoint";
  }
  if (try_find_state_dict(root, state_dict_key)) {
    return state_dict_key.empty() ? "state_dict" : "general_checkpoint";
  }
  return "pickle";
}

constexpr const char* kCheckpointHelp =
    "the dkit checkpoint or PyTorch state dict to read, or a run folder: its newest readable checkpoint";

// The file a verb reads: `given` itself, or for a run folder its newest readable checkpoint within `limits`, found
// as `dkit train --resume` finds it and named on standard error.
std::string checkpoint_file(const std::string& given, const ReadLimits& limits) {
  std::error_code ignored;
  if (!std::filesystem::is_directory(given, ignored)) {
    return given;
  }
  const CheckpointFolder folder(given);
  std::optional<FoundCheckpoint> found = folder.load_newest(ReadOptions().limits(limits));
  DKIT_CHECK(found.has_value(), given, ": is a directory with no readable checkpoint in '", folder.path(),
             "'; give a checkpoint file or a run folder");
  warn_skipped_checkpoints(found->skipped);
  std::cerr << "dkit: reading " << printable(found->path) << "\n";
  return found->path;
}

// The limits of ReadLimits, by the names `--limit` takes.
struct LimitSetter {
  const char* name;
  ReadLimits& (ReadLimits::*set)(const int64_t&);
};

constexpr LimitSetter kLimits[] = {
    {"max_file_bytes", &ReadLimits::max_file_bytes},     {"max_record_bytes", &ReadLimits::max_record_bytes},
    {"max_records", &ReadLimits::max_records},           {"max_pickle_bytes", &ReadLimits::max_pickle_bytes},
    {"max_header_bytes", &ReadLimits::max_header_bytes}, {"max_depth", &ReadLimits::max_depth},
    {"max_memo", &ReadLimits::max_memo},                 {"max_values", &ReadLimits::max_values},
};

// The names of kLimits, `a, b, c`.
std::string limit_names() {
  std::string names;
  for (const auto& limit : kLimits) {
    names += (names.empty() ? "" : ", ") + std::string(limit.name);
  }
  return names;
}

// The help of `--limit`.
std::string limit_help() {
  return "tighten a limit on reading the file, NAME=VALUE (repeatable): " + limit_names();
}

// The read limits given as `--limit NAME=VALUE`, the others at their defaults.
ReadLimits read_limits(const cxxopts::ParseResult& result) {
  ReadLimits limits;
  if (result.count("limit") == 0) {
    return limits;
  }
  for (const auto& item : result["limit"].as<std::vector<std::string>>()) {
    const auto eq = item.find('=');
    DKIT_CHECK(eq != std::string::npos, "--limit expects NAME=VALUE, got '", item, "'");
    const std::string name = item.substr(0, eq);
    const std::string text = item.substr(eq + 1);
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    DKIT_CHECK(ec == std::errc() && end == text.data() + text.size() && value >= 1, "--limit ", name, ": '", text,
               "' is not a positive integer");
    const auto* found = std::find_if(std::begin(kLimits), std::end(kLimits),
                                     [&](const LimitSetter& limit) { return name == limit.name; });
    DKIT_CHECK(found != std::end(kLimits), "--limit: unknown limit '", name, "' (limits: ", limit_names(), ")");
    (limits.*(found->set))(value);
  }
  return limits;
}

// The row of `inspect`'s table for one tensor; `device` is the device it was saved on, if the file says.
TensorRow tensor_row(const std::string& name, const at::Tensor& tensor, const std::string& device) {
  std::ostringstream shape;
  shape << tensor.sizes();
  return {name, shape.str(), tensor.sizes().vec(), dtype_name(tensor.scalar_type()), device};
}

// `json` on one line, non-ASCII text as it is; DEL, which JSON allows raw, as \u007f, as the other control
// characters are.
void print_json(const nlohmann::ordered_json& json) {
  std::string text = json.dump(/*indent=*/-1, /*indent_char=*/' ', /*ensure_ascii=*/false,
                               nlohmann::ordered_json::error_handler_t::replace);
  for (size_t at = text.find('\x7f'); at != std::string::npos; at = text.find('\x7f', at)) {
    text.replace(at, 1, "\\u007f");
  }
  std::cout << text << "\n";
}

// `tensors: N`, then a table of name, shape, dtype and, `with_device`, the device each was saved on; the names and
// devices the file gave as printable() shows them.
void print_table(const std::vector<TensorRow>& rows, bool with_device) {
  std::cout << "tensors: " << rows.size() << "\n";
  std::vector<TensorRow> shown = rows;
  size_t name_width = 4;
  size_t shape_width = 5;
  size_t dtype_width = 5;
  for (auto& row : shown) {
    row.name = printable(row.name);
    row.device = printable(row.device);
    name_width = std::max(name_width, row.name.size());
    shape_width = std::max(shape_width, row.shape.size());
    dtype_width = std::max(dtype_width, row.dtype.size());
  }
  const auto pad = [](const std::string& text, size_t width) { return text + std::string(width - text.size() + 2, ' '); };
  const auto last = [&](const std::string& dtype, const std::string& device) {
    return with_device ? pad(dtype, dtype_width) + device : dtype;
  };
  if (!shown.empty()) {
    std::cout << pad("name", name_width) << pad("shape", shape_width) << last("dtype", "device") << "\n";
  }
  for (const auto& row : shown) {
    std::cout << pad(row.name, name_width) << pad(row.shape, shape_width) << last(row.dtype, row.device) << "\n";
  }
}

// What `dkit inspect` prints for a safetensors file: its format and metadata (as one line of JSON), then its
// tensors.
void print_safetensors(const std::string& path, const SafetensorsFile& file, bool json) {
  std::vector<TensorRow> rows;
  for (const auto& item : file.tensors) {
    rows.push_back(tensor_row(item.key(), item.value(), ""));
  }
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  for (const auto& [key, value] : file.metadata) {
    metadata[key] = value;
  }
  if (json) {
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (const auto& row : rows) {
      tensors.push_back({{"name", row.name}, {"shape", row.sizes}, {"dtype", row.dtype}});
    }
    print_json({{"format", "safetensors"},
                {"file", path},
                {"metadata", std::move(metadata)},
                {"tensors", std::move(tensors)}});
    return;
  }
  std::cout << "format: safetensors\n";
  if (!file.metadata.empty()) {
    std::cout << "metadata: ";
    print_json(metadata);
  }
  print_table(rows, /*with_device=*/false);
}

void write_logits(std::ostream& out, const at::Tensor& logits) {
  const at::Tensor cpu = logits.to(torch::kCPU, torch::kFloat).contiguous();
  const float* data = cpu.data_ptr<float>();
  const int64_t columns = cpu.size(1);
  for (int64_t r = 0; r < cpu.size(0); ++r) {
    for (int64_t c = 0; c < columns; ++c) {
      out << (c == 0 ? "" : ",") << format_number(data[r * columns + c]);
    }
    out << '\n';
  }
}

} // namespace

int run_inspect(Args args) {
  cxxopts::Options options(args.program, "List the tensors in a PyTorch, dkit or safetensors checkpoint: the file's "
                                         "format, then each tensor's name, shape, dtype and the device it was saved "
                                         "on (a safetensors file records no device; its metadata is listed "
                                         "instead). Reads torch.save files safely: nothing in them is executed. A "
                                         "FILE ending in .safetensors is read as one, any other as torch.save's; a "
                                         "run folder stands for its newest readable checkpoint.");
  options.positional_help("FILE");
  options.add_options()("file", "the file to inspect, or a run folder: its newest readable checkpoint",
                        cxxopts::value<std::string>())(
      "json", "print JSON: {\"format\": ..., \"tensors\": [{\"name\", \"shape\", \"dtype\", \"device\"}, ...]}; for "
              "safetensors {\"format\": \"safetensors\", \"metadata\": {...}, \"tensors\": [{\"name\", \"shape\", "
              "\"dtype\"}, ...]}")(
      "limit", limit_help(), cxxopts::value<std::vector<std::string>>())("h,help", "show this help");
  options.parse_positional({"file"});
  const auto result = parse_arguments(options, args);
  if (result.count("help") != 0) {
    std::cout << options.help();
    return 0;
  }
  DKIT_CHECK(result.count("file") != 0, "inspect needs a FILE (see --help)");
  const ReadOptions read_options = ReadOptions().limits(read_limits(result));
  const std::string path = checkpoint_file(result["file"].as<std::string>(), read_options.limits());
  const bool json = result["json"].as<bool>();
  if (is_safetensors_path(path)) {
    print_safetensors(path, read_safetensors(path, read_options), json);
    return 0;
  }
  const TorchFile file = read_torch_file(path, read_options);
  std::string state_dict_key;
  const std::string format = format_of(file.root, state_dict_key);
  std::vector<TensorRow> rows;
  for_each_tensor(file.root, [&](const std::string& name, const PickleValue& value) {
    rows.push_back(tensor_row(name, value.to_tensor(), value.saved_on()));
  });

  if (json) {
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (const auto& row : rows) {
      tensors.push_back({{"name", row.name}, {"shape", row.sizes}, {"dtype", row.dtype}, {"device", row.device}});
    }
    print_json({{"format", format},
                {"file", path},
                {"archive", file.archive},
                {"version", file.version},
                {"tensors", std::move(tensors)}});
    return 0;
  }
  std::cout << "format: " << format;
  if (!state_dict_key.empty()) {
    std::cout << " (state dict under '" << printable(state_dict_key) << "')";
  }
  std::cout << "; torch.save zip archive '" << printable(file.archive) << "', version " << file.version << "\n";
  print_table(rows, /*with_device=*/true);
  return 0;
}

int run_export(Args args) {
  cxxopts::Options options(args.program,
                           "Write a model for Python: a file that torch.load reads as a plain dict of tensors named "
                           "as nn.Sequential names them (0.weight, 0.bias, 2.weight, ...), plus input_mean and "
                           "input_std when training normalised its inputs; a safetensors file of the same tensors "
                           "when --output ends in .safetensors. Reads a dkit checkpoint or a PyTorch MLP state dict "
                           "(torch.save or safetensors).");
  options.add_options()("checkpoint", kCheckpointHelp, cxxopts::value<std::string>())(
      "output", "the file to write: FILE.safetensors for safetensors, any other name for torch.save's format",
      cxxopts::value<std::string>())(
      "limit", limit_help(), cxxopts::value<std::vector<std::string>>())("h,help", "show this help");
  const auto result = parse_arguments(options, args);
  if (result.count("help") != 0) {
    std::cout << options.help();
    return 0;
  }
  DKIT_CHECK(result.count("checkpoint") != 0, "export needs --checkpoint FILE (see --help)");
  DKIT_CHECK(result.count("output") != 0, "export needs --output FILE (see --help)");
  const std::string output = result["output"].as<std::string>();
  const ReadLimits limits = read_limits(result);
  const LoadedMlp model = load_mlp(checkpoint_file(result["checkpoint"].as<std::string>(), limits),
                                   LoadMlpOptions().limits(limits));
  export_mlp(output, model);
  std::cout << "wrote " << printable(output) << ": " << model.net->named_parameters().size() << " parameter tensors"
            << (model.input_mean.defined() ? " and input_mean, input_std" : "") << "\n";
  return 0;
}

int run_predict(Args args) {
  cxxopts::Options options(args.program,
                           "Print the logits of a model for each row of a CSV file (numbers only, one sample per "
                           "row, after a header row with --header), one row of logits per input row, in full float "
                           "precision. Reads a dkit checkpoint, applying the input normalisation it stored, or a "
                           "PyTorch MLP state dict, in a torch.save file or a safetensors file (a name ending in "
                           ".safetensors), applying input_mean and input_std when it has them.");
  options.add_options()("checkpoint", kCheckpointHelp, cxxopts::value<std::string>())(
      "input", "the CSV file of samples", cxxopts::value<std::string>())(
      "header", "the CSV file's first line names the columns (it is skipped)")(
      "output", "write the logits to this CSV file instead of stdout", cxxopts::value<std::string>())(
      "device", "auto, cpu, cuda or cuda:N", cxxopts::value<std::string>()->default_value("auto"))(
      "activation", list_names(kActivationNames) + ", for state dicts, which do not record it (a dkit checkpoint does)",
      cxxopts::value<std::string>()->default_value(to_string(Activation::kReLU)))(
      "limit", limit_help(), cxxopts::value<std::vector<std::string>>())("h,help", "show this help");
  const auto result = parse_arguments(options, args);
  if (result.count("help") != 0) {
    std::cout << options.help();
    return 0;
  }
  DKIT_CHECK(result.count("checkpoint") != 0, "predict needs --checkpoint FILE (see --help)");
  DKIT_CHECK(result.count("input") != 0, "predict needs --input ROWS.csv (see --help)");
  const Device device = parse_device(result["device"].as<std::string>());
  const ReadLimits limits = read_limits(result);
  const LoadedMlp model =
      load_mlp(checkpoint_file(result["checkpoint"].as<std::string>(), limits),
               LoadMlpOptions()
                   .device(device)
                   .activation(parse_activation(result["activation"].as<std::string>()))
                   .limits(limits));
  const std::string input = result["input"].as<std::string>();
  const at::Tensor inputs =
      read_csv(input, CsvOptions().has_labels(false).header(result.count("header") != 0)).features;
  DKIT_CHECK(inputs.size(1) == model.net->options.in_features(), input, ": ", inputs.size(1),
             " values per row, but the model takes ", model.net->options.in_features(), " inputs");
  const at::Tensor logits = model.predict(inputs);
  if (result.count("output") == 0) {
    write_logits(std::cout, logits);
    return 0;
  }
  const std::string output = result["output"].as<std::string>();
  std::ofstream out(output);
  DKIT_CHECK(out, "cannot write ", output, ": ", std::strerror(errno));
  write_logits(out, logits);
  out.close();
  DKIT_CHECK(out, "cannot write ", output, ": ", std::strerror(errno));
  return 0;
}

} // namespace dkit::app
