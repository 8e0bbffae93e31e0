#pragma once

#include <dkit/checkpoint/pickle.h>

#include <c10/core/Device.h>
#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace dkit {

/// How read_torch_file() reads a file.
struct ReadOptions {
  /// Device every tensor is loaded to, whatever device its storage was saved on (`torch.load`'s
  /// `map_location`). The saved device stays visible through PickleValue::saved_on().
  TORCH_ARG(c10::Device, map_location) = c10::Device(c10::kCPU);
  /// Limits on file, record and pickle sizes, nesting and counts.
  TORCH_ARG(ReadLimits, limits) = {};
};

/// The contents of a file written by `torch.save` (PyTorch 1.6 and later) or by write_torch_file().
struct TorchFile {
  /// The archive's top-level folder inside the zip (`archive` for dkit's files, the file's stem for
  /// `torch.save`'s).
  std::string archive;
  /// The serialization format version from the archive's `version` record.
  int64_t version = 0;
  /// The unpickled `data.pkl`: a state dict, a general checkpoint, or any value of the safe subset.
  PickleValue root;
};

/// Reads a `torch.save` zip archive with dkit's restricted unpickler (see unpickle()). The archive is read
/// through LibTorch's `caffe2::serialize::PyTorchStreamReader` after dkit has checked its central directory
/// against the file's size and `options.limits()`, so a corrupt or hostile file is an error, never a huge
/// allocation or an out-of-bounds read. Every error is one line naming the file and the problem, with what to do
/// where there is something to do: an empty, truncated or random file, the pre-1.6 legacy format (and how to
/// re-save it), a TorchScript archive, a corrupt pickle, a refused global.
TorchFile read_torch_file(const std::string& path, const ReadOptions& options = {});

/// Like read_torch_file(), for an archive already in memory (`data`, e.g. received over a network or held by a
/// fuzzer); `source` names it in error messages where read_torch_file() names the file.
TorchFile read_torch_bytes(std::string_view data, const std::string& source, const ReadOptions& options = {});

/// Writes `root` as Python's `torch.save` would: a zip with `data.pkl`, `byteorder` and one `data/<i>` record per
/// storage. Tensors on a GPU are copied to the CPU and every storage is tagged `cpu`, so `torch.load(path)` and
/// `torch.load(path, weights_only=True)` read it anywhere. The write is atomic: a temporary file in the same
/// folder, fsync, rename over `path`, fsync of the folder. When it fails (a full disk, a missing folder) the
/// error names the file and the reason, and a previous file at `path` is left as it was.
void write_torch_file(const std::string& path, const PickleValue& root);

} // namespace dkit
