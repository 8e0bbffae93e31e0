#pragma once

#include <dkit/checkpoint/state_dict.h>
#include <dkit/checkpoint/torch_file.h>
#include <dkit/core/enum_names.h>

#include <c10/core/ScalarType.h>

#include <map>
#include <string>
#include <string_view>

namespace dkit {

/// The dtypes of safetensors files that dkit reads and writes, by their names in the file's header, in the order
/// Python's safetensors writes them (descending alignment, as its `Dtype` enum orders them; write_safetensors()
/// follows this table).
inline constexpr EnumNames<c10::ScalarType, 10> kSafetensorsDtypes = {{
    {c10::kLong, "I64"},
    {c10::kDouble, "F64"},
    {c10::kFloat, "F32"},
    {c10::kInt, "I32"},
    {c10::kBFloat16, "BF16"},
    {c10::kHalf, "F16"},
    {c10::kShort, "I16"},
    {c10::kChar, "I8"},
    {c10::kByte, "U8"},
    {c10::kBool, "BOOL"},
}};

/// `__metadata__`: string keys to string values, as safetensors allows.
using SafetensorsMetadata = std::map<std::string, std::string>;

/// The contents of a safetensors file.
struct SafetensorsFile {
  /// The tensors, each with storage of its own, ordered by name with runs of digits compared as numbers (`0.weight`,
  /// `2.weight`, `10.weight`): a safetensors header has no order, and this one gives back the module order of
  /// `nn.Sequential` and `nn.ModuleList` names.
  StateDict tensors;
  /// The header's `__metadata__`; empty when it has none.
  SafetensorsMetadata metadata;
};

/// Reads a safetensors file (Hugging Face's format: an 8-byte little-endian header length, a JSON header naming
/// each tensor's dtype, shape and `data_offsets`, then the data). The header is checked as the official
/// implementation checks it, and more strictly, before anything it describes is allocated: it starts with `{`, is
/// JSON with no name twice, every tensor has a dtype of kSafetensorsDtypes, a shape whose size does not overflow
/// and offsets that hold exactly its bytes; the tensors' data lie one after another, with no gap or overlap, and
/// fill the rest of the file exactly; a BOOL holds only 0 and 1. `options.limits()` bounds the file
/// (`max_file_bytes`), the header (`max_header_bytes`, and its JSON nesting `max_depth` and values `max_values`),
/// the number of tensors (`max_records`) and each tensor's bytes (`max_record_bytes`). Every error is one line
/// naming the file and the problem; a `torch.save` archive or a pickle is named as such. The tensors are loaded to
/// `options.map_location()`.
SafetensorsFile read_safetensors(const std::string& path, const ReadOptions& options = {});

/// Like read_safetensors(), but maps the file read-only rather than reading it: the tensors are CPU views of one
/// shared mapping, whose pages the kernel reads when they are touched and may drop again, so that a file larger
/// than memory takes none of the process's own. The header is checked the same way before anything is mapped;
/// BOOL values are not, which would read every byte. The tensors must not be written.
SafetensorsFile map_safetensors(const std::string& path, const ReadOptions& options = {});

/// Like read_safetensors(), for a file already in memory (`data`); `source` names it in error messages where
/// read_safetensors() names the file.
SafetensorsFile read_safetensors_bytes(std::string_view data, const std::string& source,
                                       const ReadOptions& options = {});

/// Writes `tensors` and `metadata` as Python's `safetensors.torch.save_file` does, byte for byte: the header lists
/// `__metadata__` first when it is not empty, then the tensors by descending dtype alignment and then by name,
/// each tensor's data following in that order, the header padded with spaces to a multiple of 8 bytes. Each
/// tensor is written as its values in row-major order, as `tensor.contiguous()` holds them, copied from a GPU
/// when it is on one: views of one storage (shared, overlapping, transposed or expanded) become copies of their
/// own, which read back as equal but independent tensors. (Python's `save_file` refuses tensors that share memory
/// instead.) The write is atomic, as write_torch_file()'s: a failure leaves a previous file at `path` unchanged.
/// A dtype outside kSafetensorsDtypes, a tensor named `__metadata__`, a name or metadata that is not UTF-8 and a
/// header larger than the 100,000,000 bytes safetensors readers accept are errors naming the file.
void write_safetensors(const std::string& path, const StateDict& tensors, const SafetensorsMetadata& metadata = {});

/// Whether `path` names a safetensors file: it ends in `.safetensors`, in any case. read_state_dict(),
/// write_state_dict(), load_mlp() and export_mlp() pick the format this way; anything else is a `torch.save` file.
bool is_safetensors_path(const std::string& path);

} // namespace dkit
