// Fuzzes the reader of safetensors files: read_safetensors_bytes() on the whole input, then every tensor it returns
// read element by element in instrumented code. A file that reads must read the same once written back: the same
// names, dtypes, shapes, bytes and metadata (write_safetensors() to a file in /dev/shm, where its fsync costs
// nothing, then read_safetensors()). Seeds: tests/fixtures/*.safetensors and fuzz/corpus/safetensors.
#include "fuzz.h"

#include <dkit/checkpoint/safetensors.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

namespace {

// A file the round trip writes to and reads from; one per fuzzing process.
const std::string& scratch_path() {
  static const std::string path =
      ((std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                   : std::filesystem::temp_directory_path()) /
       ("dkit-fuzz-" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  return path;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dkit::fuzz::run_one(data, size, [](std::string_view bytes) {
    const dkit::SafetensorsFile file = dkit::read_safetensors_bytes(bytes, "fuzz.safetensors");
    dkit::PickleValue root = dkit::PickleValue::dict();
    for (const auto& item : file.tensors) {
      root.entries().emplace_back(item.key(), item.value());
    }
    volatile uint64_t checksum = dkit::fuzz::touch_tensors(root);
    (void)checksum;

    dkit::write_safetensors(scratch_path(), file.tensors, file.metadata);
    const dkit::SafetensorsFile back = dkit::read_safetensors(scratch_path());
    std::filesystem::remove(scratch_path());
    TORCH_INTERNAL_ASSERT(back.metadata == file.metadata, "metadata changed in a write and read");
    TORCH_INTERNAL_ASSERT(back.tensors.keys() == file.tensors.keys(), "names changed in a write and read");
    for (const auto& item : file.tensors) {
      const at::Tensor& again = back.tensors[item.key()];
      const size_t nbytes = item.value().nbytes();
      TORCH_INTERNAL_ASSERT(again.scalar_type() == item.value().scalar_type() &&
                                again.sizes() == item.value().sizes() &&
                                (nbytes == 0 || std::memcmp(again.data_ptr(), item.value().data_ptr(), nbytes) == 0),
                            "tensor '", item.key(), "' changed in a write and read");
    }
  });
}
