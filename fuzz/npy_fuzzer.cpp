// Fuzzes parse_npy_header(), which map_npy() trusts before it maps a file: the input is the whole file. What it
// returns must fit in the file: the data starts after the header and ends within the file's size. Seeds:
// tests/fixtures/npy/*.npy.
#include "fuzz.h"

#include <dkit/data/mapped.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dkit::fuzz::run_one(data, size, [](std::string_view bytes) {
    const auto file_size = static_cast<int64_t>(bytes.size());
    const dkit::NpyHeader header = dkit::parse_npy_header(bytes, file_size, "fuzz.npy");
    if (header.data_offset < 10 || header.data_bytes < 0 || header.data_offset + header.data_bytes > file_size) {
      std::fprintf(stderr, "parse_npy_header() returned data outside the file\n");
      std::abort();
    }
  });
}
