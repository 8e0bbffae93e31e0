#include <dkit/data/loader.h>

#include <dkit/config.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if DKIT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dkit {
namespace {

using detail::concat;

void gather_rows(const at::Tensor& source, const int64_t* indices, int64_t rows, void* target, bool uint16) {
  const int64_t n = source.size(0);
  if (uint16) {
    const int64_t row_size = n > 0 ? source.numel() / n : 0;
    const auto* from = static_cast<const uint16_t*>(source.data_ptr());
    auto* to = static_cast<int32_t*>(target);
    for (int64_t i = 0; i < rows; ++i) {
      const uint16_t* row = from + indices[i] * row_size;
      std::copy(row, row + row_size, to + i * row_size);
    }
    return;
  }
  const auto row_bytes = static_cast<size_t>(n > 0 ? source.numel() / n : 0) * source.element_size();
  const auto* from = static_cast<const char*>(source.data_ptr());
  auto* to = static_cast<char*>(target);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(to + static_cast<size_t>(i) * row_bytes, from + static_cast<size_t>(indices[i]) * row_bytes,
                row_bytes);
  }
}

// Asks the kernel to read the rows `rows` (sorted) of the mapped `source` ahead, as runs of neighbouring rows: each
// run is one long read, where faulting its pages in one at a time would read around each of them.
void read_rows_ahead(const at::Tensor& source, const std::vector<int64_t>& rows) {
  constexpr uintptr_t kGap = 128 * 1024;
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const int64_t n = source.size(0);
  const auto row_bytes = static_cast<uintptr_t>(n > 0 ? source.numel() / n : 0) * source.element_size();
  const auto base = reinterpret_cast<uintptr_t>(source.data_ptr());
  for (size_t i = 0; i < rows.size();) {
    const uintptr_t begin = base + static_cast<uintptr_t>(rows[i]) * row_bytes;
    uintptr_t end = begin + row_bytes;
    while (++i < rows.size() && base + static_cast<uintptr_t>(rows[i]) * row_bytes <= end + kGap) {
      end = base + static_cast<uintptr_t>(rows[i] + 1) * row_bytes;
    }
    const uintptr_t first_page = begin & ~(page - 1);
    ::madvise(reinterpret_cast<void*>(first_page), end - first_page, MADV_WILLNEED);
  }
}

bool sole_owner(const at::Tensor& buffer) {
  return buffer.defined() && buffer.storage().use_count() == 1;
}

} // namespace

namespace detail {

// The rows a Loader gathers batches from: tensors in memory, or samples read one at a time.
struct LoaderRows {
  int64_t n = 0;
  std::string description;
  std::vector<int64_t> feature_shape;
  at::ScalarType feature_dtype = at::kFloat;
  bool has_labels = false;
  std::vector<int64_t> label_shape;
  at::ScalarType label_dtype = at::kLong;
  at::Tensor features;
  at::Tensor labels;
  at::Tensor row_map;
  bool mapped = false;
  bool features_uint16 = false;
  bool labels_uint16 = false;
  std::function<void()> check_files;
  std::function<std::pair<at::Tensor, at::Tensor>(int64_t)> get;

  std::vector<int64_t> shape(int64_t rows, const std::vector<int64_t>& row) const {
    std::vector<int64_t> out{rows};
    out.insert(out.end(), row.begin(), row.end());
    return out;
  }

  at::Tensor empty_features(int64_t rows, const at::TensorOptions& options = {}) const {
    return at::empty(shape(rows, feature_shape), options.dtype(feature_dtype));
  }

  at::Tensor empty_labels(int64_t rows, const at::TensorOptions& options = {}) const {
    return has_labels ? at::empty(shape(rows, label_shape), options.dtype(label_dtype)) : at::Tensor();
  }

