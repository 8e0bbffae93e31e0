// Fuzzes the YAML config reader: parse_config() with --set overrides, the checks of FullTrainConfig, and the round
// trip through to_yaml(), which must read back to the same YAML. The input is the YAML text, then optionally a
// NUL byte and one KEY=VALUE override per line. Seeds: configs/*.yaml, tests/fixtures/*.yaml, a resolved config.
#include "fuzz.h"

#include <dkit/train/config.h>

#include <sstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dkit::fuzz::run_one(data, size, [](std::string_view bytes) {
    const size_t split = bytes.find('\0');
    const std::string yaml(bytes.substr(0, split));
    std::vector<std::string> overrides;
    if (split != std::string_view::npos) {
      std::istringstream lines(std::string(bytes.substr(split + 1)));
      for (std::string line; std::getline(lines, line);) {
        overrides.push_back(line);
      }
    }
    const dkit::FullTrainConfig config(dkit::parse_config(yaml, "fuzz.yaml", "/fuzz", overrides));
    const std::string text = dkit::to_yaml(config);
    const std::string again = dkit::to_yaml(dkit::FullTrainConfig(dkit::parse_config(text, "resolved.yaml", "/")));
    if (again != text) {
      std::fprintf(stderr, "to_yaml() does not read back the same:\n%s\n---\n%s\n", text.c_str(), again.c_str());
      std::abort();
    }
  });
}
