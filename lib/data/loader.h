#pragma once

#include <dkit/core/enum_names.h>
#include <dkit/core/error.h>
#include <dkit/data/dataset.h>
#include <dkit/device/device.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dkit {

/// Where a Loader keeps the data and how batches reach the device.
enum class Placement {
  /// kPinned when the device is a GPU; kDevice on the CPU (batches gathered in place, nothing copied twice).
  kAuto,
  /// The whole data set is copied to the device once; each batch is gathered there with `index_select`. Best for
  /// data that fits in device memory many times over, such as digits or MNIST on a GPU.
  kDevice,
  /// A background thread gathers the next batches on the host into a ring of `prefetch` reused page-locked
  /// buffers, and copies them to the GPU with `non_blocking` copies on a dedicated copy stream; the compute
  /// stream waits on an event, so the copy of batch k+1 overlaps the compute of batch k. Page-locked memory needs
  /// CUDA: for a CPU device the buffers are ordinary host memory (pinned() says which; dkit::Trainer logs a line
  /// saying so).
  kPinned,
  /// Each batch is gathered on the host into a fresh tensor and copied with a blocking `.to(device)`; the simple
  /// baseline.
  kPageable,
};

/// The name of each Placement, as `loader.placement` spells it.
inline constexpr EnumNames<Placement, 4> kPlacementNames = {{
    {Placement::kAuto, "auto"},
    {Placement::kDevice, "device"},
    {Placement::kPinned, "pinned"},
    {Placement::kPageable, "pageable"},
}};

/// Reads a name of kPlacementNames; anything else is an error naming the accepted values.
Placement parse_placement(std::string_view name);

/// The lower-case name parse_placement() reads back.
std::string to_string(Placement placement);

/// What `requested` means on `device`: kAuto becomes kPinned on a GPU and kDevice on the CPU; every other value is
/// kept.
Placement resolve_placement(Placement requested, const Device& device);

/// Options for Loader. Example:
/// ```
/// dkit::Loader loader(data, dkit::gpu(0), dkit::LoaderOptions(/*batch_size=*/64).seed(7).drop_last(true));
/// ```
struct LoaderOptions {
  /// Batches of `batch_size` samples per process.
  explicit LoaderOptions(int64_t batch_size);

  /// Samples per batch for each process; a global batch holds `batch_size * world_size` samples.
  TORCH_ARG(int64_t, batch_size);
  /// Visit the samples in the seeded order sample_order(n, seed, epoch) rather than `0..n-1`.
  TORCH_ARG(bool, shuffle) = true;
  /// With `shuffle`, shuffles by blocks when above 0: blocks of `shuffle_block` neighbouring samples in a seeded
  /// order, the samples of each window of `shuffle_window` blocks shuffled together (BlockOrder), for data mapped
  /// from a disk where random reads are slow. 0 shuffles single samples (sample_order()).
  TORCH_ARG(int64_t, shuffle_block) = 0;
  /// Blocks whose samples are shuffled together with `shuffle_block`.
  TORCH_ARG(int64_t, shuffle_window) = 16;
  /// Drop the last global batch when it is short, so that every batch is full.
  TORCH_ARG(bool, drop_last) = false;
  /// Where batches are assembled (see Placement).
  TORCH_ARG(Placement, placement) = Placement::kAuto;
  /// Ring slots for kPinned: how many batches can be assembled or in flight at once. With 1 there is no overlap.
  TORCH_ARG(int64_t, prefetch) = 2;
  /// Seed of the sample order.
  TORCH_ARG(uint64_t, seed) = 0;
  /// This process's rank, in [0, world_size).
  TORCH_ARG(int64_t, rank) = 0;
  /// Number of processes sharing each global batch.
  TORCH_ARG(int64_t, world_size) = 1;
  /// Converts each batch's features to this dtype on the device, after the copy: 8-bit images then travel and sit in
  /// host memory as bytes, a quarter of float32. Unset, the features keep the data set's dtype.
  TORCH_ARG(std::optional<c10::ScalarType>, features_dtype) = std::nullopt;
  /// Divides each batch's features by this on the device, after features_dtype's conversion: 255 scales 8-bit
  /// pixels to [0, 1] as LibTorch's MNIST data set and torchvision's ToTensor do (a division, bitwise theirs).
  TORCH_ARG(double, features_divisor) = 1.0;
};

/// Samples read one at a time, as a LibTorch `torch::data` dataset gives them (its `get(i)` and `size()`): the way
/// a data set that is not a pair of tensors in memory reaches a Loader. samples_of() makes one of such a dataset.
struct SampleSource {
  /// Number of samples.
  int64_t size = 0;
  /// Sample `i`, in [0, size): its features and its label (a 0-d class index, any tensor, or undefined for none).
  /// Every sample must have the shapes and dtypes of sample 0. Called from the loader's thread.
  std::function<std::pair<at::Tensor, at::Tensor>(int64_t)> get;
  /// Where the samples come from, for logs and errors.
  std::string description = "a sample source";
};