  void check_sample(int64_t index, const at::Tensor& tensor, const std::vector<int64_t>& row, at::ScalarType dtype,
                    const char* what) const {
    DKIT_CHECK(tensor.defined() && tensor.sizes() == at::IntArrayRef(row) && tensor.scalar_type() == dtype,
               description, ": sample ", index, " has ", what, " ",
               format_tensor(tensor), " but sample 0 has ", format_tensor(row, dtype),
               ": every sample must have the same shapes and dtypes");
  }

  // The rows of `features` and `labels` that hold the samples `indices[0, count)`: row_map's rows for a part that
  // lists them.
  std::vector<int64_t> array_rows(const int64_t* indices, int64_t count) const {
    std::vector<int64_t> rows(indices, indices + count);
    if (row_map.defined()) {
      const int64_t* map = row_map.data_ptr<int64_t>();
      for (auto& row : rows) {
        row = map[row];
      }
    }
    return rows;
  }

  // Copies the rows `indices[0, count)` into the first `count` rows of `features_out` and `labels_out`.
  void gather(const int64_t* indices, int64_t count, const at::Tensor& features_out,
              const at::Tensor& labels_out) const {
    std::vector<int64_t> mapped_indices;
    if (row_map.defined()) {
      mapped_indices = array_rows(indices, count);
      indices = mapped_indices.data();
    }
    if (!get) {
      gather_rows(features, indices, count, features_out.data_ptr(), features_uint16);
      if (has_labels) {
        gather_rows(labels, indices, count, labels_out.data_ptr(), labels_uint16);
      }
      return;
    }
    for (int64_t i = 0; i < count; ++i) {
      const auto [x, y] = get(indices[i]);
      check_sample(indices[i], x, feature_shape, feature_dtype, "features");
      features_out.select(0, i).copy_(x);
      if (has_labels) {
        check_sample(indices[i], y, label_shape, label_dtype, "a label");
        labels_out.select(0, i).copy_(y);
      }
    }
  }

  // Asks the kernel to read the rows `indices` of mapped files ahead; nothing for data in memory.
  void read_ahead(const std::vector<int64_t>& indices) const {
    if (!mapped) {
      return;
    }
    std::vector<int64_t> rows = array_rows(indices.data(), static_cast<int64_t>(indices.size()));
    std::sort(rows.begin(), rows.end());
    read_rows_ahead(features, rows);
    if (has_labels) {
      read_rows_ahead(labels, rows);
    }
  }

  // Copies the listed rows of a part of a data set into tensors of their own, unsigned 16-bit numbers widened.
  void take_rows() {
    if (row_map.defined()) {
      features = features.index_select(0, row_map);
      labels = has_labels ? labels.index_select(0, row_map) : labels;
      row_map = at::Tensor();
    }
    features = widen_uint16(features, features_uint16);
    labels = has_labels ? widen_uint16(labels, labels_uint16) : labels;
    features_uint16 = false;
    labels_uint16 = false;
  }

  // Reads every sample of a sample source into tensors, as a Dataset holds them.
  void materialize() {
    if (!get) {
      return;
    }
    const at::Tensor all = at::arange(n, at::TensorOptions().dtype(at::kLong));
    features = empty_features(n);
    labels = empty_labels(n);
    gather(all.data_ptr<int64_t>(), n, features, labels);
    get = nullptr;
  }
};

} // namespace detail

