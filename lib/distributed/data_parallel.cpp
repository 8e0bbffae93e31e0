#include <dkit/distributed/data_parallel.h>

#include <dkit/core/error.h>

namespace dkit {

void throw_data_parallel_unavailable() {
  throw Error("DataParallel is not available: " + data_parallel_unavailable_reason());
}

} // namespace dkit