/// A SampleSource over a LibTorch `torch::data` dataset (anything with `get(size_t)` returning a `torch::data::Example`
/// and `size()` returning its length, such as `torch::data::datasets::MNIST` or a user's own dataset, mapped or not).
/// The dataset is copied into the source and shared with its copies.
template <typename TorchDataset>
SampleSource samples_of(TorchDataset dataset, std::string description = "a torch::data dataset") {
  auto shared = std::make_shared<TorchDataset>(std::move(dataset));
  const auto size = shared->size();
  DKIT_CHECK(size.has_value(), description, " does not know its size: a Loader needs size() of its dataset");
  SampleSource source;
  source.size = static_cast<int64_t>(*size);
  source.get = [shared](int64_t index) {
    auto example = shared->get(static_cast<size_t>(index));
    return std::make_pair(at::Tensor(example.data), at::Tensor(example.target));
  };
  source.description = std::move(description);
  return source;
}

/// One process's share of one global batch, on the Loader's device.
struct Batch {
  /// Inputs `[rows, ...]`, each row of the data set's shape, in its dtype or LoaderOptions::features_dtype. `rows`
  /// is `batch_size` except in a short last batch, where it may be smaller or even 0 for the higher ranks.
  at::Tensor features;
  /// Labels `[rows, ...]` in the data set's dtype (class indices `[rows]`, int64, for a classifier); undefined when
  /// the data set has no labels.
  at::Tensor labels;
  /// Samples in the whole global batch, over all ranks: divide a summed loss by it to get the global mean.
  int64_t global_samples = 0;
  /// Position of the batch in its epoch, from 0.
  int64_t index = 0;
  /// The epoch it belongs to.
  int64_t epoch = 0;

  /// This process's number of samples (`features.size(0)`).
  int64_t size() const;
};

/// Batches of a Dataset in a seeded order that is the same on every process: global batch b of epoch e is
/// `sample_order(n, seed, e)[b*B*W, (b+1)*B*W)` (B the batch size, W the world size), and rank r takes the
/// contiguous slice `[r*B, (r+1)*B)` of it. Typical use:
/// ```
/// for (int64_t epoch = first; epoch < epochs; ++epoch) {
///   loader.start_epoch(epoch, epoch == first ? batches_done : 0);
///   while (auto batch = loader.next()) { ... }
/// }
/// ```
/// A Loader is used from one thread. A Batch may be kept as long as wanted; with kPinned on the CPU its tensors are
/// the ring's buffers, and a buffer still referenced when its turn comes again is replaced by a new one rather
/// than overwritten. Treat batches as read-only: unshuffled kDevice batches are views of the data set itself.
class Loader {
 public:
  /// A loader over `data` delivering batches on `device`: features `[N, ...]` of a floating-point or integer dtype,
  /// labels `[N, ...]` of any dtype or undefined, both on the CPU. Bad data is a dkit::Error naming it.
  Loader(Dataset data, const Device& device, LoaderOptions options);
  /// A loader over samples read one at a time (a `torch::data` dataset, see samples_of()). The loader thread of
  /// kPinned calls `source.get` for each row of a batch; kDevice reads every sample once, at construction.
  Loader(SampleSource source, const Device& device, LoaderOptions options);
  /// Stops the prefetch thread, if any, and waits for it.
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  /// Moves the loader; the moved-from one may only be destroyed.
  Loader(Loader&&) noexcept;
  /// Moves the loader; the moved-from one may only be destroyed.
  Loader& operator=(Loader&&) noexcept;

  /// Global batches in one epoch: `ceil(n / (B*W))`, or `floor(n / (B*W))` with drop_last.
  int64_t batches_per_epoch() const;
  /// Samples visited per epoch over all ranks: `n`, or `batches_per_epoch() * B * W` with drop_last.
  int64_t samples_per_epoch() const;
  /// This process's rows in batch `batch` of every epoch, in [0, batches_per_epoch()): `batch_size`, or fewer in a
  /// short last batch (0 for the higher ranks when it is short enough).
  int64_t batch_rows(int64_t batch) const;

  /// Starts `epoch` at batch `skip_batches` (the batches a resumed run already did in it). Stops any prefetching of
  /// the previous epoch.
  void start_epoch(int64_t epoch, int64_t skip_batches = 0);

  /// The next batch of the current epoch, or nothing at its end. start_epoch() must have been called.
  std::optional<Batch> next();

  /// The placement in use, after resolve_placement().
  Placement placement() const;
  /// Whether the host buffers are page-locked (kPinned on a GPU).
  bool pinned() const;
  /// The device batches are delivered on.
  const Device& device() const;
  /// The options the loader was built with.
  const LoaderOptions& options() const;
  /// Samples in the data set.
  int64_t size() const;
  /// Where the samples come from, for logs.
  const std::string& description() const;
  /// Addresses of the kPinned ring's host feature buffers, one per slot (empty for other placements), for tests
  /// and diagnostics: they stay the same from batch to batch and epoch to epoch when the ring reuses them.
  std::vector<const void*> staging_buffers() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace dkit
