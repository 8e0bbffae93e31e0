// Fuzzes the reader of torch.save files: read_torch_bytes() for inputs that start like a zip archive, the
// restricted unpickler alone for any other input. Seeds: tests/fixtures/*.pt and the data.pkl of a few of them.
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dkit::fuzz::run_one(data, size, [](std::string_view bytes) {
    const dkit::PickleValue root = dkit::fuzz::read_root(bytes);
    volatile uint64_t checksum = dkit::fuzz::touch_tensors(root);
    (void)checksum;
  });
}
