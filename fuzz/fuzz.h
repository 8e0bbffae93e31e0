#pragma once

#include <dkit/checkpoint/pickle.h>
#include <dkit/checkpoint/torch_file.h>
#include <dkit/core/error.h>

#include <torch/torch.h>

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace dkit::fuzz {

/// Runs `fn` on one fuzzer input. Bad input must end in a dkit::Error, or in a c10::Error that LibTorch raised
/// about the data: those are caught. Anything else is a finding: another exception, a failed
/// TORCH_INTERNAL_ASSERT (an invariant of dkit's, which no input may break), a crash, a sanitizer report, a leak.
template <typename Fn>
int run_one(const uint8_t* data, size_t size, Fn&& fn) {
  try {
    fn(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const Error&) {
  } catch (const c10::Error& e) {
    if (std::strstr(e.what(), "INTERNAL ASSERT FAILED") != nullptr) {
      std::fprintf(stderr, "internal assertion failed on fuzzer input: %s\n", e.what_without_backtrace());
      std::abort();
    }
  }
  return 0;
}

/// The root value of `bytes`: a whole torch.save archive when it starts like a zip (read_torch_bytes()), any other
/// input a `data.pkl` unpickled with storages of zeros. The second form lets the fuzzer change a pickle without
/// having to keep a zip archive around it consistent.
inline PickleValue read_root(std::string_view bytes) {
  if (bytes.substr(0, 4) == std::string_view("PK\x03\x04", 4)) {
    return read_torch_bytes(bytes, "fuzz.pt").root;
  }
  const StorageLoader zeros = [](const std::string& /*key*/, c10::ScalarType dtype, int64_t numel,
                                 const std::string& /*location*/) {
    DKIT_CHECK(numel <= (int64_t{1} << 20), "fuzz.pkl: a storage of ", numel,
               " elements (the fuzzer makes 2^20 at most)");
    return at::zeros({numel}, at::TensorOptions().dtype(dtype)).storage();
  };
  return unpickle(bytes, zeros, "fuzz.pkl");
}

/// Reads every element of every tensor under `value` (of up to 2^20 elements) in dkit's own instrumented code,
/// through its sizes, strides and offset: AddressSanitizer reports a tensor that reaches outside its storage.
inline uint64_t touch_tensors(const PickleValue& value) {
  uint64_t checksum = 0;
  for_each_tensor(value, [&](const std::string& /*path*/, const PickleValue& item) {
    const at::Tensor& tensor = item.to_tensor();
    if (!tensor.device().is_cpu() || tensor.numel() > (int64_t{1} << 20)) {
      return;
    }
    const auto* base = static_cast<const unsigned char*>(tensor.storage().data());
    const size_t element = tensor.element_size();
    const auto sizes = tensor.sizes();
    const auto strides = tensor.strides();
    std::vector<int64_t> index(sizes.size(), 0);
    for (int64_t n = 0; n < tensor.numel(); ++n) {
      int64_t offset = tensor.storage_offset();
      for (size_t d = 0; d < sizes.size(); ++d) {
        offset += index[d] * strides[d];
      }
      unsigned char bytes[16] = {};
      std::memcpy(bytes, base + static_cast<size_t>(offset) * element, element);
      checksum = checksum * 31 + bytes[0] + bytes[element - 1];
      for (size_t d = sizes.size(); d-- > 0;) {
        if (++index[d] < sizes[d]) {
          break;
        }
        index[d] = 0;
      }
    }
  });
  return checksum;
}

} // namespace dkit::fuzz
