#pragma once

#include <cstdint>

namespace dkit {

/// How many times, in this process, dkit has read a device value on the host: every such read waits for the
/// device to finish its queued work, which is what a training loop must avoid between log flushes. Every place in
/// dkit that does it (MetricBuffer::flush(), a meter's value(), the trainer's own reads) calls note_host_sync().
/// It is counted whatever the device, the CPU included, so that a test on the CPU proves the same count as on a
/// GPU. Thread-safe.
int64_t host_sync_count();

/// Counts one host read of device values in host_sync_count(): for code outside dkit that reads device values
/// (a benchmark, a meter of its own) and wants them in the same tally.
void note_host_sync();

} // namespace dkit