namespace {

bool loadable_features(at::ScalarType dtype) {
  return at::isFloatingType(dtype) || at::isIntegralType(dtype, /*includeBool=*/false);
}

detail::LoaderRows rows_of(Dataset data) {
  detail::LoaderRows rows;
  rows.description = data.description.empty() ? "the data set" : data.description;
  DKIT_CHECK(data.features.defined() && data.features.dim() >= 1, "Loader: ", rows.description,
             " has no features of shape [N, ...]");
  DKIT_CHECK(data.features.device().is_cpu(), "Loader: the features of ", rows.description, " are on ",
             data.features.device().str(), ": a Loader reads data sets from host memory");
  DKIT_CHECK(loadable_features(data.features.scalar_type()), "Loader: the features of ", rows.description,
             " are ", dtype_name(data.features.scalar_type()), ": expected a floating-point or integer dtype");
  rows.n = data.size();
  if (data.rows.defined()) {
    DKIT_CHECK(data.rows.dim() == 1 && data.rows.scalar_type() == at::kLong && data.rows.device().is_cpu(),
               "Loader: the rows of ", rows.description, " are not int64 [N] on the CPU");
    if (rows.n > 0) {
      const int64_t low = data.rows.min().item<int64_t>();
      const int64_t high = data.rows.max().item<int64_t>();
      DKIT_CHECK(low >= 0 && high < data.features.size(0), "Loader: the rows of ", rows.description,
                 " reach row ", low < 0 ? low : high, ", outside its ", data.features.size(0), " samples");
    }
    rows.row_map = data.rows.contiguous();
  }
  rows.check_files = std::move(data.check_files);
  rows.mapped = data.mapped;
  rows.features = data.features.contiguous();
  rows.feature_shape = data.features.sizes().slice(1).vec();
  rows.features_uint16 = data.features_uint16;
  rows.feature_dtype = data.features_uint16 ? at::kInt : data.features.scalar_type();
  if (data.labels.defined()) {
    DKIT_CHECK(data.labels.dim() >= 1 && data.labels.size(0) == data.features.size(0), "Loader: ",
               rows.description, " has ", data.features.size(0), " samples but labels of shape ",
               data.labels.sizes(), ": one label row per sample");
    DKIT_CHECK(data.labels.device().is_cpu(), "Loader: the labels of ", rows.description, " are on ",
               data.labels.device().str(), ": a Loader reads data sets from host memory");
    rows.has_labels = true;
    rows.labels = data.labels.contiguous();
    rows.label_shape = data.labels.sizes().slice(1).vec();
    rows.labels_uint16 = data.labels_uint16;
    rows.label_dtype = data.labels_uint16 ? at::kInt : data.labels.scalar_type();
  }
  return rows;
}

detail::LoaderRows rows_of(SampleSource source) {
  detail::LoaderRows rows;
  rows.description = source.description;
  DKIT_CHECK(source.get != nullptr, "Loader: ", rows.description, " has no get function");
  DKIT_CHECK(source.size >= 0, "Loader: ", rows.description, " has a negative size, ", source.size);
  rows.n = source.size;
  rows.get = std::move(source.get);
  if (rows.n > 0) {
    const auto [x, y] = rows.get(0);
    DKIT_CHECK(x.defined(), "Loader: sample 0 of ", rows.description, " has no features");
    DKIT_CHECK(loadable_features(x.scalar_type()), "Loader: the features of ", rows.description, " are ",
               dtype_name(x.scalar_type()), ": expected a floating-point or integer dtype");
    rows.feature_shape = x.sizes().vec();
    rows.feature_dtype = x.scalar_type();
    rows.has_labels = y.defined();
    if (y.defined()) {
      rows.label_shape = y.sizes().vec();
      rows.label_dtype = y.scalar_type();
    }
  }
  return rows;
}

} // namespace

Placement parse_placement(std::string_view name) {
  return parse_name(kPlacementNames, name, "placement");
}

std::string to_string(Placement placement) {
  return std::string(name_of(kPlacementNames, placement));
}

Placement resolve_placement(Placement requested, const Device& device) {
  if (requested != Placement::kAuto) {
    return requested;
  }
  return device.is_cuda() ? Placement::kPinned : Placement::kDevice;
}

LoaderOptions::LoaderOptions(int64_t batch_size) : batch_size_(batch_size) {}

int64_t Batch::size() const {
  return features.defined() ? features.size(0) : 0;
}

struct Loader::Impl {
  enum class SlotState { kFree, kFilling, kReady, kTaken };

