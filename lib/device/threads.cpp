#include <dkit/device/device.h>

#include <dkit/core/error.h>

#include <ATen/Parallel.h>

#include <limits>

namespace dkit {

void set_cpu_threads(int64_t threads) {
  DKIT_CHECK(threads >= 1 && threads <= std::numeric_limits<int>::max(), "CPU threads must be in [1, 2147483647], got ",
             threads);
  at::set_num_threads(static_cast<int>(threads));
  at::parallel_for(0, threads, 1, [](int64_t, int64_t) { static_cast<void>(at::get_num_threads()); });
}

} // namespace dkit
