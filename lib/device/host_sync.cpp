#include <dkit/device/host_sync.h>

#include <atomic>

namespace dkit {
namespace {

std::atomic<int64_t> host_syncs{0};

} // namespace

int64_t host_sync_count() {
  return host_syncs.load(std::memory_order_relaxed);
}

void note_host_sync() {
  host_syncs.fetch_add(1, std::memory_order_relaxed);
}

} // namespace dkit