  struct Slot {
    at::Tensor host_features;
    at::Tensor host_labels;
    std::optional<Batch> ready;
    SlotState state = SlotState::kFree;
#if DKIT_WITH_CUDA
    at::cuda::CUDAEvent copied;
#endif
  };

  struct Range {
    int64_t start;
    int64_t rows;
    int64_t global_samples;
  };

  Impl(detail::LoaderRows source, const Device& target, LoaderOptions loader_options)
      : data(std::move(source)), device(with_index(target)), options(std::move(loader_options)) {
    DKIT_CHECK(options.batch_size() >= 1, "loader batch_size must be at least 1, got ", options.batch_size());
    DKIT_CHECK(options.prefetch() >= 1, "loader prefetch must be at least 1, got ", options.prefetch());
    DKIT_CHECK(options.world_size() >= 1, "loader world_size must be at least 1, got ", options.world_size());
    DKIT_CHECK(options.rank() >= 0 && options.rank() < options.world_size(), "loader rank ", options.rank(),
               " is out of range for world_size ", options.world_size());
    DKIT_CHECK(options.shuffle_block() >= 0 && options.shuffle_window() >= 1,
               "loader shuffle_block must be at least 0 and shuffle_window at least 1, got ", options.shuffle_block(),
               " and ", options.shuffle_window());
    DKIT_CHECK(options.features_divisor() != 0 && std::isfinite(options.features_divisor()),
               "loader features_divisor must be a finite number other than 0, got ", options.features_divisor());
    DKIT_CHECK(is_available(device), "loader device '", device.str(),
               "' is not available; available devices: ", available_devices());
    DKIT_CHECK(data.n > 0, "cannot load batches from an empty data set (", data.description, ")");
    n = data.n;
    global_batch = options.batch_size() * options.world_size();
    batches = options.drop_last() ? n / global_batch : (n + global_batch - 1) / global_batch;
    used = options.drop_last() ? batches * global_batch : n;
    DKIT_CHECK(batches > 0, "loader drop_last leaves no batch: ", n, " samples are fewer than a global batch of ",
               global_batch, " (batch_size ", options.batch_size(), " x world_size ", options.world_size(), ")");
    placement = resolve_placement(options.placement(), device);
    threaded = placement == Placement::kPinned;
    pinned = threaded && device.is_cuda();
    if (placement == Placement::kDevice) {
      if (device.is_cuda() || data.features_uint16 || data.labels_uint16) {
        data.take_rows();
      }
      data.materialize();
      device_features = to_device(data.features, device);
      device_labels = data.has_labels ? to_device(data.labels, device) : at::Tensor();
    }
    if (threaded) {
      slots = std::vector<Slot>(static_cast<size_t>(options.prefetch()));
    }
#if DKIT_WITH_CUDA
    if (pinned) {
      copy_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
      const auto host = at::TensorOptions().pinned_memory(true);
      for (auto& slot : slots) {
        slot.host_features = data.empty_features(options.batch_size(), host);
        slot.host_labels = data.empty_labels(options.batch_size(), host);
      }
    }
#endif
  }

  ~Impl() {
    stop_producer();
  }

  Range range(int64_t batch) const {
    const int64_t global_start = batch * global_batch;
    const int64_t global_size = std::min(global_batch, used - global_start);
    const int64_t offset = std::min(options.rank() * options.batch_size(), global_size);
    return {global_start + offset, std::min(options.batch_size(), global_size - offset), global_size};
  }

  Batch describe(int64_t batch, const Range& r) const {
    Batch out;
    out.global_samples = r.global_samples;
    out.index = batch;
    out.epoch = epoch;
    return out;
  }

  // The samples at the positions `r` of this epoch's order.
  std::vector<int64_t> indices(const Range& r) {
    std::vector<int64_t> out(static_cast<size_t>(r.rows));
    if (!options.shuffle()) {
      std::iota(out.begin(), out.end(), r.start);
    } else if (!blocks) {
      std::copy_n(order.data_ptr<int64_t>() + r.start, r.rows, out.begin());
    } else {
      std::lock_guard<std::mutex> lock(window_mutex);
      for (int64_t done = 0; done < r.rows;) {
        const int64_t position = r.start + done;
        const std::vector<int64_t>& samples = window_at(blocks->window_of(position));
        const int64_t offset = position - blocks->window_start(window);
        const int64_t take = std::min(r.rows - done, static_cast<int64_t>(samples.size()) - offset);
        std::copy_n(samples.begin() + offset, take, out.begin() + done);
        done += take;
      }
    }
    return out;
  }

  // The samples of window `w` of the block order, the window after it read ahead from mapped files; the caller
  // holds window_mutex.
  const std::vector<int64_t>& window_at(int64_t w) {
    if (w == window) {
      return window_samples;
    }
    if (w == window + 1 && !next_window_samples.empty()) {
      window_samples = std::move(next_window_samples);
    } else {
      window_samples = blocks->window_samples(w);
      data.read_ahead(window_samples);
    }
    window = w;
    next_window_samples.clear();
    if (w + 1 < blocks->windows()) {
      next_window_samples = blocks->window_samples(w + 1);
      data.read_ahead(next_window_samples);
    }
    return window_samples;
  }

  Batch make_now(int64_t batch) {
    const Range r = range(batch);
    Batch out = describe(batch, r);
    if (placement == Placement::kDevice && !options.shuffle() && !data.row_map.defined()) {
      out.features = device_features.narrow(0, r.start, r.rows);
      if (device_labels.defined()) {
        out.labels = device_labels.narrow(0, r.start, r.rows);
      }
      return out;
    }
    if (placement == Placement::kDevice && device.is_cuda()) {
      const at::Tensor index = device_order.narrow(0, r.start, r.rows);
      out.features = device_features.index_select(0, index);
      if (device_labels.defined()) {
        out.labels = device_labels.index_select(0, index);
      }
      return out;
    }
    out.features = data.empty_features(r.rows);
    out.labels = data.empty_labels(r.rows);
    data.gather(indices(r).data(), r.rows, out.features, out.labels);
    if (device.is_cuda()) {
      out.features = out.features.to(device);
      if (out.labels.defined()) {
        out.labels = out.labels.to(device);
      }
    }
    return out;
  }

  void fill(Slot& slot, int64_t batch) {
    const Range r = range(batch);
    Batch out = describe(batch, r);
#if DKIT_WITH_CUDA
    if (pinned) {
      const c10::cuda::CUDAStreamGuard stream_guard(*copy_stream);
      // Waits for this slot's previous copy only; the raw call is not counted by the sync debug mode.
      if (slot.copied.isCreated()) {
        C10_CUDA_CHECK(cudaEventSynchronize(slot.copied.event()));
      }
      data.gather(indices(r).data(), r.rows, slot.host_features, slot.host_labels);
      out.features = data.empty_features(r.rows, at::TensorOptions().device(device));
      out.features.copy_(slot.host_features.narrow(0, 0, r.rows), /*non_blocking=*/true);
      if (data.has_labels) {
        out.labels = data.empty_labels(r.rows, at::TensorOptions().device(device));
        out.labels.copy_(slot.host_labels.narrow(0, 0, r.rows), /*non_blocking=*/true);
      }
      slot.copied.record(*copy_stream);
      slot.ready = std::move(out);
      return;
    }
#endif
    if (!sole_owner(slot.host_features) || (data.has_labels && !sole_owner(slot.host_labels))) {
      std::lock_guard<std::mutex> lock(mutex);
      slot.host_features = data.empty_features(options.batch_size());
      slot.host_labels = data.empty_labels(options.batch_size());
    }
    data.gather(indices(r).data(), r.rows, slot.host_features, slot.host_labels);
    out.features = slot.host_features.narrow(0, 0, r.rows);
    if (data.has_labels) {
      out.labels = slot.host_labels.narrow(0, 0, r.rows);
    }
    slot.ready = std::move(out);
  }

  // The batch as the caller gets it: its features converted and scaled as the options ask, on the current stream.
  Batch convert(Batch batch) const {
    bool owned = false;
    if (options.features_dtype() && batch.features.scalar_type() != *options.features_dtype()) {
      batch.features = batch.features.to(*options.features_dtype());
      owned = true;
    }
    if (options.features_divisor() != 1.0) {
      batch.features = owned ? batch.features.div_(options.features_divisor())
                             : batch.features.div(options.features_divisor());
    }
    return batch;
  }

  Slot& slot_of(int64_t batch) {
    return slots[static_cast<size_t>((batch - first_batch) % options.prefetch())];
  }

  void produce() {
    try {
      while (true) {
        int64_t batch = 0;
        {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] {
            return stop || next_claim >= batches || slot_of(next_claim).state == SlotState::kFree;
          });
          if (stop || next_claim >= batches) {
            return;
          }
          batch = next_claim++;
          slot_of(batch).state = SlotState::kFilling;
        }
        fill(slot_of(batch), batch);
        {
          std::lock_guard<std::mutex> lock(mutex);
          slot_of(batch).state = SlotState::kReady;
        }
        changed.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      error = std::current_exception();
      changed.notify_all();
    }
  }

  void stop_producer() {
    if (!producer.joinable()) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    changed.notify_all();
    producer.join();
    stop = false;
  }

  void start_epoch(int64_t new_epoch, int64_t skip) {
    DKIT_CHECK(skip >= 0 && skip <= batches, "cannot skip ", skip, " batches of epoch ", new_epoch,
               ": it has ", batches);
    stop_producer();
    if (data.check_files) {
      data.check_files();
    }
    order = at::Tensor();
    blocks.reset();
    window = -1;
    window_samples.clear();
    next_window_samples.clear();
    if (options.shuffle() && options.shuffle_block() > 0) {
      blocks.emplace(n, options.shuffle_block(), options.shuffle_window(), options.seed(), new_epoch);
    } else if (options.shuffle()) {
      order = sample_order(n, options.seed(), new_epoch);
    }
#if DKIT_WITH_CUDA
    if (placement == Placement::kDevice && device.is_cuda() && options.shuffle()) {
      const at::Tensor all = blocks ? block_order(n, options.shuffle_block(), options.shuffle_window(),
                                                  options.seed(), new_epoch)
                                    : order;
      device_order = at::empty({n}, at::TensorOptions().dtype(at::kLong).device(device));
      device_order.copy_(all.pin_memory(), /*non_blocking=*/true);
    }
#endif
    for (auto& slot : slots) {
      slot.ready.reset();
      slot.state = SlotState::kFree;
    }
    taken = -1;
    error = nullptr;
    epoch = new_epoch;
    first_batch = skip;
    next_batch = skip;
    next_claim = skip;
    started = true;
    if (threaded && skip < batches) {
      producer = std::thread([this] { produce(); });
    }
  }

  std::optional<Batch> next() {
    TORCH_CHECK(started, "Loader::next() called before start_epoch()");
    if (!threaded) {
      if (next_batch >= batches) {
        return std::nullopt;
      }
      return convert(make_now(next_batch++));
    }
    std::unique_lock<std::mutex> lock(mutex);
    if (taken >= 0) {
      slots[static_cast<size_t>(taken)].state = SlotState::kFree;
      taken = -1;
      changed.notify_all();
    }
    if (next_batch >= batches) {
      return std::nullopt;
    }
    const auto index = static_cast<size_t>((next_batch - first_batch) % options.prefetch());
    Slot& slot = slots[index];
    if (next_claim == next_batch) {
      TORCH_INTERNAL_ASSERT(slot.state == SlotState::kFree, "the slot of an unclaimed batch is in use");
      ++next_claim;
      slot.state = SlotState::kFilling;
      lock.unlock();
      fill(slot, next_batch);
      lock.lock();
      slot.state = SlotState::kReady;
      changed.notify_all();
    }
    changed.wait(lock, [&] { return slot.state == SlotState::kReady || error; });
    if (slot.state != SlotState::kReady) {
      std::rethrow_exception(error);
    }
    Batch batch = std::move(*slot.ready);
    slot.ready.reset();
    ++next_batch;
#if DKIT_WITH_CUDA
    if (pinned) {
      const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device.index());
      slot.copied.block(compute);
      batch.features.record_stream(compute);
      if (batch.labels.defined()) {
        batch.labels.record_stream(compute);
      }
      slot.state = SlotState::kFree;
      changed.notify_all();
      return convert(std::move(batch));
    }
#endif
    slot.state = SlotState::kTaken;
    taken = static_cast<int64_t>(index);
    return convert(std::move(batch));
  }

  detail::LoaderRows data;
  Device device;
  LoaderOptions options;
  Placement placement = Placement::kDevice;
  bool threaded = false;
  bool pinned = false;
  int64_t n = 0;
  int64_t global_batch = 0;
  int64_t batches = 0;
  int64_t used = 0;
  at::Tensor device_features;
  at::Tensor device_labels;

  bool started = false;
  int64_t epoch = 0;
  int64_t first_batch = 0;
  int64_t next_batch = 0;
  int64_t next_claim = 0;
  at::Tensor order;
  std::optional<BlockOrder> blocks;
  std::mutex window_mutex;
  int64_t window = -1;
  std::vector<int64_t> window_samples;
  std::vector<int64_t> next_window_samples;
  at::Tensor device_order;

  std::vector<Slot> slots;
  int64_t taken = -1;
  std::mutex mutex;
  std::condition_variable changed;
  std::thread producer;
  bool stop = false;
  std::exception_ptr error;
#if DKIT_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> copy_stream;
#endif
};

Loader::Loader(Dataset data, const Device& device, LoaderOptions options)
    : impl_(std::make_unique<Impl>(rows_of(std::move(data)), device, std::move(options))) {}

Loader::Loader(SampleSource source, const Device& device, LoaderOptions options)
    : impl_(std::make_unique<Impl>(rows_of(std::move(source)), device, std::move(options))) {}

Loader::~Loader() = default;
Loader::Loader(Loader&&) noexcept = default;
Loader& Loader::operator=(Loader&&) noexcept = default;

int64_t Loader::batches_per_epoch() const {
  return impl_->batches;
}

int64_t Loader::samples_per_epoch() const {
  return impl_->used;
}

int64_t Loader::batch_rows(int64_t batch) const {
  DKIT_CHECK(batch >= 0 && batch < impl_->batches, "batch ", batch, " is out of range: an epoch has ",
             impl_->batches, " batches");
  return impl_->range(batch).rows;
}

void Loader::start_epoch(int64_t epoch, int64_t skip_batches) {
  impl_->start_epoch(epoch, skip_batches);
}

std::optional<Batch> Loader::next() {
  return impl_->next();
}

Placement Loader::placement() const {
  return impl_->placement;
}

bool Loader::pinned() const {
  return impl_->pinned;
}

const Device& Loader::device() const {
  return impl_->device;
}

const LoaderOptions& Loader::options() const {
  return impl_->options;
}

int64_t Loader::size() const {
  return impl_->n;
}

const std::string& Loader::description() const {
  return impl_->data.description;
}

std::vector<const void*> Loader::staging_buffers() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<const void*> pointers;
  for (const auto& slot : impl_->slots) {
    pointers.push_back(slot.host_features.defined() ? slot.host_features.data_ptr() : nullptr);
  }
  return pointers;
}

} // namespace dkit
